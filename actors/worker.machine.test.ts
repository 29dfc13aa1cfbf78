import { describe, it, expect, vi, beforeAll } from 'vitest';
import { createActor, fromCallback, fromPromise, waitFor } from 'xstate';
import { initBackend } from '../engine/model/backend/backend.ts';
import { Device } from '../engine/device/device.ts';
import { MemoryBus } from '../mesh/wire/bus/memory-bus.ts';
import { subjects } from '../mesh/wire/bus/subjects.ts';
import { ProtocolError } from '../mesh/wire/messages/codec.ts';
import { PROTOCOL_VERSION, type Call, type CallBody, type Reply } from '../mesh/wire/messages/protocol.ts';
import { workerMachine, type Respond } from './worker.machine.ts';

const noLink = [new MemoryBus(), subjects('unit')] as const;

/** A real device whose calls can be held open, and that counts what it ran. */
class TestDevice extends Device {
  readonly runs: Call[] = [];
  hold = false;
  held: { call: Call; release: () => void; fail: (e: unknown) => void } | undefined;
  override async run(call: Call): Promise<Record<string, unknown>> {
    this.runs.push(call);
    if (this.hold) {
      await new Promise<void>((release, fail) => {
        this.held = { call, release, fail };
      });
    }
    return super.run(call);
  }
}

const machine = workerMachine.provide({
  actors: {
    join: fromPromise(async () => 0),
    callListener: fromCallback(() => () => {}),
    heartbeat: fromCallback(() => () => {}),
  },
});

async function startWorker() {
  let device: TestDevice | undefined;
  const log = vi.fn<(line: string) => void>();
  const actor = createActor(machine, {
    input: {
      worker: 'w-test',
      log,
      makeDevice: (index) => (device = new TestDevice(index, ...noLink)),
    },
  });
  actor.start();
  await waitFor(actor, (s) => s.matches({ serving: { main: 'idle' } }), { timeout: 5000 });
  return { actor, device: device!, log };
}

let seq = 0;
const call = (model: string, body: CallBody, id = `call-${seq++}`): Call => ({ type: 'call', v: PROTOCOL_VERSION, id, model, iteration: 0, body });
const loadBody: CallBody = {
  fn: 'load',
  role: 'actor',
  spec: { kind: 'policy', vocab: 5, context: 6, layers: 1, width: 8, heads: 2 },
  layout: { devices: [0], dp: 1, tp: 1, pp: 1 },
  rank: 0,
  seed: 1,
};
const respondSpy = () => vi.fn<Respond>();
const idle = (a: ReturnType<typeof createActor<typeof machine>>) => waitFor(a, (s) => s.matches({ serving: { main: 'idle' } }), { timeout: 5000 });

beforeAll(async () => {
  await initBackend('cpu');
});

describe('worker machine', () => {
  it('joins, builds its device with the index it was given, and serves', async () => {
    const { actor, device } = await startWorker();
    expect(device).toBeInstanceOf(Device);
    expect(device.index).toBe(0);
    expect(actor.getSnapshot().context.index).toBe(0);
    actor.stop();
  });

  it('a call on a model not loaded gets not_loaded, runs nothing, and the worker stays idle', async () => {
    const { actor, device, log } = await startWorker();
    const respond = respondSpy();
    actor.send({ type: 'call', call: call('actor', { fn: 'manifest' }, 'm-1'), respond });
    expect(respond).toHaveBeenCalledTimes(1);
    const reply = respond.mock.calls[0]![0];
    expect(reply).toMatchObject({ type: 'error', v: PROTOCOL_VERSION, id: 'm-1', code: 'not_loaded' });
    expect(reply.type === 'error' && reply.message).toContain("holds no shard of 'actor'");
    expect(actor.getSnapshot().matches({ serving: { main: 'idle' } })).toBe(true);
    expect(device.runs).toHaveLength(0);
    expect(log).toHaveBeenCalledWith(expect.stringContaining('refused call m-1 (manifest of actor)'));
    actor.stop();
  });

  it('a load call gets a result with the parameter count and digest', async () => {
    const { actor } = await startWorker();
    const respond = respondSpy();
    actor.send({ type: 'call', call: call('actor', loadBody, 'load-1'), respond });
    expect(actor.getSnapshot().matches({ serving: { main: 'busy' } })).toBe(true);
    await idle(actor);
    expect(respond).toHaveBeenCalledTimes(1);
    const reply = respond.mock.calls[0]![0];
    expect(reply).toMatchObject({ type: 'result', v: PROTOCOL_VERSION, id: 'load-1', body: { parameters: 1021 } });
    expect(reply.type === 'result' && reply.body.digest).toMatch(/^blake3:[0-9a-f]{64}$/);
    actor.stop();
  });

  it('while a call runs, a call with another id gets busy; the running call still gets its result', async () => {
    const { actor, device } = await startWorker();
    device.hold = true;
    const first = respondSpy();
    actor.send({ type: 'call', call: call('actor', loadBody, 'slow'), respond: first });
    await vi.waitFor(() => expect(device.held).toBeDefined());
    expect(actor.getSnapshot().matches({ serving: { main: 'busy' } })).toBe(true);

    const second = respondSpy();
    actor.send({ type: 'call', call: call('actor', { fn: 'manifest' }, 'other'), respond: second });
    expect(second).toHaveBeenCalledTimes(1);
    expect(second.mock.calls[0]![0]).toEqual({
      type: 'error',
      v: PROTOCOL_VERSION,
      id: 'other',
      code: 'busy',
      message: 'device 0 is running call slow (load of actor)',
    });
    expect(first).not.toHaveBeenCalled();
    expect(actor.getSnapshot().matches({ serving: { main: 'busy' } })).toBe(true);

    device.held!.release();
    await idle(actor);
    expect(first).toHaveBeenCalledTimes(1);
    expect(first.mock.calls[0]![0]).toMatchObject({ type: 'result', id: 'slow' });
    expect(device.runs.map((c) => c.id)).toEqual(['slow']);
    actor.stop();
  });

  it('a call marked beside runs next to the running one when neither changes what the other touches; one that would is refused, named', async () => {
    const { actor, device } = await startWorker();
    const loaded = respondSpy();
    actor.send({ type: 'call', call: call('actor', loadBody), respond: loaded });
    await idle(actor);
    // The running call reads 'actor' (a generation on the view of the last version, in a run).
    device.hold = true;
    const reading = respondSpy();
    actor.send({ type: 'call', call: call('actor', { fn: 'manifest' }, 'reading'), respond: reading });
    await vi.waitFor(() => expect(device.held?.call.id).toBe('reading'));
    const readingHeld = device.held!;
    device.hold = false;

    // The next version's view loads beside it, and is answered while the first still runs.
    const next = respondSpy();
    actor.send({ type: 'call', call: { ...call('actor~1', loadBody, 'next'), beside: true }, respond: next });
    await vi.waitFor(() => expect(next).toHaveBeenCalledTimes(1));
    expect(next.mock.calls[0]![0]).toMatchObject({ type: 'result', id: 'next' });
    expect(reading).not.toHaveBeenCalled();
    expect(device.models().sort()).toEqual(['actor', 'actor~1']);

    // Releasing the model the running call reads cannot run beside it.
    const release = respondSpy();
    actor.send({ type: 'call', call: { ...call('actor', { fn: 'release' }, 'release'), beside: true }, respond: release });
    expect(release.mock.calls[0]![0]).toMatchObject({ type: 'error', id: 'release', code: 'busy' });
    expect(release.mock.calls[0]![0].type === 'error' && release.mock.calls[0]![0].message).toContain("both touch 'actor', and one changes it");
    // A call not marked beside is busy as ever; so is a call beside that may not run beside anything.
    const plain = respondSpy();
    actor.send({ type: 'call', call: call('actor~1', { fn: 'manifest' }, 'plain'), respond: plain });
    expect(plain.mock.calls[0]![0]).toMatchObject({ code: 'busy' });
    const train = respondSpy();
    actor.send({ type: 'call', call: { ...call('actor~1', { fn: 'weights' }, 'not-beside-kind'), beside: true }, respond: train });
    expect(train.mock.calls[0]![0]).toMatchObject({ code: 'unsupported' });
    expect(train.mock.calls[0]![0].type === 'error' && train.mock.calls[0]![0].message).toContain("'weights' cannot run beside another call");

    readingHeld.release();
    await idle(actor);
    expect(reading.mock.calls[0]![0]).toMatchObject({ type: 'result', id: 'reading' });
    expect(device.models()).toEqual(['actor', 'actor~1']);
    actor.stop();
  });

  it('a call marked beside that may not run beside anything is refused even on an idle worker, and runs nothing', async () => {
    const { actor, device } = await startWorker();
    const respond = respondSpy();
    actor.send({ type: 'call', call: { ...call('actor', { fn: 'shutdown' }, 'odd'), beside: true }, respond });
    expect(respond.mock.calls[0]![0]).toMatchObject({ type: 'error', id: 'odd', code: 'unsupported' });
    expect(device.runs).toHaveLength(0);
    expect(actor.getSnapshot().matches({ serving: { main: 'idle', side: 'idle' } })).toBe(true);
    actor.stop();
  });

  it('a reset abandons the call beside too: both askers hear interrupted', async () => {
    const { actor, device } = await startWorker();
    actor.send({ type: 'call', call: call('actor', loadBody), respond: respondSpy() });
    await idle(actor);
    device.hold = true;
    const main = respondSpy();
    actor.send({ type: 'call', call: call('actor', { fn: 'manifest' }, 'main'), respond: main });
    await vi.waitFor(() => expect(device.held?.call.id).toBe('main'));
    const side = respondSpy();
    actor.send({ type: 'call', call: { ...call('actor~1', loadBody, 'side'), beside: true }, respond: side });
    await vi.waitFor(() => expect(device.held?.call.id).toBe('side'));
    expect(actor.getSnapshot().matches({ serving: { main: 'busy', side: 'busy' } })).toBe(true);
    const reset = respondSpy();
    actor.send({ type: 'call', call: call('*', { fn: 'reset', epoch: 1 }), respond: reset });
    expect(main.mock.calls[0]![0]).toMatchObject({ type: 'error', id: 'main', code: 'interrupted' });
    expect(side.mock.calls[0]![0]).toMatchObject({ type: 'error', id: 'side', code: 'interrupted' });
    expect(reset.mock.calls[0]![0]).toMatchObject({ type: 'result' });
    expect(actor.getSnapshot().matches({ serving: { main: 'idle', side: 'idle' } })).toBe(true);
    actor.stop();
  });

  it('the same id again after completion gets the same reply object without running again', async () => {
    const { actor, device } = await startWorker();
    const first = respondSpy();
    const c = call('actor', loadBody, 'once');
    actor.send({ type: 'call', call: c, respond: first });
    await idle(actor);
    const reply: Reply = first.mock.calls[0]![0];

    const again = respondSpy();
    actor.send({ type: 'call', call: { ...c }, respond: again });
    expect(again).toHaveBeenCalledTimes(1);
    expect(again.mock.calls[0]![0]).toBe(reply);
    expect(actor.getSnapshot().matches({ serving: { main: 'idle' } })).toBe(true);
    expect(device.runs).toHaveLength(1);
    actor.stop();
  });

  it('an answered id is answered again even while another call runs', async () => {
    const { actor, device } = await startWorker();
    const c = call('actor', loadBody, 'done-1');
    const first = respondSpy();
    actor.send({ type: 'call', call: c, respond: first });
    await idle(actor);
    device.hold = true;
    actor.send({ type: 'call', call: call('actor', { fn: 'manifest' }, 'running'), respond: respondSpy() });
    await vi.waitFor(() => expect(device.held).toBeDefined());
    const again = respondSpy();
    actor.send({ type: 'call', call: c, respond: again });
    expect(again.mock.calls[0]![0]).toBe(first.mock.calls[0]![0]);
    device.held!.release();
    await idle(actor);
    actor.stop();
  });

  it('remembers the last 64 replies: the oldest id is forgotten and would run again', async () => {
    const { actor, device } = await startWorker();
    actor.send({ type: 'call', call: call('actor', loadBody, 'r-load'), respond: respondSpy() });
    await idle(actor);
    // 'r-load' plus 64 manifest calls: 65 answers, so 'r-load' (the oldest) is dropped
    for (let i = 0; i < 64; i++) {
      actor.send({ type: 'call', call: call('actor', { fn: 'manifest' }, `r-${i}`), respond: respondSpy() });
      await idle(actor);
    }
    expect(actor.getSnapshot().context.answered.size).toBe(64);
    expect(actor.getSnapshot().context.answered.has('r-load')).toBe(false);
    const runs = device.runs.length;
    actor.send({ type: 'call', call: call('actor', { fn: 'manifest' }, 'r-0'), respond: respondSpy() });
    expect(device.runs.length).toBe(runs); // still remembered
    actor.stop();
  });

  it('a call that fails while running gets a typed error and the worker serves on', async () => {
    const { actor } = await startWorker();
    const respond = respondSpy();
    // check() lets load through; the device refuses a layout that does not fit when it runs it
    const twoDevices = { ...loadBody, layout: { devices: [0, 1, 2, 3], dp: 1, tp: 4, pp: 1 } } as CallBody;
    actor.send({ type: 'call', call: call('actor', twoDevices, 'bad-load'), respond });
    await idle(actor);
    expect(respond.mock.calls[0]![0]).toMatchObject({ type: 'error', id: 'bad-load', code: 'unsupported' });
    const reply = respond.mock.calls[0]![0];
    expect(reply.type === 'error' && reply.message).toMatch(/^CallRejected: layout dp=1 tp=4 pp=1 does not fit the model/);

    // an error that is not a refusal is 'failed'
    const device = actor.getSnapshot().context.device as TestDevice;
    device.hold = true;
    const failing = respondSpy();
    actor.send({ type: 'call', call: call('actor', loadBody, 'boom'), respond: failing });
    await vi.waitFor(() => expect(device.held).toBeDefined());
    device.held!.fail(new Error('out of memory'));
    await idle(actor);
    expect(failing.mock.calls[0]![0]).toEqual({ type: 'error', v: PROTOCOL_VERSION, id: 'boom', code: 'failed', message: 'Error: out of memory' });
    actor.stop();
  });

  it('a malformed message is reported via respond with code malformed, and the worker keeps serving', async () => {
    const { actor, log } = await startWorker();
    const respond = respondSpy();
    const error = new ProtocolError('ferry.r.dev.0.call', 'not msgpack (3 bytes): boom');
    actor.send({ type: 'malformed', error, respond });
    expect(respond).toHaveBeenCalledTimes(1);
    expect(respond.mock.calls[0]![0]).toEqual({
      type: 'error',
      v: PROTOCOL_VERSION,
      code: 'malformed',
      message: 'not msgpack (3 bytes): boom',
      subject: 'ferry.r.dev.0.call',
    });
    expect(log).toHaveBeenCalledWith(`rejected: ${error.message}`);
    expect(actor.getSnapshot().matches({ serving: { main: 'idle' } })).toBe(true);
    // without a reply subject there is no one to answer; it is only logged
    actor.send({ type: 'malformed', error });
    expect(actor.getSnapshot().matches({ serving: { main: 'idle' } })).toBe(true);
    // and calls still work
    const ok = respondSpy();
    actor.send({ type: 'call', call: call('actor', loadBody), respond: ok });
    await idle(actor);
    expect(ok.mock.calls[0]![0].type).toBe('result');
    actor.stop();
  });

  it('a malformed message while busy is reported and the running call goes on', async () => {
    const { actor, device } = await startWorker();
    device.hold = true;
    const first = respondSpy();
    actor.send({ type: 'call', call: call('actor', loadBody, 'long'), respond: first });
    await vi.waitFor(() => expect(device.held).toBeDefined());
    const respond = respondSpy();
    actor.send({ type: 'malformed', error: new ProtocolError('s', 'p'), respond });
    expect(respond.mock.calls[0]![0]).toMatchObject({ code: 'malformed' });
    expect(actor.getSnapshot().matches({ serving: { main: 'busy' } })).toBe(true);
    device.held!.release();
    await idle(actor);
    expect(first.mock.calls[0]![0]).toMatchObject({ type: 'result', id: 'long' });
    actor.stop();
  });

  it('a reset preempts the running call: its askers hear interrupted, shards and remembered answers go', async () => {
    const { actor, device } = await startWorker();
    const loaded = respondSpy();
    const loadCall = call('actor', loadBody);
    actor.send({ type: 'call', call: loadCall, respond: loaded });
    await idle(actor);
    expect(loaded.mock.calls[0]![0]).toMatchObject({ type: 'result' });
    expect(device.models()).toEqual(['actor']);

    device.hold = true;
    const running = respondSpy();
    const manifest = call('actor', { fn: 'manifest' });
    actor.send({ type: 'call', call: manifest, respond: running });
    await waitFor(actor, (s) => s.matches({ serving: { main: 'busy' } }), { timeout: 5000 });
    const reset = respondSpy();
    actor.send({ type: 'call', call: call('*', { fn: 'reset', epoch: 3 }), respond: reset });
    await idle(actor);
    expect(running).toHaveBeenCalledTimes(1);
    expect(running.mock.calls[0]![0]).toMatchObject({ type: 'error', id: manifest.id, code: 'interrupted' });
    expect(reset.mock.calls[0]![0]).toMatchObject({ type: 'result', body: { dropped: ['actor'], interrupted: manifest.id } });
    expect(device.models()).toEqual([]);

    // The abandoned call finishing later answers no one and changes nothing.
    device.hold = false;
    device.held!.release();
    await new Promise((r) => setTimeout(r, 50));
    expect(running).toHaveBeenCalledTimes(1);
    expect(actor.getSnapshot().matches({ serving: { main: 'idle' } })).toBe(true);

    // The load answered before the reset is not answered from memory: it runs again.
    const again = respondSpy();
    const runsBefore = device.runs.length;
    actor.send({ type: 'call', call: loadCall, respond: again });
    await idle(actor);
    expect(device.runs.length).toBe(runsBefore + 1);
    expect(device.models()).toEqual(['actor']);
    actor.stop();
  });

  it('after a reset for epoch 3, a call of epoch 2 is refused as interrupted and changes nothing; one of epoch 3 runs', async () => {
    const { actor, device } = await startWorker();
    const reset = respondSpy();
    actor.send({ type: 'call', call: call('*', { fn: 'reset', epoch: 3 }), respond: reset });
    await idle(actor);
    const stale = respondSpy();
    actor.send({ type: 'call', call: { ...call('actor', loadBody), epoch: 2 }, respond: stale });
    await idle(actor);
    expect(stale.mock.calls[0]![0]).toMatchObject({ type: 'error', code: 'interrupted' });
    expect((stale.mock.calls[0]![0] as { message: string }).message).toMatch(/belongs to epoch 2; device 0 was reset for epoch 3/);
    expect(device.models()).toEqual([]);
    const current = respondSpy();
    actor.send({ type: 'call', call: { ...call('actor', loadBody), epoch: 3 }, respond: current });
    await idle(actor);
    expect(current.mock.calls[0]![0]).toMatchObject({ type: 'result' });
    expect(device.models()).toEqual(['actor']);
    actor.stop();
  });

  it('a shutdown call is answered and ends in the final stopped state', async () => {
    const { actor } = await startWorker();
    const respond = respondSpy();
    actor.send({ type: 'call', call: call('any', { fn: 'shutdown' }, 'bye'), respond });
    await waitFor(actor, (s) => s.status === 'done', { timeout: 5000 });
    const snap = actor.getSnapshot();
    expect(snap.value).toBe('stopped');
    expect(snap.output).toEqual({ error: undefined });
    expect(respond).toHaveBeenCalledWith({ type: 'result', v: PROTOCOL_VERSION, id: 'bye', body: {}, ms: expect.any(Number) });
  });

  it('a stop event ends in stopped too', async () => {
    const { actor } = await startWorker();
    actor.send({ type: 'stop' });
    expect(actor.getSnapshot().value).toBe('stopped');
    expect(actor.getSnapshot().status).toBe('done');
  });

  it('a failed join ends in failed, with the reason as output', async () => {
    const failing = workerMachine.provide({
      actors: {
        join: fromPromise<number, { worker: string }>(async () => {
          throw new Error('no supervisor');
        }),
        callListener: fromCallback(() => () => {}),
        heartbeat: fromCallback(() => () => {}),
      },
    });
    const makeDevice = vi.fn((index: number) => new Device(index, ...noLink));
    const actor = createActor(failing, { input: { worker: 'w', log: () => {}, makeDevice } });
    actor.start();
    await waitFor(actor, (s) => s.status === 'done', { timeout: 5000 });
    expect(actor.getSnapshot().value).toBe('failed');
    expect(actor.getSnapshot().output).toEqual({ error: 'could not join: no supervisor' });
    expect(makeDevice).not.toHaveBeenCalled();
  });
});
