// The device side of in-flight weight updates: a running continuous generation is asked to switch,
// stops before its next pass and names it, and goes on with the new version only once the decision
// comes back; a replay's generation stops before its planned passes until each decision comes.
// Devices in this process over a memory bus (one machine's unit test); whole runs over a real
// nats-server are test/inflight-run.test.ts.
import { beforeAll, describe, expect, it } from 'vitest';
import { initBackend } from '../model/index.ts';
import { PROTOCOL_VERSION, type Call, type CallBody, type Layout } from '../../mesh/wire/index.ts';
import { mesh } from '../../test/in-memory-mesh.ts';
import { Switchboard } from './inflight.ts';

describe('Switchboard', () => {
  const rank = async () => ({}) as never;
  it('asked: stops before the next pass, names it, and goes on once the decision comes', async () => {
    const board = new Switchboard();
    const gate = board.open({ iteration: 3, model: 'v' }, { version: 2, kv: 'keep', rankOf: rank });
    expect(gate.at(0)).toBeUndefined();
    const asked = board.ask({ iteration: 3, model: 'v' }, 'v~1', 3);
    const held = gate.at(1) as Promise<{ version: number }>;
    expect(await asked).toBe(1);
    let went = false;
    void held.then(() => (went = true));
    await new Promise((r) => setTimeout(r, 10));
    expect(went).toBe(false);
    board.decide({ iteration: 3, model: 'v' }, 'v~1', 3, 1);
    expect((await held).version).toBe(3);
    gate.close();
  });

  it('a decision before its generation, or before its pass, waits for it; none runs: no step; a reset fails the stopped one', async () => {
    const board = new Switchboard();
    board.decide({ iteration: 1, model: 'v' }, 'v~1', 5, 2);
    const gate = board.open({ iteration: 1, model: 'v' }, { version: 4, kv: 'recompute', planned: [{ step: 2, version: 5 }], rankOf: rank });
    expect(gate.at(0)).toBeUndefined();
    expect(gate.at(1)).toBeUndefined();
    expect((gate.at(2) as { version: number }).version).toBe(5);
    gate.close();
    expect(await board.ask({ iteration: 1, model: 'v' }, 'v~1', 5)).toBeUndefined();
    const other = board.open({ iteration: 2, model: 'v' }, { version: 4, kv: 'keep', planned: [{ step: 0, version: 5 }], rankOf: rank });
    const stopped = other.at(0) as Promise<unknown>;
    board.clear('device 0 was reset');
    await expect(stopped).rejects.toThrow('device 0 was reset');
  });
});

describe('in-flight weight updates on devices', () => {
  beforeAll(async () => {
    await initBackend('wasm');
  });

  const spec = { kind: 'policy' as const, vocab: 11, context: 44, layers: 2, width: 16, heads: 4 };
  const layout: Layout = { devices: [0, 1], dp: 2, tp: 1, pp: 1 };
  const [N, P, R] = [8, 4, 40];
  const prompts = Int32Array.from({ length: N * P }, (_, i) => 1 + ((i * 5 + 1) % 10));
  const seeds = Uint32Array.from({ length: N }, (_, i) => 900 + i);
  const generate = (inflight: Extract<CallBody, { fn: 'generate' }>['inflight']): CallBody => ({
    fn: 'generate',
    prompts,
    batch: N,
    promptLen: P,
    responseLen: R,
    seeds,
    temperature: 1,
    eos: 2,
    slots: 2,
    inflight,
  });
  let seq = 0;
  /** One device's part of a call; `group`: the call's, shared by the ranks of a layout that exchange sums. */
  const call = (device: ReturnType<typeof mesh>['devices'][number], model: string, body: CallBody, beside = false, group?: string) =>
    device.run({ type: 'call', v: PROTOCOL_VERSION, id: `s${seq++}`, model, iteration: 7, body, ...(beside ? { beside } : {}), ...(group ? { group } : {}) } satisfies Call);

  it('a switch asked mid-call is taken at the pass the device names, and the same decisions replayed make the same rows', async () => {
    const m = mesh(layout);
    await m.run('gen', (rank) => ({ fn: 'load', role: 'actor', spec, layout, rank, seed: 5 }));
    await m.run('gen~1', (rank) => ({ fn: 'load', role: 'actor', spec, layout, rank, seed: 6 }));
    const first = Promise.all(m.devices.map((d) => call(d, 'gen', generate({ version: 4, kv: 'keep' }))));
    await new Promise((r) => setTimeout(r, 30));
    const switchBody = { fn: 'switch' as const, generation: { iteration: 7, model: 'gen' }, version: 5 };
    const steps = (await Promise.all(m.devices.map((d) => call(d, 'gen~1', switchBody, true)))).map((x) => (x as { step?: number }).step);
    for (const s of steps) expect(s).toBeGreaterThan(0);
    await Promise.all(m.devices.map((d, i) => call(d, 'gen~1', { ...switchBody, at: steps[i]! }, true)));
    const outs = (await first) as Array<{ tokens: Int32Array; logprobs: Float32Array; versions: Int32Array; switches: Array<Array<{ step: number; version: number }>> }>;
    outs.forEach((o, i) => expect(o.switches).toEqual([[{ step: steps[i], version: 5 }]]));
    const versions = m.gather<Int32Array>(outs, 'versions');
    expect(versions.includes(4) && versions.includes(5)).toBe(true);
    // Nothing runs now: asked again, no device names a pass.
    expect(await Promise.all(m.devices.map((d) => call(d, 'gen~1', switchBody, true)))).toEqual([{}, {}]);

    // A replay: the decisions known before, the new version said to be there a while after the call starts.
    const replay = Promise.all(m.devices.map((d) => call(d, 'gen', generate({ version: 4, kv: 'keep', switches: [{ version: 5, steps: steps.map((s) => s!) }] }))));
    await new Promise((r) => setTimeout(r, 100));
    await Promise.all(m.devices.map((d, i) => call(d, 'gen~1', { ...switchBody, at: steps[i]! }, true)));
    const again = (await replay) as typeof outs;
    for (const key of ['tokens', 'logprobs', 'versions']) expect(Array.from(m.gather(again, key))).toEqual(Array.from(m.gather(outs, key)));
  }, 30_000);

  it('tp = 2: the tensor ranks of a replica stop before the same pass, asked at once or not, and the same decisions replayed make the same rows', async () => {
    const tp: Layout = { devices: [0, 1], dp: 1, tp: 2, pp: 1 };
    const m = mesh(tp);
    await m.run('gen', (rank) => ({ fn: 'load', role: 'actor', spec, layout: tp, rank, seed: 5 }));
    await m.run('gen~1', (rank) => ({ fn: 'load', role: 'actor', spec, layout: tp, rank, seed: 6 }));
    const first = Promise.all(m.devices.map((d) => call(d, 'gen', generate({ version: 4, kv: 'recompute' }), false, 'tp-first')));
    await new Promise((r) => setTimeout(r, 30));
    const switchBody = { fn: 'switch' as const, generation: { iteration: 7, model: 'gen' }, version: 5 };
    // Rank 0 is asked first, rank 1 a while later: it has stopped with rank 0 meanwhile, and names the same pass.
    const asked0 = call(m.devices[0]!, 'gen~1', switchBody, true);
    await new Promise((r) => setTimeout(r, 50));
    const steps = [await asked0, await call(m.devices[1]!, 'gen~1', switchBody, true)].map((x) => (x as { step?: number }).step);
    expect(steps[0]).toBeGreaterThan(0);
    expect(steps[1]).toBe(steps[0]);
    await Promise.all(m.devices.map((d, i) => call(d, 'gen~1', { ...switchBody, at: steps[i]! }, true)));
    const outs = (await first) as Array<{ tokens: Int32Array; logprobs: Float32Array; versions: Int32Array }>;
    const versions = m.gather<Int32Array>(outs, 'versions');
    expect(versions.includes(4) && versions.includes(5)).toBe(true);
    const replay = Promise.all(m.devices.map((d) => call(d, 'gen', generate({ version: 4, kv: 'recompute', switches: [{ version: 5, steps: steps.map((s) => s!) }] }), false, 'tp-replay')));
    await new Promise((r) => setTimeout(r, 100));
    await Promise.all(m.devices.map((d, i) => call(d, 'gen~1', { ...switchBody, at: steps[i]! }, true)));
    const again = (await replay) as typeof outs;
    for (const key of ['tokens', 'logprobs', 'versions']) expect(Array.from(m.gather(again, key))).toEqual(Array.from(m.gather(outs, key)));
  }, 30_000);

  it('refuses in flight without slots, and on a replica of several stages', async () => {
    const m = mesh(layout);
    await m.run('gen', (rank) => ({ fn: 'load', role: 'actor', spec, layout, rank, seed: 5 }));
    const { slots: _slots, ...noSlots } = generate({ version: 0, kv: 'keep' }) as Extract<CallBody, { fn: 'generate' }>;
    await expect(call(m.devices[0]!, 'gen', noSlots)).rejects.toThrow('inflight without slots: a generation takes new versions in flight only when it generates continuously');
    const pp: Layout = { devices: [0, 1], dp: 1, tp: 1, pp: 2 };
    const t = mesh(pp);
    await t.run('gen', (rank) => ({ fn: 'load', role: 'actor', spec, layout: pp, rank, seed: 5 }));
    await expect(t.run('gen', () => generate({ version: 0, kv: 'keep' }))).rejects.toThrow('new versions in flight are taken by replicas of one stage (pp = 1); this layout has pp = 2');
  }, 30_000);
});
