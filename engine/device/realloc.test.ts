// Reallocation end to end on real devices (in one process, over the in-memory bus): for every pair
// of layouts over 4 devices, a model loaded on one layout is moved into another, and every rank of
// the destination must then hold exactly its slices of the source's weights, with the bytes the
// devices report having received equal to the plan's minimum.
import { beforeAll, describe, expect, it } from 'vitest';
import { shardSlices, type Layout } from '../../mesh/parallel/layout.ts';
import { planRealloc } from '../../mesh/parallel/realloc.ts';
import { cut } from '../../mesh/parallel/slices.ts';
import { initBackend } from '../model/backend/backend.ts';
import { LocalDispatcher } from '../runtime/dispatch/local-dispatch.ts';
import { initialWeights } from '../model/gpt.ts';
import { modelInfo, type GptSpec } from '../model/params.ts';

const spec: GptSpec = { kind: 'policy', vocab: 7, context: 6, layers: 4, width: 8, heads: 4 };
const info = modelInfo(spec);
const truth = new Map(initialWeights(spec, 5).map((t) => [t.name, t]));

function layouts(): Layout[] {
  const out: Layout[] = [];
  for (const devices of [[0], [1], [2], [3], [0, 1], [2, 3], [0, 1, 2, 3]]) {
    const n = devices.length;
    for (let dp = 1; dp <= n; dp *= 2) for (let tp = 1; dp * tp <= n; tp *= 2) out.push({ devices, dp, tp, pp: n / (dp * tp) });
  }
  return out;
}

describe('reallocation between real devices', () => {
  beforeAll(async () => {
    await initBackend('cpu');
  });

  it('moves weights between every pair of layouts over 4 devices, bit-exact, with the minimum bytes', async () => {
    const all = layouts();
    let pairs = 0;
    for (const from of all) {
      for (const to of all) {
        const d = new LocalDispatcher(4);
        const load = (model: string, layout: Layout, seed?: number) =>
          Promise.all(layout.devices.map((dev, rank) => d.call(dev, model, 0, { fn: 'load', role: 'actor', spec, layout, rank, ...(seed === undefined ? {} : { seed }) })));
        await load('src', from, 5);
        await load('dst', to);
        const plan = planRealloc(info, from, to, () => 0);
        const out = await d.realloc({ id: `p${pairs}`, iteration: 0, from: { model: 'src', layout: from }, to: { model: 'dst', layout: to }, plan });
        expect(out.received_bytes).toBe(plan.minimumBytes);
        const held = await Promise.all(to.devices.map((dev) => d.call(dev, 'dst', 0, { fn: 'manifest' })));
        to.devices.forEach((dev, rank) => {
          const device = (d as unknown as { devices: Array<{ hosted: Map<string, { shard: { weights: { exportTensors(): Array<{ name: string; data: Float32Array }> } } }> }> }).devices[dev]!;
          const got = new Map(
            device.hosted
              .get('dst')!
              .shard.weights.exportTensors()
              .map((t) => [t.name, t.data]),
          );
          for (const s of shardSlices(info, to, rank)) {
            const whole = truth.get(s.name)!;
            const want = cut(whole.data, { ...s, axis: null, start: 0, end: s.shape[0]! }, s);
            expect(
              Buffer.from(got.get(s.name)!.buffer, got.get(s.name)!.byteOffset, got.get(s.name)!.byteLength).equals(Buffer.from(want.buffer, want.byteOffset, want.byteLength)),
              `${s.name} on rank ${rank}`,
            ).toBe(true);
          }
        });
        expect(held).toHaveLength(to.devices.length);
        pairs += 1;
      }
    }
    expect(pairs).toBe(16 * 16);
  }, 120_000);
});
