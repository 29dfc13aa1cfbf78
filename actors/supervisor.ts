// The supervisor process: runs one scenario's supervisor machine over NATS and owns the run
// directory. The launcher starts it; it can also be started by hand against an existing server:
//   npx tsx actors/supervisor.ts --scenario FILE --run RUN_ID --out DIR [--nats URL]
import { createActor, fromCallback, toPromise } from 'xstate';
import { connectBus } from '../mesh/bus.ts';
import { encode } from '../mesh/codec.ts';
import { PROTOCOL_VERSION, type Metrics } from '../mesh/protocol.ts';
import { subjects } from '../mesh/subjects.ts';
import { fanOut, readResume, RunDirectory, type Recorder, type Summary } from '../engine/record.ts';
import { runSpec } from '../engine/rlhf.ts';
import { loadScenario } from '../engine/scenario.ts';
import { BusDispatcher } from './bus-dispatcher.ts';
import { DEFAULT_NATS, UsageError, args, logger, runMain } from './host.ts';
import { serveJoins } from './membership.ts';
import { supervisorMachine, type SupervisorEvent } from './supervisor.machine.ts';

const USAGE = 'usage: supervisor --scenario FILE --run RUN_ID --out DIR [--nats URL] [--resume]';

runMain(async () => {
  const { values } = args(USAGE, {
    scenario: { type: 'string' },
    run: { type: 'string' },
    out: { type: 'string' },
    nats: { type: 'string' },
    resume: { type: 'boolean', default: false },
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
      gatherWorkers: fromCallback<SupervisorEvent, { need: number[] }>(({ sendBack, input }) =>
        serveJoins(nc, subj, values.run!, input.need, (j) => sendBack({ type: 'worker.joined', ...j }), log, (problem) =>
          publish({ type: 'log', level: 'warn', source: 'supervisor', message: `rejected ${problem}` }),
        ),
      ),
    },
  });

  const dispatcher = new BusDispatcher(nc, subj, values.run, scenario.timeouts.call_seconds * 1000);
  // --resume: go on from the run directory's last checkpoint, keeping the metrics up to it.
  const resume = values.resume ? readResume(values.out) : undefined;
  if (resume) log(`resuming after iteration ${resume.iteration} from ${values.out}`);
  const directory = new RunDirectory(values.out, resume?.history);
  const actor = createActor(machine, {
    input: {
      spec,
      run: values.run,
      dispatcher,
      recorder: fanOut(directory, busEvents),
      saveCheckpoint: async (iteration, set) => directory.saveCheckpoint(iteration, set),
      ...(resume ? { resume } : {}),
    },
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
