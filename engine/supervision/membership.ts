// Who is which device, for the whole run. A worker asks to join and gets a free device; it counts
// as joined at its first heartbeat (which it sends after subscribing to its call subject, and the
// server keeps one connection's messages in order, so calls cannot race it). A device is given up
// when its worker's process exits (the launcher says so on the events subject; a process that
// this machine sees alive has not exited, whoever says so) or when its heartbeats stop for
// `heartbeatMs`: then the supervisor hears `lost`, the run's observers hear it too (with the pid,
// so that whoever started the process kills it, and the worker itself, so that it leaves), and
// the device is free for a new worker. A supervisor that takes a run over adopts the workers it
// hears beating. What a worker says on its heartbeat (a warning) is said for it: a worker may not
// publish run events. Each worker's seal (protocol.ts) is kept for the dispatcher.
import { hostname } from 'node:os';
import { answerable, publishEvent, subscribe, subscribeEvents, type Bus } from '../../mesh/wire/index.ts';
import { encode } from '../../mesh/wire/index.ts';
import { Heartbeat, Hello, PROTOCOL_VERSION } from '../../mesh/wire/index.ts';
import type { Subjects } from '../../mesh/wire/index.ts';
import { describeExit } from './supervision.ts';

export interface Joined {
  device: number;
  worker: string;
  backend: string;
}

export interface Lost {
  device: number;
  worker: string;
  reason: string;
}

interface Member {
  worker: string;
  pid?: number;
  /** The host its hello named (none for a worker adopted from its heartbeats). */
  host?: string;
  /** Its process's seal (protocol.ts): a reply to a call without it is not that process's. */
  seal?: string;
  backend: string;
  lastBeat: number;
  announced: boolean;
}

export interface MembershipOptions {
  /** A worker silent this long is given up (and killed by whoever started it). */
  heartbeatMs: number;
  onJoined: (j: Joined) => void;
  onLost: (l: Lost) => void;
  /** A worker's connection to NATS dropped and came back: what it was sending may be lost. */
  onReconnected?: (device: number, worker: string) => void;
  log: (line: string) => void;
  onRejected?: (problem: string) => void;
  /** The worker of a device warned on its heartbeat (something it rejected). */
  onWarning?: (device: number, worker: string, message: string) => void;
  /**
   * Every device of the cluster, where workers may join beyond the plan (an elastic run: the
   * supervisor offers their devices to the planner); absent, a hello for a device outside the
   * plan is refused.
   */
  cluster?: readonly number[];
}

export class Membership {
  private readonly members = new Map<number, Member>();
  /** Workers given up: their late heartbeats must not bring them back. */
  private readonly gone = new Set<string>();
  private pausedUntil = 0;
  private readonly stops: Array<() => void> = [];

  constructor(
    private readonly nc: Bus,
    private readonly subj: Subjects,
    run: string,
    private need: readonly number[],
    private readonly o: MembershipOptions,
  ) {
    const rejected = (error: { message: string }) => {
      o.log(`rejected: ${error.message}`);
      o.onRejected?.(error.message);
    };
    this.stops.push(subscribe(nc, subj.heartbeats, Heartbeat, (beat) => this.beat(beat), rejected));
    for (const subject of [subj.join, subj.joins])
      this.stops.push(
        subscribe(
          nc,
          subject,
          Hello,
          (hello, msg) => {
            // A worker asks with a request: a hello that cannot be answered on an inbox is not one.
            if (!answerable(msg)) return rejected({ message: `a hello from ${hello.worker} whose reply subject ${JSON.stringify(msg.reply ?? null)} is not an inbox` });
            // On a device's own subject, a hello is for that device only.
            const own = msg.subject === subj.join ? undefined : Number(msg.subject.slice(subj.join.length + 1));
            const answer = own !== undefined && hello.device !== own ? `a hello on ${msg.subject} is for device ${own}; this one asks for ${hello.device ?? 'any device'}` : this.join(hello);
            if (own !== undefined && hello.device !== own) rejected({ message: `worker ${hello.worker}: ${answer}` });
            msg.respond(
              encode(
                typeof answer === 'string'
                  ? { type: 'error', v: PROTOCOL_VERSION, code: 'invalid_state', message: answer, subject: msg.subject }
                  : { type: 'welcome', v: PROTOCOL_VERSION, device: answer, run },
              ),
            );
          },
          (error, msg) => {
            rejected(error);
            if (answerable(msg)) msg.respond(encode({ type: 'error', v: PROTOCOL_VERSION, code: 'malformed', message: error.problem, subject: error.subject }));
          },
        ),
      );
    this.stops.push(
      subscribeEvents(
        nc,
        subj,
        (e) => {
          if (e.type !== 'exit' || e.kind !== 'worker') return;
          for (const [device, m] of this.members) {
            // A pid names a process on one machine: the launcher's exit is of a worker there.
            if (m.pid !== e.pid) continue;
            if (e.host !== undefined && m.host !== e.host) {
              o.log(`ignored an exit of pid ${e.pid} on ${e.host}: device ${device}'s worker ${m.worker} with that pid runs on ${m.host}`);
              continue;
            }
            // The launcher says so once the process has gone: one this machine sees alive has not.
            if (aliveHere(m)) o.log(`ignored an exit of pid ${e.pid} (device ${device}, worker ${m.worker}): that process is alive on this machine`);
            else this.lose(device, `its process (pid ${e.pid}) ${describeExit(e)}`, false);
          }
        },
        () => {},
      ),
    );
    const timer = setInterval(() => this.check(), Math.min(1000, o.heartbeatMs / 4));
    this.stops.push(() => clearInterval(timer));
  }

  /** The bus itself was away: nobody's silence meanwhile counts against them. */
  pause(forMs: number): void {
    this.pausedUntil = Math.max(this.pausedUntil, Date.now() + forMs);
    for (const m of this.members.values()) m.lastBeat = Math.max(m.lastBeat, this.pausedUntil);
  }

  close(): void {
    for (const stop of this.stops.splice(0)) stop();
  }

  /**
   * The devices of the plan now (an elastic run re-planned). A worker on a device lost for good
   * (`lost`), or outside the cluster, is given up, and whoever started it stops it; one on a
   * device the new plan merely leaves idle stays, a spare the planner may use again.
   */
  setNeed(need: readonly number[], lost: readonly number[] = []): void {
    this.need = [...need];
    for (const device of [...this.members.keys()]) {
      if (this.need.includes(device)) continue;
      if (lost.includes(device)) this.lose(device, 'its device is lost for good', true);
      else if (!this.o.cluster?.includes(device)) this.lose(device, 'its device is no longer in the plan', true);
    }
  }

  /** The devices of the plan now. */
  get devices(): readonly number[] {
    return this.need;
  }

  /** The seal of the worker process that is `device` now, when it said one. */
  sealOf(device: number): string | undefined {
    return this.members.get(device)?.seal;
  }

  private join(hello: Hello): number | string {
    // Asking again (a slow reply, a retry) gets the same device back.
    const held = [...this.members].find(([, m]) => m.worker === hello.worker);
    if (held && (hello.device === undefined || hello.device === held[0])) return held[0];
    const free = this.need.filter((d) => !this.members.has(d) || this.members.get(d)!.worker === hello.worker);
    let refusal: string | undefined;
    if (this.gone.has(hello.worker)) refusal = `worker ${hello.worker} was given up; start a new one`;
    else if (hello.device !== undefined && !this.need.includes(hello.device) && !this.o.cluster?.includes(hello.device))
      refusal = this.o.cluster
        ? `device ${hello.device} is not a device of this run's cluster (devices ${this.o.cluster.join(', ')})`
        : `device ${hello.device} is not in this run's plan (devices ${this.need.join(', ')})`;
    else if (hello.device !== undefined && this.members.has(hello.device) && this.members.get(hello.device)!.worker !== hello.worker)
      refusal = `device ${hello.device} already has worker ${this.members.get(hello.device)!.worker}`;
    else if (hello.device === undefined && free.length === 0) refusal = `every device of this run (${this.need.join(', ')}) already has a worker`;
    if (refusal) {
      this.o.log(`refused worker ${hello.worker}: ${refusal}`);
      return refusal;
    }
    const device = hello.device ?? free[0]!;
    this.members.set(device, { worker: hello.worker, pid: hello.pid, host: hello.host, seal: hello.seal, backend: hello.backend, lastBeat: Date.now(), announced: false });
    this.o.log(
      `worker ${hello.worker} (pid ${hello.pid} on ${hello.host}, ${hello.backend}) is device ${device}${this.need.includes(device) ? '' : ' (beyond the plan: offered to the planner at the next iteration boundary)'}`,
    );
    return device;
  }

  private beat(beat: Heartbeat): void {
    if (this.gone.has(beat.worker)) return;
    let m = this.members.get(beat.device);
    if (!m && (this.need.includes(beat.device) || this.o.cluster?.includes(beat.device))) {
      // A worker this supervisor never welcomed (it took the run over): adopt it.
      m = { worker: beat.worker, pid: beat.pid, seal: beat.seal, backend: beat.backend ?? 'unknown', lastBeat: Date.now(), announced: false };
      this.members.set(beat.device, m);
      this.o.log(`adopted worker ${beat.worker} (pid ${beat.pid ?? '?'}) as device ${beat.device}`);
    }
    if (!m || m.worker !== beat.worker) return;
    m.lastBeat = Date.now();
    if (beat.warning !== undefined) {
      this.o.log(`worker ${beat.worker} (device ${beat.device}) warns: ${beat.warning}`);
      this.o.onWarning?.(beat.device, beat.worker, beat.warning);
    }
    if (beat.state === 'reconnected' && m.announced) this.o.onReconnected?.(beat.device, beat.worker);
    if (!m.announced) {
      m.announced = true;
      this.o.onJoined({ device: beat.device, worker: beat.worker, backend: m.backend });
    }
  }

  private check(): void {
    const now = Date.now();
    if (now < this.pausedUntil) return;
    for (const [device, m] of this.members) {
      if (now - m.lastBeat > this.o.heartbeatMs) this.lose(device, `no heartbeat for ${((now - m.lastBeat) / 1000).toFixed(1)} s: hung`, true);
    }
  }

  private lose(device: number, reason: string, kill: boolean): void {
    const m = this.members.get(device);
    if (!m) return;
    this.members.delete(device);
    this.gone.add(m.worker);
    this.o.log(`gave up device ${device} (worker ${m.worker}): ${reason}`);
    // Observers hear it; the launcher kills a hung process it started (a dead one is already gone).
    publishEvent(this.nc, this.subj, { type: 'lost', device, worker: m.worker, ...(kill && m.pid !== undefined ? { pid: m.pid } : {}), reason });
    if (m.announced) this.o.onLost({ device, worker: m.worker, reason });
  }
}

/** Whether a member's process is alive on this machine (the host its hello named is this one). */
function aliveHere(m: Member): boolean {
  if (m.pid === undefined || m.host !== hostname()) return false;
  try {
    process.kill(m.pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}
