import { describe, expect, it } from 'vitest';
import { MemoryShelf } from '../../mesh/wire/index.ts';
import { initBackend } from '../model/backend/backend.ts';
import { fence, type Dispatcher } from '../runtime/dispatch/dispatch.ts';
import { LocalDispatcher } from '../runtime/dispatch/local-dispatch.ts';
import { planDevices } from '../runtime/run/run.ts';
import { setupModels, snapshotInto } from '../runtime/run/setup.ts';
import { MemoryStore } from '../runtime/store/store.ts';
import { FOUR_DEVICES, WITHOUT_DEVICE_3 } from '../runtime/run/four-devices.fixture.ts';
import { specOnPlan } from './decide.ts';
import type { Layout } from '../../mesh/parallel/index.ts';
import type { Checkpoint } from '../../mesh/wire/index.ts';
import { modelInfo, type GptSpec } from '../model/index.ts';
import { modelSpec, runSpec } from '../runtime/run/run.ts';
import { parseScenario } from '../runtime/scenario/scenario.ts';
import { logicalDigests, reshard } from '../runtime/store/reshard.ts';
import { migrateToPlan } from './migrate.ts';
import { setBytes } from '../runtime/run/recovery.ts';

const r = runSpec(
  parseScenario('seed: 1\nmodel: { layers: 2, width: 32, heads: 4 }\ncluster: { nodes: 1, devices_per_node: 4 }\nalgorithm: { name: grpo, group: 2 }\nrl: { iterations: 2, batch: 8 }\n', 'x.yaml'),
);
const spec = modelSpec(r, 'actor') as GptSpec;
const one: Layout = { devices: [0], dp: 1, tp: 1, pp: 1 };

/** The actor's state on one device: distinct values, Adam's two moments, a step. */
function single(): Checkpoint[] {
  const fill = (salt: number, n: number) => Float32Array.from({ length: n }, (_, j) => salt + j / 13);
  const params = modelInfo(spec).params.map((p) => ({ name: p.name, shape: p.shape, n: p.shape.reduce((a, b) => a * b, 1) }));
  return [
    {
      tensors: params.map((p, i) => ({ name: p.name, shape: p.shape, data: fill(i, p.n) })),
      optimizer: { step: 3, moments: params.map((p, i) => ({ name: p.name, m: fill(100 + i, p.n), v: fill(200 + i, p.n) })) },
    },
  ];
}

describe('logicalDigests', () => {
  it('is the same on every layout the state is resharded onto, and changes with any element', () => {
    const base = single();
    const digest = (l: Layout) => logicalDigests(r, { actor: reshard(spec, 'actor', one, base, l) }, { actor: l }).actor;
    const want = digest(one);
    for (const l of [
      { devices: [0, 1], dp: 2, tp: 1, pp: 1 },
      { devices: [0, 1], dp: 1, tp: 2, pp: 1 },
      { devices: [2, 3], dp: 1, tp: 1, pp: 2 },
      { devices: [0, 1, 2, 3], dp: 1, tp: 2, pp: 2 },
    ])
      expect(digest(l), JSON.stringify(l)).toBe(want);
    const changed = single();
    changed[0]!.tensors[1]!.data[5] = Math.fround(changed[0]!.tensors[1]!.data[5]! + 1e-6);
    expect(logicalDigests(r, { actor: changed }, { actor: one }).actor).not.toBe(want);
  });

  it('counts what a restore sends: weights, and both moments where the optimizer has them', () => {
    const base = single();
    const weights = base[0]!.tensors.reduce((n, t) => n + t.data.byteLength, 0);
    expect(setBytes({ actor: base })).toBe(3 * weights);
    expect(setBytes({ actor: [{ tensors: base[0]!.tensors }] })).toBe(weights);
    // Nothing is sent to a rank a device kept with the snapshot's state.
    expect(setBytes({ actor: [...base, ...base] }, { actor: new Map([[1, { held: true as const, parameters: 0 }]]) })).toBe(3 * weights);
    // Replicas send again what they hold alike.
    expect(setBytes({ actor: reshard(spec, 'actor', one, base, { devices: [0, 1], dp: 2, tp: 1, pp: 1 }) })).toBe(6 * weights);
  });
});

describe('migrateToPlan', () => {
  // The four-device PPO head loses device 3: the plan the elastic scenario's search chose on 0-2.
  const four = runSpec(parseScenario(`${FOUR_DEVICES}warmup: { steps: 0 }\nrl: { iterations: 4, batch: 8 }\n`, 'unit.yaml'));
  const three = specOnPlan(four, WITHOUT_DEVICE_3);

  /** Four devices in this process, set up and snapshotted after iteration 0, device 3 gone; `lie`: a restore whose answer names other weights. */
  async function migrated(lie?: { device: number; model: string }, from = four) {
    await initBackend('wasm');
    const shelf = new MemoryShelf();
    const local = new LocalDispatcher(4, undefined, shelf);
    const store = new MemoryStore(shelf);
    await setupModels(local, from);
    await snapshotInto(local, from, store, 0);
    await local.call(3, '*', -1, { fn: 'reset', epoch: local.epoch });
    const d: Dispatcher = {
      ...fence(local),
      restoreShard: async (device, model, iteration, c, o) => {
        const answer = await local.restoreShard(device, model, iteration, c, o);
        return lie?.device === device && lie.model === model ? { digest: '0'.repeat(64) } : answer;
      },
    };
    const to = from === four ? three : specOnPlan(from, WITHOUT_DEVICE_3);
    return migrateToPlan({ d, r: to, store, devices: planDevices(to), snapshot: 0, from, lost: [3] });
  }

  it('moves the snapshot onto the new plan with the least bytes, the parameters equal bit for bit, each checked by its device in its restore', async () => {
    const m = await migrated();
    expect(m.equal).toBe(true);
    for (const [model, x] of Object.entries(m.digests)) expect(x.after, model).toBe(x.before);
    expect(m.bytes).toBe(m.minimumBytes);
    expect(m.moved.sort()).toEqual(['actor', 'critic', 'reference']);
    // Every rank sent a restore answered with its digest; those held had nothing to answer.
    const sent = Object.entries(m.plan ?? {}).flatMap(([model, p]) => [...p.entries()].filter(([, x]) => !('held' in x)).map(([rank]) => `${model}/${rank}`));
    expect(Object.entries(m.rankDigests ?? {}).flatMap(([model, ranks]) => [...ranks.keys()].map((rank) => `${model}/${rank}`))).toEqual(expect.arrayContaining(sent));
  }, 60_000);

  it('with adapters, sends no moments of the frozen base (zeros), and that least is what it counts', async () => {
    const lora = runSpec(parseScenario(`${FOUR_DEVICES.replace('heads: 4 }', 'heads: 4, lora: { rank: 2, alpha: 4 } }')}warmup: { steps: 0 }\nrl: { iterations: 4, batch: 8 }\n`, 'lora.yaml'));
    const m = await migrated(undefined, lora);
    expect(m.equal).toBe(true);
    expect(m.bytes).toBe(m.minimumBytes);
    const full = await migrated();
    expect(m.bytes).toBeLessThan(0.6 * full.bytes);
  }, 60_000);

  it('fails, naming the rank and the device, where a device holds other weights than it was sent', async () => {
    await expect(migrated({ device: 1, model: 'critic' })).rejects.toThrow(/'critic' rank 0 on device 1 holds other weights than it was sent/);
  }, 60_000);
});
