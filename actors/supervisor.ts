// The supervisor process: runs one scenario's supervisor machine over NATS and owns the run
// directory. The launcher starts it; it can also be started by hand against an existing server:
//   npx tsx actors/supervisor.ts --scenario FILE --run RUN_ID --out DIR [--nats URL]
import { createActor, fromCallback, toPromise } from 'xstate';
import { BUS_SYNC_ENV, answerable, connectBus, publishEvent, subscribe, subscribeEvents, type RunEventOut } from '../mesh/wire/index.ts';
import { CordonAsk } from '../mesh/wire/index.ts';
import { encode, EnvClient } from '../mesh/wire/index.ts';
import { PROTOCOL_VERSION, type Metrics } from '../mesh/wire/index.ts';
import { subjects } from '../mesh/wire/index.ts';
import { fanOut, readResume, RunDirectory, type Recorder, type Summary } from '../engine/runtime/index.ts';
import { planDevices, reshardToPlan, runSpec, type RewardSources } from '../engine/runtime/index.ts';
import { cordonProblem, specOnPlan, warmSearchThread } from '../engine/elastic/index.ts';
import { loadScenarioFile } from '../engine/runtime/index.ts';
import { BusDispatcher } from '../engine/runtime/index.ts';
import { DEFAULT_NATS, UsageError, args, logger, runMain } from './host.ts';
import { ChaosClient } from './chaos-client.ts';
import { JetStreamStore } from '../engine/runtime/index.ts';
import { Membership } from '../engine/supervision/index.ts';
import { RewardClient } from '../engine/runtime/index.ts';
import { sparesOf, supervisorMachine, type MembershipCommand, type SupervisorEvent } from '../engine/supervision/index.ts';

const USAGE = 'usage: supervisor --scenario FILE --run RUN_ID --out DIR [--nats URL] [--resume] [--take-over]';

runMain(async () => {
  const { values } = args(USAGE, {
    scenario: { type: 'string' },
    run: { type: 'string' },
    out: { type: 'string' },
    nats: { type: 'string' },
    resume: { type: 'boolean', default: false },
    'take-over': { type: 'boolean', default: false },
  });
  if (!values.scenario || !values.run || !values.out) throw new UsageError(USAGE);
  const log = logger('supervisor');
  const scenario = await loadScenarioFile(values.scenario);
  // An elastic run's re-plans search in a thread: started now, so that a loss does not wait for it to load.
  if (scenario.elastic) warmSearchThread();
  let spec = runSpec(scenario, values.run);
  const nc = await connectBus(values.nats ?? process.env.NATS_URL ?? DEFAULT_NATS, `ferry-supervisor-${values.run}`);
  const subj = subjects(values.run);
  const publish = (event: RunEventOut) => publishEvent(nc, subj, event);

  const busEvents: Recorder = {
    phase: (phase, detail) => {
      log(`phase ${phase}: ${detail}`);
      publish({ type: 'phase', phase, detail });
    },
    iteration: (metrics: Metrics, iterations: number) => publish({ type: 'progress', iterations, metrics }),
    // `done` is the launcher's to say, once this process has ended: here, only that the summary is written.
    finished: (s: Summary) => publish({ type: 'phase', phase: 'finished', detail: `${s.status}: ${s.error ?? `${s.iterations} iterations`}` }),
  };

  const heartbeatMs = scenario.timeouts.heartbeat_seconds * 1000;
  let membership: Membership | undefined;
  const machine = supervisorMachine.provide({
    actors: {
      membership: fromCallback<MembershipCommand, { need: number[] }>(({ sendBack, input, receive }) => {
        membership = new Membership(nc, subj, values.run!, input.need, {
          heartbeatMs,
          onJoined: (j) => sendBack({ type: 'worker.joined', ...j }),
          onLost: (l) => sendBack({ type: 'worker.lost', ...l }),
          onReconnected: (device, worker) => sendBack({ type: 'bus.trouble', reason: `the worker of device ${device} (${worker}) reconnected to NATS; what was in flight may be lost` }),
          log,
          onRejected: (problem) => publish({ type: 'log', level: 'warn', source: 'supervisor', message: `rejected ${problem}` }),
          // A worker may not publish events: what it rejected comes on its heartbeat, and is said here.
          onWarning: (device, worker, message) => publish({ type: 'log', level: 'warn', source: `worker ${worker} (device ${device})`, message }),
          // An elastic run takes workers for any device of its cluster: the planner decides whether to use them.
          ...(scenario.elastic ? { cluster: Array.from({ length: scenario.cluster.nodes * scenario.cluster.devices_per_node }, (_, d) => d) } : {}),
        });
        // A re-plan: the devices of the new plan.
        receive((command) => membership?.setNeed(command.need, command.lost));
        return () => membership?.close();
      }),
    },
  });
  // While this supervisor's own connection is down, nobody's silence is held against them.
  // Once it is back, what was in flight may be lost: the run recovers from its last snapshot.
  let actorRef: { send(e: SupervisorEvent): void } | undefined;
  void (async () => {
    for await (const s of nc.status()) {
      if (s.type === 'error') log(`the server refused: ${s.error.message}`);
      if (s.type === 'disconnect' || s.type === 'reconnect') membership?.pause(heartbeatMs);
      if (s.type === 'reconnect') {
        log(`reconnected to NATS (${s.server})`);
        actorRef?.send({ type: 'bus.trouble', reason: `the supervisor reconnected to NATS (${s.server}); what was in flight may be lost` });
      }
    }
  })();

  // A supervisor that started the run wrote every record it may read back; one that took it over did not.
  // The devices whose workers may write snapshots, as the launcher's credentials have them: the
  // plan's, or in an elastic run every device of the cluster (one may join).
  const cluster = Array.from({ length: scenario.cluster.nodes * scenario.cluster.devices_per_node }, (_, d) => d);
  const store = await JetStreamStore.open(nc, values.run, { log, ownOnly: !values['take-over'], devices: scenario.elastic ? cluster : planDevices(spec) });
  // --take-over: the previous supervisor of this run died; its progress is in the store.
  const takeOver = values['take-over'] ? await store.loadProgress() : undefined;
  if (values['take-over'])
    log(takeOver ? `taking the run over at iteration ${takeOver.iteration} (last snapshot after ${takeOver.snapshot})` : 'taking the run over before it saved any progress: starting it again');
  // An elastic run that re-planned goes on on its new plan (written ahead to the store before it was acted on).
  if (takeOver?.plan) {
    spec = specOnPlan(spec, takeOver.plan);
    log(`the run re-planned onto devices ${planDevices(spec).join(', ')} (lost for good: ${takeOver.lost?.join(', ')})`);
  }
  // …and readies the planning problem of the plan the run goes on with.
  if (scenario.elastic) warmSearchThread(spec.scenario);
  const chaos = ChaosClient.fromEnv(nc, subj, log);
  // --resume: go on from the run directory's last checkpoint, keeping the metrics up to it.
  const found = values.resume && !takeOver ? readResume(values.out) : undefined;
  // Taken on another plan: each model's ranks put together and cut as this plan holds them.
  const onPlan = found && reshardToPlan(spec, found.checkpoint, found.layouts);
  const resume = found && { ...found, checkpoint: onPlan!.set };
  const moved = onPlan?.resharded.length ? `, resharding ${onPlan.resharded.map((m) => `'${m}'`).join(', ')} onto this plan` : '';
  if (resume) log(`resuming after iteration ${resume.iteration} from ${values.out}${moved}`);
  const directory = new RunDirectory(values.out, takeOver?.history ?? resume?.history, takeOver !== undefined || values.resume);
  const dispatcher = new BusDispatcher(nc, subj, values.run, scenario.timeouts.call_seconds * 1000, {
    // The measured timeline: every call, one line each.
    onSpan: (span) => directory.timeline({ type: 'call', ...span }),
    epoch: takeOver ? takeOver.epoch + 1 : 0,
    sealOf: (device) => membership?.sealOf(device),
    onDropped: log,
    ...(chaos ? { beforeCall: (_device, _model, iteration, fn) => chaos.supervisorCall(fn, iteration) } : {}),
  });
  // What the bus's clients (reward actors, an environment) say goes to the log and the events subject.
  const warn = (line: string) => {
    log(line);
    publish({ type: 'log', level: 'warn', source: 'supervisor', message: line });
  };
  // Reward actors on the bus, one client per name; they say on the events subject what they wait for.
  const learned = scenario.reward.model ? [{ name: spec.rewardService, timeout_seconds: 30, retries: 2, wait_seconds: scenario.timeouts.recover_seconds }] : [];
  const clients = new Map(
    [...learned, ...scenario.reward.actors].map((a) => [
      a.name,
      new RewardClient(nc, a.name, {
        timeoutMs: a.timeout_seconds * 1000,
        retries: a.retries,
        waitMs: a.wait_seconds * 1000,
        say: warn,
      }),
    ]),
  );
  const rewards: RewardSources = { score: (name, iteration, items) => clients.get(name)!.score(values.run!, iteration, items) };
  // A warm-up from the environment's expert: the supervisor asks for its demonstrations.
  const envKey = scenario.environment;
  const expert =
    envKey && scenario.warmup.source === 'environment' && scenario.warmup.steps > 0
      ? new EnvClient(nc, envKey.name, {
          run: values.run,
          timeoutMs: envKey.timeout_seconds * 1000,
          retries: envKey.retries,
          waitMs: envKey.wait_seconds * 1000,
          say: warn,
        })
      : undefined;
  const actor = createActor(machine, {
    input: {
      spec,
      rewards,
      ...(expert ? { demonstrate: expert.demonstrate.bind(expert) } : {}),
      run: values.run,
      // The launcher says how the server it started syncs; of a server it did not start, ferry cannot know.
      bus: { server_version: nc.info?.version ?? 'unknown', sync: process.env[BUS_SYNC_ENV] ?? 'unknown: a server ferry did not start' },
      dispatcher,
      store,
      recorder: fanOut(directory, busEvents),
      saveCheckpoint: async (iteration, set, layouts) => directory.saveCheckpoint(iteration, set, layouts),
      onCordoned: (c) => publish({ type: 'cordoned', ...c }),
      onRecovered: (r) => {
        publish({ type: 'recovered', ...r });
        directory.timeline({ type: 'recovery', start: Date.now() - r.seconds * 1000, end: Date.now(), ...r });
      },
      ...(resume ? { resume } : {}),
      ...(values['take-over'] ? { takeOver: takeOver ?? { epoch: 1, iteration: 0, history: [], startedAt: Date.now(), recoveries: [] } } : {}),
    },
  });
  for (const signal of ['SIGINT', 'SIGTERM'] as const) {
    process.once(signal, () => actor.send({ type: 'interrupt', reason: `interrupted: the supervisor received ${signal}` }));
  }
  // The launcher gives up on a run whose processes keep dying (its restart intensity).
  const stopEscalations = subscribeEvents(
    nc,
    subj,
    (e) => {
      if (e.type === 'log' && e.level === 'error' && e.source === 'launcher') actor.send({ type: 'interrupt', reason: e.message });
    },
    () => {},
  );
  actorRef = actor;
  // Devices lost for good, asked by an operator (npm run cordon) or the launcher: answered here, acted on by the machine.
  const stopCordons = subscribe(
    nc,
    subj.cordon,
    CordonAsk,
    async (ask, msg) => {
      if (!answerable(msg)) return;
      const c = actor.getSnapshot().context;
      // Asked again (the launcher does, of a supervisor that takes the run over): it is out already, or being drained.
      if (c.lost.includes(ask.device) || c.loss?.devices.includes(ask.device) || c.draining?.devices.includes(ask.device)) {
        msg.respond(encode({ type: 'cordoned', v: PROTOCOL_VERSION, device: ask.device, left: c.need.filter((d) => d !== ask.device) }));
        return;
      }
      let problem: string | undefined;
      try {
        problem = await cordonProblem(c.spec, c.need, sparesOf(c), ask, (c.snapshot ?? -1) + 1);
      } catch (e) {
        problem = `could not check the re-plan: ${(e as Error).message}`;
      }
      if (problem) {
        log(`refused to run on without device ${ask.device} (${ask.trigger}: ${ask.reason}): ${problem}`);
        msg.respond(encode({ type: 'error', v: PROTOCOL_VERSION, code: 'invalid_state', message: problem, subject: msg.subject }));
        return;
      }
      log(`device ${ask.device} is lost for good (${ask.trigger}: ${ask.reason})`);
      msg.respond(encode({ type: 'cordoned', v: PROTOCOL_VERSION, device: ask.device, left: c.need.filter((d) => d !== ask.device) }));
      actor.send({ type: 'device.lost', device: ask.device, trigger: ask.trigger, reason: ask.reason });
    },
    (err, msg) => {
      log(`rejected a cordon request: ${err.message}`);
      if (answerable(msg)) msg.respond(encode({ type: 'error', v: PROTOCOL_VERSION, code: 'malformed', message: err.problem, subject: err.subject }));
    },
  );
  // Alive: the launcher kills (and replaces) a supervisor whose beats stop.
  const beat = () => nc.publish(subj.supervisorBeat, encode({ type: 'beat', v: PROTOCOL_VERSION, pid: process.pid, at: Date.now() }));
  beat();
  const beating = setInterval(beat, 1000);
  actor.start();
  const out = await toPromise(actor);
  clearInterval(beating);
  for (const c of clients.values()) c.close();
  expert?.close();
  stopEscalations();
  stopCordons();
  await nc.flush().catch(() => {});
  await nc.drain().catch(() => {});
  if (out.status === 'failed') {
    log(`run failed: ${out.error}`);
    return 1;
  }
  log('run succeeded');
  return 0;
});
