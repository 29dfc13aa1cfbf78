import { describe, expect, it } from 'vitest';
import { checkStrategy, cut as cutOf, shardSlices, sliceShape, type Layout } from '../../../mesh/parallel/index.ts';
import type { Checkpoint } from '../../../mesh/wire/index.ts';
import { modelInfo, type GptSpec } from '../../model/index.ts';
import { ReshardError, reshard, shardsProblem, wholeTensors } from './reshard.ts';

const spec: GptSpec = { kind: 'policy', vocab: 11, context: 9, layers: 2, width: 16, heads: 4 };
const info = modelInfo(spec);
const bits = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString('hex');

/** Every dp × tp × pp layout of 1, 2 and 4 devices that the model allows. */
const layouts: Layout[] = [[0], [0, 1], [0, 1, 2, 3]].flatMap((devices) => {
  const out: Layout[] = [];
  for (let tp = 1; tp <= devices.length; tp *= 2)
    for (let pp = 1; tp * pp <= devices.length; pp *= 2) {
      const l = { devices, dp: devices.length / (tp * pp), tp, pp };
      if (checkStrategy(info, l).length === 0) out.push(l);
    }
  return out;
});

/** A trained model's checkpoint on `layout`: whole tensors of distinct values (NaN and -0 among them), cut per rank. */
function checkpointOn(layout: Layout): Checkpoint[] {
  const whole = (salt: number) =>
    new Map(info.params.map((p, i) => [p.name, Float32Array.from({ length: p.shape.reduce((a, b) => a * b, 1) }, (_, j) => (j === 3 ? Number.NaN : j === 5 ? -0 : salt + i * 1000 + j / 7))]));
  const [w, m, v] = [whole(0.5), whole(1e6), whole(2e6)];
  const ledger = [{ iteration: 0, rows: 16, sha256: 'a'.repeat(64) }];
  return layout.devices.map((_, rank) => {
    const slices = shardSlices(info, layout, rank);
    const part = (t: Map<string, Float32Array>, name: string) => {
      const s = slices.find((x) => x.name === name)!;
      const out = new Float32Array(sliceShape(s).reduce((a, b) => a * b, 1));
      // Cut as a rank holds it: the whole tensor's slice along the split axis.
      const full = { ...s, axis: null, start: 0, end: s.shape[0]! };
      out.set(s.axis === null ? t.get(name)! : cutOf(t.get(name)!, full, s));
      return out;
    };
    return {
      tensors: slices.map((s) => ({ name: s.name, shape: sliceShape(s), data: part(w, s.name) })),
      optimizer: { step: 7, moments: slices.map((s) => ({ name: s.name, m: part(m, s.name), v: part(v, s.name) })) },
      ledger,
    };
  });
}

const logical = (layout: Layout, shards: Checkpoint[]) => wholeTensors(spec, layout, shards).map((t) => `${t.name}:${bits(t.data)}`);
const moments = (layout: Layout, shards: Checkpoint[], k: 'm' | 'v') =>
  wholeTensors(
    spec,
    layout,
    shards.map((s) => ({ tensors: s.optimizer!.moments.map((x, i) => ({ name: x.name, shape: s.tensors[i]!.shape, data: x[k] })) })),
  ).map((t) => bits(t.data));

describe('resharding a checkpoint onto another layout', () => {
  it(`keeps the logical weights and both moments bit for bit, between every pair of ${layouts.length} layouts, and back`, () => {
    expect(layouts.length).toBeGreaterThan(5);
    for (const a of layouts) {
      const shards = checkpointOn(a);
      for (const b of layouts) {
        const there = reshard(spec, 'actor', a, shards, b);
        expect(there).toHaveLength(b.devices.length);
        expect(logical(b, there)).toEqual(logical(a, shards));
        expect(moments(b, there, 'm')).toEqual(moments(a, shards, 'm'));
        expect(moments(b, there, 'v')).toEqual(moments(a, shards, 'v'));
        for (const r of there) {
          expect(r.optimizer!.step).toBe(7);
          expect(r.ledger).toEqual(shards[0]!.ledger);
        }
        // And back: each rank as it was.
        const back = reshard(spec, 'actor', b, there, a);
        back.forEach((r, rank) => expect(r.tensors.map((t) => `${t.name}:${bits(t.data)}`)).toEqual(shards[rank]!.tensors.map((t) => `${t.name}:${bits(t.data)}`)));
      }
    }
  });

  it('refuses ranks that disagree, a rank count that is not its layout, and a rank holding what its layout does not give it', () => {
    const tp2: Layout = { devices: [0, 1], dp: 1, tp: 2, pp: 1 };
    const pp2: Layout = { devices: [0, 1], dp: 1, tp: 1, pp: 2 };
    const shards = checkpointOn(tp2);
    const ledgers = [shards[0]!, { ...shards[1]!, ledger: [] }];
    expect(() => reshard(spec, 'actor', tp2, ledgers, pp2)).toThrow(new ReshardError("'actor': ranks 0 and 1 of the checkpoint trained on different rollouts (their ledgers differ)"));
    const steps = [shards[0]!, { ...shards[1]!, optimizer: { ...shards[1]!.optimizer!, step: 8 } }];
    expect(() => reshard(spec, 'actor', tp2, steps, pp2)).toThrow("'actor': ranks 0 and 1 of the checkpoint hold different optimizer states");
    expect(() => reshard(spec, 'actor', tp2, [shards[0]!], pp2)).toThrow("'actor': the checkpoint holds 1 rank(s); the layout it was taken on has 2");
    const swapped = [shards[1]!, { ...shards[0]!, tensors: [...shards[0]!.tensors, { name: 'nope', shape: [1], data: new Float32Array(1) }] }];
    expect(() => reshard(spec, 'actor', tp2, swapped, pp2)).toThrow("'actor': rank 1 of the checkpoint holds weight 'nope', which its layout does not give it");
  });

  it('says why ranks do not fit a layout before anything is sent: their count, a shape, a tensor missing or foreign', () => {
    const tp2: Layout = { devices: [0, 1], dp: 1, tp: 2, pp: 1 };
    const pp2: Layout = { devices: [0, 1], dp: 1, tp: 1, pp: 2 };
    const shards = checkpointOn(tp2);
    expect(shardsProblem(spec, 'actor', tp2, shards)).toBeUndefined();
    expect(shardsProblem(spec, 'actor', { devices: [0], dp: 1, tp: 1, pp: 1 }, shards)).toBe("the checkpoint holds 2 rank(s) of 'actor'; the plan gives it 1");
    expect(shardsProblem(spec, 'actor', pp2, shards)).toMatch(
      /^rank 0 of the checkpoint of 'actor' holds '[\w.]+' as \[[\d,]+\]; the plan's layout gives that rank \[[\d,]+\] \(a checkpoint taken on another layout, which it does not record\)$|^rank 0 of the checkpoint of 'actor' holds '[\w.]+', which rank 0 of the plan's layout does not$/,
    );
    const short = [{ ...shards[0]!, tensors: shards[0]!.tensors.slice(1) }, shards[1]!];
    expect(shardsProblem(spec, 'actor', tp2, short)).toBe(`rank 0 of the checkpoint of 'actor' lacks '${shards[0]!.tensors[0]!.name}'`);
  });
});
