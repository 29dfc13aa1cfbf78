// The supervisor process: runs one scenario's supervisor machine over NATS and owns the run
// directory. The launcher starts it; it can also be started by hand against an existing server:
//   npx tsx actors/supervisor.ts --scenario FILE --run RUN_ID --out DIR [--nats URL]
import { createActor, fromCallback, toPromise } from 'xstate';
import { connectBus, subscribe } from '../mesh/bus.ts';
import { encode } from '../mesh/codec.ts';
import { Heartbeat, Hello, PROTOCOL_VERSION, type Metrics } from '../mesh/protocol.ts';
import { subjects } from '../mesh/subjects.ts';
import { fanOut, RunDirectory, type Recorder, type Summary } from '../engine/record.ts';
import { runSpec } from '../engine/rlhf.ts';
import { loadScenario } from '../engine/scenario.ts';
import { BusDispatcher } from './bus-dispatcher.ts';
import { DEFAULT_NATS, UsageError, args, logger, runMain } from './host.ts';
import { supervisorMachine, type SupervisorEvent } from './supervisor.machine.ts';

const USAGE = 'usage: supervisor --scenario FILE --run RUN_ID --out DIR [--nats URL]';

runMain(async () => {
  const { values } = args(USAGE, {
    scenario: { type: 'string' },
    run: { type: 'string' },
    out: { type: 'string' },
    nats: { type: 'string' },
  });
  if (!values.scenario || !values.run || !values.out) throw new UsageError(USAGE);
  const log = logger('supervisor');
  const scenario = loadScenario(values.scenario);
  const spec = runSpec(scenario);
  const nc = await connectBus(values.nats ?? process.env.NATS_URL ?? DEFAULT_NATS, `ferry-supervisor-${values.run}`);
  const subj = subjects(values.run);
  const publish = (event: Record<string, unknown> & { type: string }) => nc.publish(subj.events, encode({ ...event, v: PROTOCOL_VERSION }));

  const busEvents: Recorder = {
    phase: (phase, detail) => {
      log(`phase ${phase}: ${detail}`);
      publish({ type: 'phase', phase, detail });
    },
    iteration: (metrics: Metrics, iterations: number) => publish({ type: 'progress', iterations, metrics }),
    finished: (s: Summary) => publish({ type: 'done', status: s.status, message: s.error ?? `${s.iterations} iterations` }),
  };

  const machine = supervisorMachine.provide({
    actors: {
      gatherWorkers: fromCallback<SupervisorEvent, { need: number[] }>(({ sendBack, input }) => {
        const taken = new Map<number, string>();
        const backends = new Map<number, string>();
        const announced = new Set<number>();
        // A welcomed worker counts once its first heartbeat arrives: it sends that after subscribing
        // to its call subject, and the server keeps one connection's messages in order.
        const stopBeats = subscribe(
          nc,
          subj.heartbeats,
          Heartbeat,
          (beat) => {
            if (announced.has(beat.device) || taken.get(beat.device) !== beat.worker) return;
            announced.add(beat.device);
            sendBack({ type: 'worker.joined', device: beat.device, worker: beat.worker, backend: backends.get(beat.device) ?? 'unknown' });
          },
          (error) => log(`rejected: ${error.message}`),
        );
        const stopJoin = subscribe(
          nc,
          subj.join,
          Hello,
          (hello, msg) => {
            const free = input.need.filter((d) => !taken.has(d) || taken.get(d) === hello.worker);
            let refusal: string | undefined;
            if (hello.device !== undefined && !input.need.includes(hello.device)) {
              refusal = `device ${hello.device} is not in this run's plan (devices ${input.need.join(', ')})`;
            } else if (hello.device !== undefined && !free.includes(hello.device)) {
              refusal = `device ${hello.device} already has worker ${taken.get(hello.device)}`;
            } else if (free.length === 0) {
              refusal = `every device of this run (${input.need.join(', ')}) already has a worker`;
            }
            if (refusal) {
              log(`refused worker ${hello.worker}: ${refusal}`);
              msg.respond(encode({ type: 'error', v: PROTOCOL_VERSION, code: 'invalid_state', message: refusal, subject: msg.subject }));
              return;
            }
            const device = hello.device ?? free[0]!;
            taken.set(device, hello.worker);
            backends.set(device, hello.backend);
            log(`worker ${hello.worker} (pid ${hello.pid} on ${hello.host}, ${hello.backend}) is device ${device}`);
            msg.respond(encode({ type: 'welcome', v: PROTOCOL_VERSION, device, run: values.run! }));
          },
          (error, msg) => {
            log(`rejected: ${error.message}`);
            if (msg.reply) msg.respond(encode({ type: 'error', v: PROTOCOL_VERSION, code: 'malformed', message: error.problem, subject: error.subject }));
          },
        );
        return () => {
          stopBeats();
          stopJoin();
        };
      }),
    },
  });

  const dispatcher = new BusDispatcher(nc, subj, values.run, scenario.timeouts.call_seconds * 1000);
  const actor = createActor(machine, {
    input: { spec, run: values.run, dispatcher, recorder: fanOut(new RunDirectory(values.out), busEvents) },
  });
  for (const signal of ['SIGINT', 'SIGTERM'] as const) {
    process.once(signal, () => actor.send({ type: 'interrupt', reason: `the supervisor received ${signal}` }));
  }
  actor.start();
  const out = await toPromise(actor);
  await nc.flush().catch(() => {});
  await nc.drain().catch(() => {});
  if (out.status === 'failed') {
    log(`run failed: ${out.error}`);
    return 1;
  }
  log('run succeeded');
  return 0;
});
