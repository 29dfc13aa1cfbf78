// Starts what a run needs on this machine: a NATS server unless one is given, the supervisor
// process, and worker processes; everything it starts, it stops, on success, failure and Ctrl-C.
import { spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { BUS_SYNC_ENV, CREDENTIAL_ENV, answerable, connectBus, hasCredentials, publishEvent, subscribe, subscribeEvents, type RunEventOut } from '../../mesh/wire/index.ts';
import { startNatsServer, type PrivateNatsServer } from '../../mesh/wire/index.ts';
import { authConfig, makeCredentials } from '../../mesh/wire/index.ts';
import { encode } from '../../mesh/wire/index.ts';
import { ChaosAsk, Heartbeat, PROTOCOL_VERSION, SupervisorBeat, type LossTrigger } from '../../mesh/wire/index.ts';
import { CHAOS_ENV } from '../../actors/chaos-client.ts';
import { askCordon } from '../elastic/index.ts';
import { describeExit, Intensity, restarts, toRestart, type Exit } from '../supervision/index.ts';
import { ENVIRONMENT_ACTOR, joinPoints, killPoints, unfiredEvents, type KillPoint, type UnfiredEvent } from '../supervision/index.ts';
import { startEnvironments, type EnvironmentProcesses } from '../environments/index.ts';
import { writeRunReport } from '../runtime/index.ts';
import { subjects } from '../../mesh/wire/index.ts';
import type { Summary } from '../runtime/index.ts';
import { ScenarioError, memoryProblem, planDevices, runSpec } from '../runtime/index.ts';
import type { Scenario } from '../runtime/index.ts';
import { progress as makeProgress, type Progress } from './progress.ts';
import { bundledStart, processBundle, type ProcessBundle } from './process-bundle.ts';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');

export interface LaunchOptions {
  scenario: Scenario;
  run: string;
  out: string;
  /** An existing server; when absent a private one is started. */
  natsUrl?: string;
  /** Worker processes to start; the rest are expected to join by hand. Default: one per device. */
  workers?: number;
  backend?: string;
  progress?: Progress;
  /** Extra environment for the child processes. */
  env?: NodeJS.ProcessEnv;
  /** Go on from the last checkpoint in `out`. */
  resume?: boolean;
  /**
   * Run the private server without authentication. By default it has one user per role (and per
   * device for workers), each with only its subjects, and the credentials go to `out/credentials.json` (for reward actors
   * and workers started by hand); with an existing server (`natsUrl`), the credentials are the
   * environment's (FERRY_NATS_USER, FERRY_NATS_PASS).
   */
  open?: boolean;
  say?: (line: string) => void;
}

export interface LaunchResult {
  code: number;
  summary?: Summary;
  natsUrl: string;
  chaos: ChaosLog;
  /** Why the launcher gave up restarting (its supervision intensity), if it did. */
  escalation?: string;
}

export function startProcess(script: string, argv: string[], logFile: string, env: NodeJS.ProcessEnv, bundle?: ProcessBundle): ChildProcess {
  const log = createWriteStream(logFile);
  // Its own process group: a terminal's Ctrl-C reaches the launcher alone, which then stops the
  // children in order (the supervisor first writes its summary).
  // FERRY_NODE_ARGS: extra Node.js flags for every process started here (e.g. --cpu-prof).
  const nodeArgs = (process.env.FERRY_NODE_ARGS ?? '').split(' ').filter(Boolean);
  // A worker or the supervisor starts from the bundle of ferry's modules where there is one (process-bundle.ts).
  const start = bundledStart(script, bundle);
  const child = spawn(process.execPath, [...nodeArgs, ...start.loader, start.entry, ...argv], {
    cwd: ROOT,
    env: { ...process.env, ...start.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
  });
  child.stdout!.pipe(log);
  child.stderr!.pipe(log);
  return child;
}

export const exited = (c: ChildProcess) => (c.exitCode !== null || c.signalCode !== null ? Promise.resolve() : new Promise<void>((r) => c.once('exit', () => r())));

function tail(file: string, lines = 15): string {
  try {
    return readFileSync(file, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
  } catch {
    return '';
  }
}

/** A cluster's servers (a comma-separated list) rotated by `index`, so that workers spread over them. */
export function spread(url: string, index: number): string {
  const servers = url.split(',');
  return [...servers.slice(index % servers.length), ...servers.slice(0, index % servers.length)].join(',');
}

/** What the launcher saw of chaos and recovery during a run. */
export interface ChaosLog {
  kills: Array<KillPoint & { at: number; pid: number; where: string; recovery_seconds?: number }>;
  recoveries: Array<{ at: number; epoch: number; seconds: number; reason: string }>;
  restarts: Array<{ at: number; kind: 'worker' | 'supervisor'; slot: number; reason: string }>;
  /** Workers started for devices beyond the plan (chaos.joins). */
  joins: Array<{ at: number; device: number; pid: number }>;
  /** The scenario's kills, losses and joins that never fired, each with why (as far as the run tells). */
  unfired: UnfiredEvent[];
}

interface Slot {
  kind: 'worker' | 'supervisor';
  index: number;
  child: ChildProcess;
  /** Set when the strategy takes it down along with another: its exit is not a failure of its own. */
  takenDown?: boolean;
}

export async function launch(o: LaunchOptions): Promise<LaunchResult> {
  const say = o.say ?? ((line: string) => process.stdout.write(`${line}\n`));
  // Refused before any process starts or any file is written.
  const memory = memoryProblem(o.scenario);
  if (memory) throw new ScenarioError(`${o.scenario.name ?? 'scenario'}: ${memory}`);
  const spec = runSpec(o.scenario);
  const devices = planDevices(spec);
  const points = killPoints(spec);
  const joins = joinPoints(spec);
  // An elastic run may take workers for any device of its cluster (a lost one back, one the plan does not use).
  const cluster = Array.from({ length: o.scenario.cluster.nodes * o.scenario.cluster.devices_per_node }, (_, d) => d);
  const sup = o.scenario.supervision;
  const logs = join(o.out, 'logs');
  mkdirSync(logs, { recursive: true });
  let server: PrivateNatsServer | undefined;
  let environments: EnvironmentProcesses | undefined;
  const slots: Slot[] = [];
  const all = () => slots.map((s) => s.child);
  let interrupted = false;
  const chaos: ChaosLog = { kills: [], recoveries: [], restarts: [], joins: [], unfired: [] };

  const cleanup = async () => {
    const children = all();
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGTERM');
    const timer = setTimeout(() => children.forEach((c) => c.exitCode === null && c.kill('SIGKILL')), 5000);
    await Promise.all(children.map(exited));
    clearTimeout(timer);
    await environments?.stop();
    await server?.stop();
  };
  // Ctrl-C stops the children; the run's own flow then sees the supervisor exit, stops the
  // server in `finally`, and reports 130. A second Ctrl-C kills the launcher outright.
  const onSignal = () => {
    interrupted = true;
    say('interrupted: stopping the run');
    for (const c of all()) if (c.exitCode === null && c.signalCode === null) c.kill('SIGTERM');
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);

  try {
    let url = o.natsUrl;
    // Closed by default: a private server requires per-run credentials for every role.
    const creds = !o.open && !url ? makeCredentials(o.run, o.scenario.elastic ? cluster : devices) : undefined;
    if (creds) {
      writeFileSync(join(o.out, 'credentials.json'), `${JSON.stringify(creds, null, 2)}\n`, { mode: 0o600 });
      say(`the bus is closed: credentials per role in ${join(o.out, 'credentials.json')}`);
    } else if (o.open && !url) {
      say('the bus is OPEN (--open): anyone who can reach the server can publish and subscribe on this run');
    }
    if (!url) {
      // A reply may come as late as the longest call or reward request allows.
      const replySeconds = Math.max(o.scenario.timeouts.call_seconds, ...o.scenario.reward.actors.map((a) => a.timeout_seconds), o.scenario.environment?.timeout_seconds ?? 0) + 60;
      server = await startNatsServer({ log: say, sync: o.scenario.bus.sync, ...(creds ? { config: authConfig(o.run, creds, { replySeconds }) } : {}) });
      url = server.url;
      say(`nats-server on ${url} (private to this run, store in ${server.storeDir})`);
      if (interrupted) return { code: 130, natsUrl: url, chaos };
    } else {
      say(`using NATS at ${url}`);
    }
    // The scenario's environment processes, on the bus before the run needs them.
    if (o.scenario.environment?.command !== undefined) {
      environments = startEnvironments(o.scenario.environment, { url, ...(creds ? { credential: creds.environment } : {}), logs, say });
    }
    const nc = await connectBus(url, `ferry-launcher-${o.run}`, creds?.launcher ?? {});
    if (o.natsUrl && !hasCredentials() && !nc.info?.auth_required) {
      say(
        `warning: ${url} accepted a connection without credentials: anyone who can reach it can steer or corrupt this run (give a server that requires them FERRY_NATS_USER and FERRY_NATS_PASS, FERRY_NATS_TOKEN, FERRY_NATS_NKEY or FERRY_NATS_CREDS)`,
      );
    }
    const subj = subjects(o.run);
    // Where the run's bus is, for the tools that talk to a running run (npm run cordon).
    writeFileSync(join(o.out, 'bus.json'), `${JSON.stringify({ url, run: o.run }, null, 2)}\n`);
    // Devices an elastic run goes on without: their workers are not restarted.
    const retired = new Map<number, { trigger: LossTrigger; reason: string }>();
    // The launcher's own events: a process exited, the run is done, supervision gave up.
    const publish = (e: RunEventOut) => {
      if (nc.isClosed() || nc.isDraining()) return;
      publishEvent(nc, subj, e);
    };
    const bar = o.progress ?? makeProgress();
    // Restarts stop once the run is stopping its workers or has ended.
    let ending = false;
    let supervisorDone = false;
    const stopEvents = subscribeEvents(
      nc,
      subj,
      (e) => {
        if (e.type === 'phase') {
          if (e.phase === 'stopping') ending = true;
          // The supervisor has written its summary: however its process ends now, the run is over.
          if (e.phase === 'finished') supervisorDone = ending = true;
          bar.phase(e.phase, e.detail);
        } else if (e.type === 'progress') {
          bar.iteration(e.metrics, e.iterations);
          // chaos.joins: a worker for the device starts once the iteration before its own is done.
          for (const [i, j] of joins.entries()) if (j.iteration === e.metrics.iteration + 1 && !joinsTried.has(i)) joinDevice(i);
        } else if (e.type === 'log') say(`${e.source}: ${e.message}`);
        else if (e.type === 'recovered') {
          const now = Date.now();
          chaos.recoveries.push({ at: now, epoch: e.epoch, seconds: e.seconds, reason: e.reason });
          for (const k of chaos.kills) k.recovery_seconds ??= (now - k.at) / 1000;
          say(`recovered (${e.reason}) in ${e.seconds.toFixed(1)} s: going on from iteration ${e.iteration}`);
        } else if (e.type === 'cordoned') {
          if (!retired.has(e.device)) say(`device ${e.device} is lost for good (${e.trigger}: ${e.reason}): the run re-plans without it, and its worker is not restarted`);
          retired.set(e.device, { trigger: e.trigger, reason: e.reason });
        } else if (e.type === 'lost') {
          // A hung worker of ours: kill it (SIGKILL also ends a stopped process); its exit restarts it.
          // The supervisor names the worker it gave up: a pid this launcher heard beat as another
          // worker is not that one's, whoever says it is.
          const slot = slots.find((s) => s.kind === 'worker' && s.child.pid === e.pid);
          const heard = e.pid === undefined ? undefined : workerOfPid.get(e.pid);
          if (slot && heard !== undefined && heard !== e.worker) say(`ignored a 'lost' of device ${e.device} (${e.reason}): it names worker ${e.worker}, but pid ${e.pid} beats as worker ${heard}`);
          else if (slot && e.pid !== undefined) {
            say(`device ${e.device} was given up (${e.reason}): killing its worker (pid ${e.pid})`);
            slot.child.kill('SIGKILL');
          }
        }
      },
      (err) => say(`ignored event: ${err.message}`),
    );
    // Chaos: a process at a kill point asks to be killed; each point is done once.
    const done = new Set<string>();
    // Kill points asked about by a process this launcher does not run (spared): why they may not fire.
    const sparedWhy = new Map<string, string>();
    const stopChaos = subscribe(
      nc,
      subj.chaos,
      ChaosAsk,
      (ask, msg) => {
        if (!answerable(msg)) return; // a process at a kill point asks with a request
        const k = points.find((p) => p.id === ask.target);
        if (k && k.actor === ENVIRONMENT_ACTOR && !done.has(k.id)) {
          // An environment instance dies mid-episode; the worker that reached the point goes on.
          done.add(k.id);
          const pid = environments?.kill(0);
          chaos.kills.push({ ...k, at: Date.now(), pid: pid ?? 0, where: `environment instance 0, while ${ask.where}` });
          say(`chaos: killing environment '${o.scenario.environment?.name}' instance 0${pid ? ` (pid ${pid})` : ' (not running)'} while ${ask.where}`);
          msg.respond(encode({ type: 'spare', v: PROTOCOL_VERSION, target: ask.target }));
          return;
        }
        const slot = slots.find((s) => s.child.pid === ask.pid && s.child.exitCode === null);
        if (!k || done.has(k.id) || !slot) {
          if (k && !done.has(k.id)) sparedWhy.set(k.id, `reached in ${ask.where} by pid ${ask.pid}, which is no running process of this launcher's: spared`);
          msg.respond(encode({ type: 'spare', v: PROTOCOL_VERSION, target: ask.target }));
          return;
        }
        done.add(k.id);
        chaos.kills.push({ ...k, at: Date.now(), pid: ask.pid, where: ask.where });
        if (k.lose) {
          // Lost for good: killed, never restarted, and the supervisor told to go on without it.
          retired.set(k.device!, { trigger: 'chaos', reason: `chaos: lost for good in ${ask.where}` });
          say(`chaos: device ${k.device} is lost for good in ${ask.where}: killing worker ${slot.index} (pid ${ask.pid})`);
          slot.child.kill('SIGKILL');
          loseDevice(k.device!, 'chaos', `chaos: lost for good in ${ask.where}`);
          return;
        }
        say(`chaos: ${k.how === 'hang' ? 'hanging' : 'killing'} ${slot.kind === 'supervisor' ? 'the supervisor' : `worker ${slot.index}`} (pid ${ask.pid}) in ${ask.where}`);
        slot.child.kill(k.how === 'hang' ? 'SIGSTOP' : 'SIGKILL');
      },
      (err) => say(`ignored chaos request: ${err.message}`),
    );
    // A supervisor that stops beating is hung: kill it, and its restart policy replaces it.
    let supervisorBeat = { pid: 0, at: 0 };
    const stopBeats = subscribe(
      nc,
      subj.supervisorBeat,
      SupervisorBeat,
      (b) => (supervisorBeat = { pid: b.pid, at: Date.now() }),
      () => {},
    );
    // Workers too: the supervisor gives up a silent worker it knows, but one it has never heard
    // (a worker that hung while a new supervisor was taking over) only its launcher can find.
    const workerBeats = new Map<number, number>();
    const workerOfPid = new Map<number, string>();
    const stopWorkerBeats = subscribe(
      nc,
      subj.heartbeats,
      Heartbeat,
      (b) => {
        if (b.pid === undefined) return;
        workerBeats.set(b.pid, Date.now());
        workerOfPid.set(b.pid, b.worker);
      },
      () => {},
    );
    let pausedUntil = 0;
    const hungAfterMs = o.scenario.timeouts.heartbeat_seconds * 1000;
    void (async () => {
      // While the launcher's own connection is away, nobody's silence counts.
      for await (const st of nc.status()) {
        if (st.type === 'disconnect' || st.type === 'reconnect') pausedUntil = Date.now() + hungAfterMs;
        if (st.type === 'error') say(`launcher: the server refused: ${st.error.message}`);
      }
    })();
    const alive = (c: ChildProcess) => c.exitCode === null && c.signalCode === null;
    const watchdog = setInterval(() => {
      const now = Date.now();
      if (now < pausedUntil) return;
      for (const slot of slots) {
        if (!alive(slot.child) || slot.child.pid === undefined) continue;
        const last = slot.kind === 'supervisor' ? (supervisorBeat.pid === slot.child.pid ? supervisorBeat.at : undefined) : workerBeats.get(slot.child.pid);
        if (last === undefined || now - last <= hungAfterMs) continue;
        say(`${slot.kind === 'supervisor' ? 'the supervisor' : `worker ${slot.index}`} (pid ${slot.child.pid}) sent no heartbeat for ${((now - last) / 1000).toFixed(1)} s: hung; killing it`);
        if (slot.kind === 'supervisor') supervisorBeat = { pid: 0, at: 0 };
        else workerBeats.delete(slot.child.pid);
        slot.child.kill('SIGKILL');
      }
    }, 500).unref();
    await nc.flush();

    const env: NodeJS.ProcessEnv = { ...o.env, NATS_URL: url, ...(points.length ? { [CHAOS_ENV]: JSON.stringify(points) } : {}), ...(server ? { [BUS_SYNC_ENV]: server.sync } : {}) };
    // The supervisor reads the scenario as resolved here (defaults filled in, overrides applied),
    // and the run directory keeps it: the exact input of this run.
    const resolved = join(o.out, 'scenario.json');
    writeFileSync(resolved, `${JSON.stringify(o.scenario, null, 2)}\n`);
    // The workers and the supervisor start from one bundle of ferry's modules (built once per state
    // of the sources); where it cannot be built they start through tsx, only slower.
    const bundle = await processBundle().catch((e: unknown) => {
      say(`the run's processes start through tsx: their bundle could not be built (${(e as Error).message})`);
      return undefined;
    });
    let intensity = new Intensity(sup.intensity, sup.period_seconds);
    let escalation: string | undefined;
    const escalate = (message: string) => {
      escalation = message;
      say(`supervision: ${message}`);
      publish({ type: 'log', level: 'error', source: 'launcher', message: `supervision: ${message}` });
    };
    // An elastic run's device lost for good: the supervisor is asked to go on without it (asked
    // again while no supervisor answers); a refusal (no plan survives the loss) ends the run.
    const loseDevice = (device: number, trigger: LossTrigger, reason: string) => {
      askCordon(nc, subj, { device, trigger, reason }, o.scenario.timeouts.recover_seconds * 1000).then(
        (answer) => {
          if (answer.ok) say(`the run goes on without device ${device}, on devices ${answer.left.join(', ')}`);
          else if (!ending) escalate(`device ${device} is lost for good (${reason}), and the run cannot go on without it: ${answer.problem}`);
        },
        (e: unknown) => {
          if (!ending) escalate(`device ${device} is lost for good (${reason}), and no supervisor answered: ${(e as Error).message}`);
        },
      );
    };
    /** Whether a worker slot's device is out of the run: on an open bus, whether the workers left already cover the devices left. */
    const retiredSlot = (slot: Slot) => {
      if (slot.kind !== 'worker' || retired.size === 0) return false;
      const device = deviceOf(slot.index);
      if (device !== undefined) return retired.has(device);
      return slots.filter((x) => x !== slot && x.kind === 'worker' && alive(x.child)).length >= devices.length - retired.size;
    };
    let supervisorGone!: () => void;
    const supervisorEnded = new Promise<void>((r) => (supervisorGone = r));
    let supervisorCode = null as number | null;

    // On the private server, each process gets its own user and no other credentials of the
    // caller's: the supervisor's, or the one of the device a worker is started for.
    const ownEnv = (c: { user: string; pass: string } | undefined): NodeJS.ProcessEnv => {
      if (!c) return env;
      const own = { ...env };
      for (const k of CREDENTIAL_ENV) delete own[k];
      return { ...own, FERRY_NATS_USER: c.user, FERRY_NATS_PASS: c.pass };
    };
    // With a credential per device, worker slot i is device devices[i], restarts included; on an
    // open bus a worker takes whichever device is free, so that it never waits for one taken by hand.
    // Slot i beyond the plan's: a worker started for a device that joins (chaos.joins).
    const slotDevices = [...devices];
    const deviceOf = (index: number) => (creds ? slotDevices[index] : undefined);
    const start = (kind: Slot['kind'], index: number, again: boolean): Slot => {
      const device = deviceOf(index);
      const child =
        kind === 'supervisor'
          ? startProcess(
              'actors/supervisor.ts',
              ['--scenario', resolved, '--run', o.run, '--out', o.out, '--nats', url!, ...(again ? ['--take-over'] : o.resume ? ['--resume'] : [])],
              join(logs, again ? `supervisor.${Date.now()}.log` : 'supervisor.log'),
              ownEnv(creds?.supervisor),
              bundle,
            )
          : startProcess(
              'actors/worker.ts',
              ['--run', o.run, '--nats', spread(url!, index), '--backend', o.backend ?? o.scenario.backend, ...(device === undefined ? [] : ['--device', String(device)])],
              join(logs, again ? `worker-${index}.${Date.now()}.log` : `worker-${index}.log`),
              ownEnv(device === undefined ? undefined : creds?.workers[device]),
              bundle,
            );
      const slot: Slot = { kind, index, child };
      child.once('exit', (code, signal) => onExit(slot, { code, signal }));
      return slot;
    };

    // OTP, for processes: the restart policy decides whether a dead process comes back, the
    // strategy which others come back with it, the intensity when to give up instead.
    const onExit = (slot: Slot, exit: Exit) => {
      const current = slots.includes(slot);
      if (!current) return;
      // A supervisor that exits with 0 or 1 has ended the run (well or not) and written its
      // summary; one killed by a signal has not, and a new one takes the run over.
      const finished = slot.kind === 'supervisor' && (supervisorDone || interrupted || exit.code === 0 || exit.code === 1);
      const policy = slot.kind === 'supervisor' ? sup.restart.supervisor : sup.restart.worker;
      const restart = !ending && !interrupted && !escalation && !finished && !retiredSlot(slot) && (slot.takenDown || restarts(policy, exit));
      publish({ type: 'exit', kind: slot.kind, pid: slot.child.pid ?? 0, host: hostname(), code: exit.code, signal: exit.signal, restart });
      if (!restart) {
        if (slot.kind === 'supervisor') {
          supervisorCode = exit.code;
          supervisorGone();
        }
        return;
      }
      const who = slot.kind === 'supervisor' ? 'the supervisor' : `worker ${slot.index}`;
      const reason = slot.takenDown ? `taken down with another (${sup.strategy})` : describeExit(exit);
      if (!slot.takenDown) {
        const giveUp = intensity.record({ at: Date.now(), actor: `${who} (pid ${slot.child.pid})`, reason });
        const device = slot.kind === 'worker' ? deviceOf(slot.index) : undefined;
        if (giveUp && o.scenario.elastic && device !== undefined) {
          // An elastic run gives up the device instead of the run: its worker is not restarted, and the count starts over.
          retired.set(device, { trigger: 'intensity', reason });
          intensity = new Intensity(sup.intensity, sup.period_seconds);
          say(`supervision: worker ${slot.index} (device ${device}) ${reason}, past the restart intensity: device ${device} is lost for good`);
          loseDevice(device, 'intensity', `its worker failed past supervision.intensity (${sup.intensity} in ${sup.period_seconds} s), the last time ${reason}`);
          return;
        }
        if (giveUp) {
          escalate(giveUp);
          if (slot.kind === 'supervisor') {
            supervisorCode = 1;
            supervisorGone();
          }
          return;
        }
      }
      chaos.restarts.push({ at: Date.now(), kind: slot.kind, slot: slot.index, reason });
      say(`${who} (pid ${slot.child.pid}) ${reason}: restarting it`);
      if (slot.kind === 'worker' && !slot.takenDown) {
        const workers = slots.filter((s) => s.kind === 'worker');
        for (const other of toRestart(sup.strategy, workers, slot)) {
          if (other === slot || other.child.exitCode !== null || other.child.signalCode !== null) continue;
          other.takenDown = true;
          other.child.kill('SIGKILL');
        }
      }
      slots[slots.indexOf(slot)] = start(slot.kind, slot.index, true);
      // A supervisor taking the run over hears again which devices are out (it may have died before it wrote so).
      if (slot.kind === 'supervisor') for (const [device, why] of retired) loseDevice(device, why.trigger, why.reason);
    };

    // chaos.joins: a worker for a device beyond the plan (or back for one the run lost), each join
    // (by its index) tried once; those that start no worker say why.
    const joinsTried = new Set<number>();
    const joinsDone = new Set<number>();
    const joinsWhy = new Map<number, string>();
    const joinDevice = (i: number) => {
      joinsTried.add(i);
      const device = joins[i]!.device;
      if (!creds) {
        joinsWhy.set(i, `on an open bus a worker takes whichever device is free: the launcher starts none for device ${device}`);
        say(`chaos: no worker started for device ${device}: on an open bus a worker takes whichever device is free`);
        return;
      }
      retired.delete(device);
      let index = slotDevices.indexOf(device);
      if (index < 0) index = slotDevices.push(device) - 1;
      const at = slots.findIndex((x) => x.kind === 'worker' && x.index === index);
      if (at >= 0 && alive(slots[at]!.child)) {
        joinsWhy.set(i, `device ${device}'s worker was still running: there was none to start`);
        return;
      }
      joinsDone.add(i);
      const fresh = start('worker', index, at >= 0);
      if (at >= 0) slots[at] = fresh;
      else slots.push(fresh);
      chaos.joins.push({ at: Date.now(), device, pid: fresh.child.pid ?? 0 });
      say(`chaos: a worker joins for device ${device} (pid ${fresh.child.pid})`);
    };

    slots.push(start('supervisor', 0, false));
    // On an open bus, workers take whichever device is free when they join, so that workers
    // started here and by hand never compete for the same slot; on a closed one, the devices left
    // to start by hand are the last ones. Each log says which device its worker became.
    const count = Math.min(o.workers ?? devices.length, devices.length);
    for (let i = 0; i < count; i++) slots.push(start('worker', i, false));
    if (count < devices.length) {
      const command = `npm run worker -- --nats ${url} --run ${o.run}`;
      say(
        creds
          ? `waiting for ${devices.length - count} worker(s) to join by hand, one per device, each with its device's credential (workers.<device> in ${join(o.out, 'credentials.json')}):\n${devices
              .slice(count)
              .map((d) => `  FERRY_NATS_USER=${creds.workers[d]!.user} FERRY_NATS_PASS=<its pass> ${command} --device ${d}`)
              .join('\n')}`
          : `waiting for ${devices.length - count} worker(s) to join by hand: ${command}`,
      );
    }
    await supervisorEnded;
    ending = true;
    clearInterval(watchdog);
    stopBeats();
    stopWorkerBeats();
    bar.stop();
    stopEvents();
    stopChaos();
    const code = interrupted ? 130 : (supervisorCode ?? 1);
    let summary: Summary | undefined;
    try {
      summary = JSON.parse(readFileSync(join(o.out, 'summary.json'), 'utf8')) as Summary;
    } catch {
      summary = undefined;
    }
    // The run is over: workers still there (started by hand, or left by a failed run) leave.
    publish({
      type: 'done',
      status: code === 0 && summary?.status !== 'failed' ? 'succeeded' : 'failed',
      message: summary?.error ?? escalation ?? (code === 0 ? `${summary?.iterations ?? 0} iterations` : `the supervisor exited with code ${code}`),
    });
    await nc.flush().catch(() => {});
    await nc.drain().catch(() => {});
    const supervisorLog = join(logs, 'supervisor.log');
    if (code !== 0 && !interrupted) {
      say(`the supervisor exited with code ${code}; its log (${supervisorLog}) ends:\n${tail(supervisorLog)}`);
    }
    // Workers stop on the supervisor's shutdown call; give them a moment, then stop the rest.
    const workers = slots.filter((s) => s.kind === 'worker').map((s) => s.child);
    await Promise.race([Promise.all(workers.map(exited)), new Promise((r) => setTimeout(r, 3000))]);
    // What chaos did (and what it was to do but did not), and the report of the whole run (a report that cannot be drawn fails nothing).
    chaos.unfired = unfiredEvents(spec, points, joins, { kills: done, joins: joinsDone }, summary, { kills: sparedWhy, joins: joinsWhy });
    writeFileSync(join(o.out, 'chaos.json'), `${JSON.stringify(chaos, null, 2)}\n`);
    try {
      say(`report: ${writeRunReport(o.out)}`);
    } catch (e) {
      say(`could not write the report: ${(e as Error).message}`);
    }
    return { code, summary, natsUrl: url, chaos, ...(escalation ? { escalation } : {}) };
  } finally {
    await cleanup();
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
}
