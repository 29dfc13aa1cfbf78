// A worker process: one device of a run. Start it by hand to join a run from another machine:
//   npm run worker -- --nats nats://HOST:4222 --run RUN_ID [--device N] [--backend wasm]
import { hostname } from 'node:os';
import { randomBytes, randomUUID } from 'node:crypto';
import { createActor, fromCallback, fromPromise, toPromise } from 'xstate';
import { answerable, connectBus, deviceOfUser, request, subscribe, subscribeEvents, type Msg } from '../mesh/wire/index.ts';
import { NatsShelf, encode } from '../mesh/wire/index.ts';
import { Call, JoinReply, PROTOCOL_VERSION, SupervisorBeat, type Reply } from '../mesh/wire/index.ts';
import { subjects } from '../mesh/wire/index.ts';
import { BACKENDS, initBackend, type BackendChoice } from '../engine/model/index.ts';
import { Device } from '../engine/device/index.ts';
import { DEFAULT_NATS, UsageError, args, logger, runMain } from './host.ts';
import { ChaosClient } from './chaos-client.ts';
import { workerMachine, type WorkerEvent } from './worker.machine.ts';

/** The supervisor beats every second: no beat for this long after a `done`, and it has ended. */
const SUPERVISOR_SILENT_MS = 4000;

const USAGE = 'usage: npm run worker -- --run RUN_ID [--nats URL] [--device N] [--backend auto|wasm|cpu|node|node-gpu] [--join-seconds S]';

runMain(async () => {
  const { values } = args(USAGE, {
    nats: { type: 'string' },
    run: { type: 'string' },
    device: { type: 'string' },
    backend: { type: 'string', default: 'auto' },
    'join-seconds': { type: 'string', default: '120' },
    'transfer-seconds': { type: 'string', default: '300' },
  });
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  if (!values.run) throw new UsageError(`--run is required (the launcher prints the run id)\n${USAGE}`);
  if (!(BACKENDS as readonly string[]).includes(values.backend!)) {
    throw new UsageError(`--backend: expected one of ${BACKENDS.join(', ')}, got ${values.backend}`);
  }
  // A credential for one device (a closed bus) may only be that device.
  const preferred = values.device === undefined ? deviceOfUser(values.run, process.env.FERRY_NATS_USER) : Number(values.device);
  if (preferred !== undefined && !(Number.isInteger(preferred) && preferred >= 0)) {
    throw new UsageError(`--device: expected a device index (0, 1, …), got ${values.device}`);
  }
  const url = values.nats ?? process.env.NATS_URL ?? DEFAULT_NATS;
  const worker = `${hostname()}-${process.pid}-${randomUUID().slice(0, 8)}`;
  // Said to the supervisor alone, and put on every reply: a reply without it is not this process's.
  const seal = randomBytes(18).toString('base64url');
  const log = logger(`worker ${worker}`);
  const backend = await initBackend(values.backend as BackendChoice);
  log(`backend ${backend}`);
  const nc = await connectBus(url, `ferry-worker-${worker}`);
  const subj = subjects(values.run);
  const joinDeadline = Date.now() + Number(values['join-seconds']) * 1000;
  const transferMs = Number(values['transfer-seconds']) * 1000;

  /** Replies; one too large for the server becomes a typed error instead of a crash. */
  const respondSafely = (msg: Msg, reply: Reply) => {
    if (!answerable(msg)) {
      log(`not answering call ${reply.id ?? '?'}: its reply subject ${JSON.stringify(msg.reply ?? null)} is not an inbox`);
      return;
    }
    try {
      msg.respond(encode({ ...reply, seal }));
    } catch (e) {
      const message = `the reply to call ${reply.id ?? '?'} does not fit the server's max payload (${nc.info?.max_payload} bytes): ${(e as Error).message}`;
      log(message);
      msg.respond(encode({ type: 'error', v: PROTOCOL_VERSION, id: reply.id, code: 'too_large', message, seal }));
    }
  };

  /** This worker's device, once it has joined. */
  let device: number | undefined;
  /** Its liveness beacon; a warning (something it rejected) rides on it, as a worker may not publish run events. */
  const beat = (state: 'serving' | 'reconnected', warning?: string) => {
    if (device === undefined) return;
    nc.publish(
      subj.heartbeat(device),
      encode({ type: 'heartbeat', v: PROTOCOL_VERSION, device, worker, state, at: Date.now(), pid: process.pid, backend, seal, ...(warning === undefined ? {} : { warning: warning.slice(0, 1000) }) }),
    );
  };
  const machine = workerMachine.provide({
    actors: {
      join: fromPromise(async () => {
        const hello = { type: 'hello', v: PROTOCOL_VERSION, worker, pid: process.pid, host: hostname(), backend, seal, ...(preferred === undefined ? {} : { device: preferred }) };
        let waited = false;
        for (;;) {
          try {
            const reply = await request(nc, preferred === undefined ? subj.join : subj.joinAs(preferred), hello, JoinReply, 2000);
            if (reply.type === 'error') {
              // Every device taken may be a moment's state (the worker this one replaces is
              // still being given up): ask again until the join deadline.
              if (!/already has (a )?worker/.test(reply.message) || Date.now() > joinDeadline) throw new UsageError(`run ${values.run} refused this worker: ${reply.message}`);
              if (!waited) log(`refused for now (${reply.message}); asking again`);
              waited = true;
              await new Promise((r) => setTimeout(r, 500));
              continue;
            }
            log(`joined run ${reply.run} as device ${reply.device}`);
            return reply.device;
          } catch (e) {
            if (e instanceof UsageError || Date.now() > joinDeadline) throw e;
            if (!waited) log(`waiting for the supervisor of run ${values.run} on ${url}`);
            waited = true;
            await new Promise((r) => setTimeout(r, 500));
          }
        }
      }),
      callListener: fromCallback<WorkerEvent, { index: number }>(({ sendBack, input }) =>
        subscribe(
          nc,
          subj.call(input.index),
          Call,
          (call, msg) => sendBack({ type: 'call', call, respond: (reply: Reply) => respondSafely(msg, reply) }),
          (error, msg) => sendBack({ type: 'malformed', error, respond: answerable(msg) ? (reply: Reply) => msg.respond(encode(reply)) : undefined }),
        ),
      ),
      heartbeat: fromCallback<WorkerEvent, { index: number; worker: string }>(({ input }) => {
        device = input.index;
        beat('serving');
        const timer = setInterval(() => beat('serving'), 1000);
        return () => clearInterval(timer);
      }),
    },
  });

  const chaos = ChaosClient.fromEnv(nc, subj, log);
  // Patient as the run's store is: a snapshot written or a rank reloaded while a clustered server elects a leader waits for it.
  // Each request gives up after 3 s and is tried again, for up to a minute: a request that went to a
  // stream leader on a server that just died is sent again once another is elected, not waited on
  // for the client's 10 s.
  const shelf = new NatsShelf(nc, values.run, { timeoutMs: 3_000, patienceMs: 60_000 });
  const actor = createActor(machine, {
    input: {
      worker,
      log,
      reportRejected: (problem) => beat('serving', `rejected ${problem}`),
      makeDevice: (index) =>
        new Device(index, nc, subj, {
          transferTimeoutMs: transferMs,
          // Snapshots go from this process into its device's own bucket of the run's store.
          shelf,
          ...(chaos ? { midEpisode: (call: Call) => chaos.workerCall(index, call.model, call.body.fn, call.iteration) } : {}),
        }),
      // A generation of episodes reaches its kill points in its middle (the device's midEpisode), not before it runs.
      ...(chaos
        ? { beforeRun: (call: Call, device: number) => (call.body.fn === 'generate' && call.body.episodes ? Promise.resolve() : chaos.workerCall(device, call.model, call.body.fn, call.iteration)) }
        : {}),
    },
  });
  const stop = () => actor.send({ type: 'stop' });
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
  // A run that ends, well or badly, says so on its events subject: its workers leave with it. The
  // launcher says `done` once the supervisor has ended, so a `done` heard while the supervisor
  // still beats is not the run's end (whoever holds the launcher's credential could say it): a
  // worker leaves only once the supervisor has been silent a while after it.
  let supervisorBeatAt = 0;
  const stopSupervisorBeats = subscribe(
    nc,
    subj.supervisorBeat,
    SupervisorBeat,
    () => (supervisorBeatAt = Date.now()),
    () => {},
  );
  const stopEvents = subscribeEvents(
    nc,
    subj,
    (e) => {
      if (e.type === 'done') {
        const heardAt = Date.now();
        setTimeout(() => {
          if (supervisorBeatAt > heardAt) return log(`ignored a 'done' (${e.status}: ${e.message.slice(0, 200)}): the supervisor still beats`);
          log(`the run is over (${e.status}): leaving`);
          stop();
        }, SUPERVISOR_SILENT_MS).unref();
      } else if (e.type === 'lost' && e.worker === worker) {
        // The supervisor gave this worker up (it thought it hung): another takes its device, so
        // this one must not answer another call.
        log(`the supervisor gave this worker up (${e.reason}): leaving`);
        process.exit(3);
      }
    },
    () => {},
  );
  // A bus that stays away longer than a join may take means the run is gone.
  void (async () => {
    let timer: NodeJS.Timeout | undefined;
    for await (const s of nc.status()) {
      // Outside this worker's permissions (a closed bus): a bug, or a credential for another device.
      if (s.type === 'error') log(`the server refused: ${s.error.message}`);
      if (s.type === 'disconnect') {
        timer ??= setTimeout(() => {
          log(`disconnected from ${url} for ${values['join-seconds']} s: leaving`);
          stop();
        }, Number(values['join-seconds']) * 1000);
      } else if (s.type === 'reconnect') {
        clearTimeout(timer);
        timer = undefined;
        // What this worker sent while the connection was going down may be lost: say so.
        beat('reconnected');
      }
    }
  })();
  actor.start();
  const out = await toPromise(actor);
  stopEvents();
  stopSupervisorBeats();
  await nc.drain().catch(() => {});
  if (out.error) {
    log(out.error);
    return 1;
  }
  log('stopped');
  return 0;
});
