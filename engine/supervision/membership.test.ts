import { hostname } from 'node:os';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { decode, encode } from '../../mesh/wire/messages/codec.ts';
import { MemoryBus } from '../../mesh/wire/bus/memory-bus.ts';
import { JoinReply, PROTOCOL_VERSION, RunEvent } from '../../mesh/wire/messages/protocol.ts';
import { subjects } from '../../mesh/wire/bus/subjects.ts';
import { Membership, type Joined, type Lost } from './membership.ts';

const v = PROTOCOL_VERSION;
const subj = subjects('t1');

/** A membership over an in-memory bus, and everything it says. */
function setup(need: readonly number[] = [0, 1], heartbeatMs = 60_000, cluster?: readonly number[]) {
  const bus = new MemoryBus();
  const joined: Joined[] = [];
  const lost: Lost[] = [];
  const logs: string[] = [];
  const rejected: string[] = [];
  const warnings: string[] = [];
  const events: RunEvent[] = [];
  bus.subscribe(subj.events, { callback: (_err, msg) => events.push(decode(msg.subject, msg.data, RunEvent)) });
  const membership = new Membership(bus, subj, 'run-1', need, {
    heartbeatMs,
    onJoined: (j) => joined.push(j),
    onLost: (l) => lost.push(l),
    log: (line) => logs.push(line),
    onRejected: (problem) => rejected.push(problem),
    onWarning: (device, worker, message) => warnings.push(`${device} ${worker}: ${message}`),
    ...(cluster ? { cluster } : {}),
  });
  const join = async (worker: string, pid: number, device?: number) => {
    const hello = { type: 'hello', v, worker, pid, host: 'h', backend: 'wasm', ...(device === undefined ? {} : { device }) };
    const reply = await bus.request(subj.join, encode(hello), { timeout: 1000 });
    return decode(reply.subject, reply.data, JoinReply);
  };
  const beat = async (device: number, worker: string, pid?: number, backend?: string) => {
    bus.publish(subj.heartbeat(device), encode({ type: 'heartbeat', v, device, worker, state: 'serving', at: Date.now(), ...(pid === undefined ? {} : { pid }), ...(backend ? { backend } : {}) }));
    await settle();
  };
  const exit = async (pid: number, code: number | null, signal: string | null, kind: 'worker' | 'supervisor' = 'worker', host?: string) => {
    bus.publish(subj.event('exit'), encode({ type: 'exit', v, kind, pid, code, signal, restart: true, ...(host === undefined ? {} : { host }) }));
    await settle();
  };
  const lostEvents = () => events.filter((e): e is Extract<RunEvent, { type: 'lost' }> => e.type === 'lost');
  return { bus, membership, joined, lost, logs, rejected, warnings, events, lostEvents, join, beat, exit };
}

/** Lets queued bus deliveries (microtasks) run, also under fake timers. */
async function settle(): Promise<void> {
  for (let i = 0; i < 20; i++) await Promise.resolve();
}

let open: Membership | undefined;
afterEach(() => {
  open?.close();
  open = undefined;
  vi.useRealTimers();
});

describe('Membership: joining', () => {
  it("on a device's own join subject, a hello is for that device only: an impostor asking for another, or for any, is refused", async () => {
    const m = setup([0, 1]);
    open = m.membership;
    const ask = async (subject: string, worker: string, device?: number) =>
      decode(
        subject,
        (await m.bus.request(subject, encode({ type: 'hello', v, worker, pid: 5, host: 'h', backend: 'wasm', ...(device === undefined ? {} : { device }) }), { timeout: 1000 })).data,
        JoinReply,
      );
    expect(await ask(subj.joinAs(0), 'impostor', 1)).toMatchObject({ type: 'error', code: 'invalid_state', message: `a hello on ${subj.joinAs(0)} is for device 0; this one asks for 1` });
    expect(await ask(subj.joinAs(0), 'impostor')).toMatchObject({ type: 'error', message: `a hello on ${subj.joinAs(0)} is for device 0; this one asks for any device` });
    expect(m.rejected.join('\n')).toMatch(/worker impostor: a hello on .*join\.0 is for device 0/);
    // Device 1's own subject, for device 1: welcome.
    expect(await ask(subj.joinAs(1), 'w1', 1)).toMatchObject({ type: 'welcome', device: 1 });
    expect(m.joined).toEqual([]);
  });

  it('ignores a hello whose reply subject is not an inbox: it gives no device, and writes nothing to the subject it named', async () => {
    const { bus, rejected, join } = setup();
    const written: string[] = [];
    bus.subscribe(subj.allResults, { callback: (_e, msg) => written.push(msg.subject) });
    const hello = { type: 'hello', v, worker: 'forger', pid: 9, host: 'h', backend: 'wasm' };
    bus.publish(subj.join, encode(hello), subj.results(0, 'rollout'));
    await settle();
    expect(written).toEqual([]);
    expect(rejected).toEqual([`a hello from forger whose reply subject "${subj.results(0, 'rollout')}" is not an inbox`]);
    // Device 0 is still free for a real worker.
    expect(await join('w0', 1)).toMatchObject({ type: 'welcome', device: 0 });
  });

  it('welcomes a worker to a free device and announces it at its first heartbeat only', async () => {
    const m = setup();
    open = m.membership;
    expect(await m.join('w1', 11)).toEqual({ type: 'welcome', v, device: 0, run: 'run-1' });
    // Welcomed, but not joined until it beats.
    await settle();
    expect(m.joined).toEqual([]);
    await m.beat(0, 'w1', 11);
    expect(m.joined).toEqual([{ device: 0, worker: 'w1', backend: 'wasm' }]);
    await m.beat(0, 'w1', 11);
    await m.beat(0, 'w1', 11);
    expect(m.joined).toHaveLength(1);
    expect(m.logs.some((l) => l.includes('worker w1 (pid 11 on h, wasm) is device 0'))).toBe(true);
    m.membership.close();
  });

  it('gives the next worker the next free device, or the one it asks for', async () => {
    const m = setup([0, 1, 2]);
    open = m.membership;
    expect(await m.join('w1', 11, 2)).toMatchObject({ type: 'welcome', device: 2 });
    expect(await m.join('w2', 12)).toMatchObject({ type: 'welcome', device: 0 });
    expect(await m.join('w3', 13)).toMatchObject({ type: 'welcome', device: 1 });
    await m.beat(1, 'w3', 13);
    await m.beat(2, 'w1', 11);
    expect(m.joined).toEqual([
      { device: 1, worker: 'w3', backend: 'wasm' },
      { device: 2, worker: 'w1', backend: 'wasm' },
    ]);
    m.membership.close();
  });

  it('gives a worker that asks again the device it already has', async () => {
    const m = setup([0, 1]);
    open = m.membership;
    expect(await m.join('w1', 11)).toMatchObject({ type: 'welcome', device: 0 });
    expect(await m.join('w1', 11)).toMatchObject({ type: 'welcome', device: 0 });
    expect(await m.join('w1', 11, 0)).toMatchObject({ type: 'welcome', device: 0 });
    expect(await m.join('w2', 12)).toMatchObject({ type: 'welcome', device: 1 });
    m.membership.close();
  });

  it('never gives one worker two devices, and announces a worker that asks again only once', async () => {
    const m = setup([0, 1]);
    open = m.membership;
    expect(await m.join('w1', 11, 1)).toMatchObject({ type: 'welcome', device: 1 });
    expect(await m.join('w1', 11)).toMatchObject({ type: 'welcome', device: 1 });
    await m.beat(1, 'w1', 11);
    expect(await m.join('w1', 11)).toMatchObject({ type: 'welcome', device: 1 });
    await m.beat(1, 'w1', 11);
    expect(m.joined).toHaveLength(1);
    expect(await m.join('w2', 12)).toMatchObject({ type: 'welcome', device: 0 });
  });

  it('ignores a heartbeat from another worker on a taken device', async () => {
    const m = setup([0]);
    open = m.membership;
    await m.join('w1', 11);
    await m.beat(0, 'intruder', 99);
    expect(m.joined).toEqual([]);
    await m.beat(0, 'w1', 11);
    expect(m.joined).toEqual([{ device: 0, worker: 'w1', backend: 'wasm' }]);
    m.membership.close();
  });
});

describe('Membership: refusals', () => {
  it('refuses a device that is not in the plan', async () => {
    const m = setup([0, 1]);
    open = m.membership;
    const reply = await m.join('w1', 11, 7);
    expect(reply).toMatchObject({ type: 'error', v, code: 'invalid_state', subject: subj.join });
    expect(reply.type === 'error' && reply.message).toBe("device 7 is not in this run's plan (devices 0, 1)");
    expect(m.logs).toContain("refused worker w1: device 7 is not in this run's plan (devices 0, 1)");
    // Nothing was taken.
    expect(await m.join('w2', 12)).toMatchObject({ type: 'welcome', device: 0 });
    m.membership.close();
  });

  it('refuses a device that another worker has', async () => {
    const m = setup([0, 1]);
    open = m.membership;
    await m.join('w1', 11, 1);
    const reply = await m.join('w2', 12, 1);
    expect(reply).toMatchObject({ type: 'error', code: 'invalid_state' });
    expect(reply.type === 'error' && reply.message).toBe('device 1 already has worker w1');
    m.membership.close();
  });

  it('refuses a worker when every device has one', async () => {
    const m = setup([3, 5]);
    open = m.membership;
    expect(await m.join('w1', 11)).toMatchObject({ type: 'welcome', device: 3 });
    expect(await m.join('w2', 12)).toMatchObject({ type: 'welcome', device: 5 });
    const reply = await m.join('w3', 13);
    expect(reply).toMatchObject({ type: 'error', code: 'invalid_state' });
    expect(reply.type === 'error' && reply.message).toBe('every device of this run (3, 5) already has a worker');
    m.membership.close();
  });

  it('answers a malformed hello with a malformed error and reports it', async () => {
    const m = setup();
    open = m.membership;
    const reply = await m.bus.request(subj.join, encode({ type: 'hello', v, worker: 'w1', host: 'h', backend: 'wasm' }), { timeout: 1000 });
    const answer = decode(reply.subject, reply.data, JoinReply);
    expect(answer).toMatchObject({ type: 'error', code: 'malformed', subject: subj.join });
    expect(answer.type === 'error' && answer.message).toMatch(/pid/);
    expect(m.rejected).toHaveLength(1);
    expect(m.rejected[0]).toMatch(/pid/);
    // The device is still free.
    expect(await m.join('w1', 11)).toMatchObject({ type: 'welcome', device: 0 });
    m.membership.close();
  });

  it('refuses a worker of another protocol version, naming both versions, and keeps the device free', async () => {
    const m = setup();
    open = m.membership;
    const older = v - 1;
    const reply = await m.bus.request(subj.join, encode({ type: 'hello', v: older, worker: 'old', pid: 12, host: 'h', backend: 'wasm' } as never), { timeout: 1000 });
    const answer = decode(reply.subject, reply.data, JoinReply);
    expect(answer).toMatchObject({ type: 'error', code: 'malformed' });
    expect(answer.type === 'error' && answer.message).toContain(`expected protocol version v=${v}, got ${older}`);
    expect(m.rejected).toHaveLength(1);
    expect(await m.join('w1', 11)).toMatchObject({ type: 'welcome', device: 0 });
    m.membership.close();
  });
});

describe('Membership: a worker whose process exits', () => {
  it('is lost, the run hears it, and its device goes to a new worker', async () => {
    const m = setup([0, 1]);
    open = m.membership;
    await m.join('w1', 11);
    await m.join('w2', 12);
    await m.beat(0, 'w1', 11);
    await m.beat(1, 'w2', 12);
    await m.exit(11, null, 'SIGKILL');
    expect(m.lost).toHaveLength(1);
    expect(m.lost[0]).toMatchObject({ device: 0, worker: 'w1' });
    expect(m.lost[0]!.reason).toContain('pid 11');
    expect(m.lost[0]!.reason).toContain('SIGKILL');
    const events = m.lostEvents();
    expect(events).toHaveLength(1);
    expect(events[0]).toMatchObject({ type: 'lost', v, device: 0, worker: 'w1', reason: m.lost[0]!.reason });
    // The process is already gone: nobody needs to kill it.
    expect(events[0]!.pid).toBeUndefined();

    // The old worker's late beats do not bring it back, nor may it join again.
    await m.beat(0, 'w1', 11);
    expect(m.joined.map((j) => j.worker)).toEqual(['w1', 'w2']);
    const again = await m.join('w1', 11);
    expect(again.type === 'error' && again.message).toBe('worker w1 was given up; start a new one');

    // A new worker takes the device.
    expect(await m.join('w3', 13)).toMatchObject({ type: 'welcome', device: 0 });
    await m.beat(0, 'w3', 13);
    expect(m.joined.at(-1)).toEqual({ device: 0, worker: 'w3', backend: 'wasm' });
    expect(m.lost).toHaveLength(1);
    m.membership.close();
  });

  it('matches an exit to a worker by machine and pid: a pid of another machine is not its process', async () => {
    const m = setup([0]);
    open = m.membership;
    // w1 runs on 'h' (setup's hellos say so); a launcher on another machine saw its own pid 11 exit.
    await m.join('w1', 11);
    await m.beat(0, 'w1', 11);
    await m.exit(11, null, 'SIGKILL', 'worker', 'elsewhere');
    expect(m.lost).toEqual([]);
    expect(m.logs.at(-1)).toBe("ignored an exit of pid 11 on elsewhere: device 0's worker w1 with that pid runs on h");
    // The launcher on w1's own machine: lost (this supervisor need not share that machine).
    await m.exit(11, null, 'SIGKILL', 'worker', 'h');
    expect(m.lost).toMatchObject([{ device: 0, worker: 'w1' }]);
    m.membership.close();
  });

  it('says how the process exited', async () => {
    const m = setup([0]);
    open = m.membership;
    await m.join('w1', 21);
    await m.beat(0, 'w1', 21);
    await m.exit(21, 3, null);
    expect(m.lost).toEqual([{ device: 0, worker: 'w1', reason: 'its process (pid 21) exited with code 3' }]);
    m.membership.close();
  });

  it("ignores exits of other processes and of the supervisor, and an exit on another event's subject", async () => {
    const m = setup([0]);
    open = m.membership;
    await m.join('w1', 11);
    await m.beat(0, 'w1', 11);
    await m.exit(12, null, 'SIGKILL');
    await m.exit(11, null, 'SIGKILL', 'supervisor');
    // The server lets only the launcher publish exits (mesh/wire/bus/auth.ts): one on the log subject is not one.
    m.bus.publish(subj.event('log'), encode({ type: 'exit', v, kind: 'worker', pid: 11, code: null, signal: 'SIGKILL', restart: true }));
    await settle();
    expect(m.lost).toEqual([]);
    expect(m.lostEvents()).toEqual([]);
    m.membership.close();
  });

  it('ignores an exit of a process this machine sees alive, whoever says so, and keeps each worker’s seal', async () => {
    const m = setup([0]);
    open = m.membership;
    // This test's own process: alive, on this host.
    const hello = { type: 'hello', v, worker: 'w1', pid: process.pid, host: hostname(), backend: 'wasm', seal: 's3al' };
    await m.bus.request(subj.join, encode(hello), { timeout: 1000 });
    await m.beat(0, 'w1', process.pid);
    await m.exit(process.pid, null, 'SIGKILL');
    expect(m.lost).toEqual([]);
    expect(m.logs.at(-1)).toBe(`ignored an exit of pid ${process.pid} (device 0, worker w1): that process is alive on this machine`);
    expect(m.membership.sealOf(0)).toBe('s3al');
    m.membership.close();
  });

  it('publishes lost but does not call onLost for a worker welcomed and never announced', async () => {
    const m = setup([0]);
    open = m.membership;
    await m.join('w1', 11);
    await m.exit(11, 1, null);
    expect(m.lost).toEqual([]);
    expect(m.lostEvents()).toMatchObject([{ device: 0, worker: 'w1' }]);
    expect(await m.join('w2', 12)).toMatchObject({ type: 'welcome', device: 0 });
    m.membership.close();
  });
});

describe('Membership: heartbeats', () => {
  it('gives up a silent worker and tells the launcher its pid', async () => {
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval', 'setTimeout', 'clearTimeout', 'Date'] });
    const m = setup([0, 1], 200);
    open = m.membership;
    await m.join('w1', 11);
    await m.join('w2', 12);
    await m.beat(0, 'w1', 11);
    await m.beat(1, 'w2', 12);
    // w2 keeps beating, w1 falls silent.
    for (let i = 0; i < 3; i++) {
      await vi.advanceTimersByTimeAsync(100);
      await m.beat(1, 'w2', 12);
    }
    expect(m.lost).toHaveLength(1);
    expect(m.lost[0]).toMatchObject({ device: 0, worker: 'w1' });
    expect(m.lost[0]!.reason).toMatch(/^no heartbeat for \d+\.\d s: hung$/);
    expect(m.lostEvents()).toEqual([{ type: 'lost', v, device: 0, worker: 'w1', pid: 11, reason: m.lost[0]!.reason }]);
    // Its late beats do not bring it back.
    await m.beat(0, 'w1', 11);
    expect(m.joined.map((j) => j.worker)).toEqual(['w1', 'w2']);
    m.membership.close();
  });

  it("says what a worker warns on its heartbeat (a worker may not publish events), and only its own device's worker", async () => {
    const m = setup([0]);
    open = m.membership;
    await m.join('w1', 11);
    await m.beat(0, 'w1', 11);
    const warn = (device: number, worker: string) =>
      m.bus.publish(subj.heartbeat(device), encode({ type: 'heartbeat', v, device, worker, state: 'serving', at: Date.now(), warning: 'rejected bad message on x' }));
    warn(0, 'w1');
    warn(0, 'w9');
    await settle();
    expect(m.warnings).toEqual(['0 w1: rejected bad message on x']);
    m.membership.close();
  });

  it('keeps a worker that beats within the limit', async () => {
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval', 'setTimeout', 'clearTimeout', 'Date'] });
    const m = setup([0], 200);
    open = m.membership;
    await m.join('w1', 11);
    for (let i = 0; i < 10; i++) {
      await m.beat(0, 'w1', 11);
      await vi.advanceTimersByTimeAsync(150);
    }
    expect(m.lost).toEqual([]);
    expect(m.lostEvents()).toEqual([]);
    m.membership.close();
  });

  it('gives up a welcomed worker that never beats, with its pid, without announcing it', async () => {
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval', 'setTimeout', 'clearTimeout', 'Date'] });
    const m = setup([0], 200);
    open = m.membership;
    await m.join('w1', 11);
    await vi.advanceTimersByTimeAsync(400);
    expect(m.lost).toEqual([]);
    expect(m.lostEvents()).toMatchObject([{ device: 0, worker: 'w1', pid: 11 }]);
    m.membership.close();
  });

  it('counts no silence during a pause', async () => {
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval', 'setTimeout', 'clearTimeout', 'Date'] });
    const m = setup([0], 200);
    open = m.membership;
    await m.join('w1', 11);
    await m.beat(0, 'w1', 11);
    m.membership.pause(1_000);
    await vi.advanceTimersByTimeAsync(1_100);
    expect(m.lost).toEqual([]);
    // After the pause, the usual limit applies from its end.
    await vi.advanceTimersByTimeAsync(300);
    expect(m.lost).toHaveLength(1);
    expect(m.lost[0]!.reason).toContain('no heartbeat');
    m.membership.close();
  });

  it('gives up silent workers with real timers too', async () => {
    const m = setup([0], 120);
    open = m.membership;
    await m.join('w1', 11);
    await m.beat(0, 'w1', 11);
    await new Promise((r) => setTimeout(r, 400));
    expect(m.lost).toHaveLength(1);
    expect(m.lost[0]!.reason).toContain('no heartbeat');
    expect(m.lostEvents()[0]).toMatchObject({ device: 0, worker: 'w1', pid: 11 });
    m.membership.close();
  });
});

describe('Membership: adoption', () => {
  it('adopts a beating worker it never welcomed, on a free device of the plan', async () => {
    const m = setup([0, 1]);
    open = m.membership;
    await m.beat(1, 'w9', 99, 'cpu');
    expect(m.joined).toEqual([{ device: 1, worker: 'w9', backend: 'cpu' }]);
    expect(m.logs.some((l) => l.includes('adopted worker w9 (pid 99) as device 1'))).toBe(true);
    await m.beat(1, 'w9', 99, 'cpu');
    expect(m.joined).toHaveLength(1);
    // The device is taken now; its process's exit is noticed.
    const reply = await m.join('w2', 12, 1);
    expect(reply.type === 'error' && reply.message).toBe('device 1 already has worker w9');
    await m.exit(99, null, 'SIGKILL');
    expect(m.lost).toEqual([{ device: 1, worker: 'w9', reason: 'its process (pid 99) killed by SIGKILL' }]);
    m.membership.close();
  });

  it('adopts with an unknown backend when the beat names none', async () => {
    const m = setup([0]);
    open = m.membership;
    await m.beat(0, 'w9');
    expect(m.joined).toEqual([{ device: 0, worker: 'w9', backend: 'unknown' }]);
    expect(m.logs.some((l) => l.includes('adopted worker w9 (pid ?) as device 0'))).toBe(true);
    m.membership.close();
  });

  it('does not adopt a worker for a device outside the plan', async () => {
    const m = setup([0, 1]);
    open = m.membership;
    await m.beat(4, 'w9', 99);
    expect(m.joined).toEqual([]);
    expect(await m.join('w1', 11)).toMatchObject({ type: 'welcome', device: 0 });
    m.membership.close();
  });

  it('does not adopt a worker it gave up', async () => {
    const m = setup([0]);
    open = m.membership;
    await m.join('w1', 11);
    await m.beat(0, 'w1', 11);
    await m.exit(11, null, 'SIGKILL');
    await m.beat(0, 'w1', 11);
    expect(m.joined).toHaveLength(1);
    expect(await m.join('w2', 12)).toMatchObject({ type: 'welcome', device: 0 });
    m.membership.close();
  });
});

describe('Membership: close', () => {
  it('stops listening and stops its timer', async () => {
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval', 'setTimeout', 'clearTimeout', 'Date'] });
    const m = setup([0], 200);
    expect(vi.getTimerCount()).toBe(1);
    await m.join('w1', 11);
    m.membership.close();
    expect(vi.getTimerCount()).toBe(0);
    await m.beat(0, 'w1', 11);
    expect(m.joined).toEqual([]);
    await expect(m.join('w2', 12)).rejects.toThrow(/no responders/);
    await vi.advanceTimersByTimeAsync(1_000);
    expect(m.lostEvents()).toEqual([]);
  });
});

describe('Membership of an elastic run: workers beyond the plan', () => {
  it('welcomes a worker for a device of the cluster the plan does not use, and refuses one outside the cluster, naming it', async () => {
    const m = setup([0, 1], 60_000, [0, 1, 2, 3]);
    open = m.membership;
    expect(await m.join('w3', 13, 3)).toMatchObject({ type: 'welcome', device: 3 });
    expect(m.logs.join('\n')).toMatch(/is device 3 \(beyond the plan: offered to the planner at the next iteration boundary\)/);
    await m.beat(3, 'w3', 13);
    expect(m.joined).toEqual([{ device: 3, worker: 'w3', backend: 'wasm' }]);
    expect(await m.join('w9', 19, 9)).toMatchObject({ type: 'error', message: "device 9 is not a device of this run's cluster (devices 0, 1, 2, 3)" });
    // A worker that asks for any device still gets one of the plan's.
    expect(await m.join('w0', 10)).toMatchObject({ type: 'welcome', device: 0 });
  });

  it('on a new plan, stops the worker of a device lost for good and keeps one the plan leaves idle as a spare', async () => {
    const m = setup([0, 1, 2], 60_000, [0, 1, 2, 3]);
    open = m.membership;
    for (const d of [0, 1, 2]) {
      await m.join(`w${d}`, 10 + d, d);
      await m.beat(d, `w${d}`, 10 + d);
    }
    m.membership.setNeed([0], [2]);
    await settle();
    expect(m.membership.devices).toEqual([0]);
    // Device 2 is lost for good: given up, and its pid goes to whoever started it. Device 1 stays, unused.
    expect(m.lostEvents().map((e) => [e.device, e.pid, e.reason])).toEqual([[2, 12, 'its device is lost for good']]);
    expect(m.lost.map((l) => l.device)).toEqual([2]);
    expect(await m.join('other', 99, 1)).toMatchObject({ type: 'error', message: 'device 1 already has worker w1' });
  });
});
