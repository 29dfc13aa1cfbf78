// A rank moved onto another layout on the same device: for every pair of layouts over 4 devices
// and every device in both, the new slices assembled from the old rank's slices and the missing
// pieces equal the new slices cut from the whole tensors, bit for bit; the missing pieces are
// exactly what the old rank did not hold.
import { describe, expect, it } from 'vitest';
import { shardSlices, sliceElements, sliceShape, type Layout, type ModelInfo, type Slice } from './layout.ts';
import { assemble, pieceName, relaidSlices } from './relaid.ts';
import { cut } from './slices.ts';

const D = 8;
const model: ModelInfo = {
  layers: 2,
  params: [
    { name: 'wte', shape: [5, D], layer: 'embed', splitAxis: null },
    ...[0, 1].flatMap((l) => [
      { name: `h${l}.ln.g`, shape: [D], layer: l, splitAxis: null },
      { name: `h${l}.wq`, shape: [D, D], layer: l, splitAxis: 1 },
      { name: `h${l}.bq`, shape: [D], layer: l, splitAxis: 0 },
      { name: `h${l}.wo`, shape: [D, D], layer: l, splitAxis: 0 },
    ]),
    { name: 'head.w', shape: [D, 5], layer: 'head', splitAxis: null },
  ],
};
const whole = new Map(model.params.map((p, i) => [p.name, Float32Array.from({ length: p.shape.reduce((a, b) => a * b, 1) }, (_, j) => i * 1000 + j + 0.25)]));
const full = (name: string): Slice => {
  const p = model.params.find((x) => x.name === name)!;
  return { name, shape: p.shape, axis: null, start: 0, end: p.shape[0]! };
};
const of = (s: Slice) => cut(whole.get(s.name)!, full(s.name), s);

function layouts(): Layout[] {
  const out: Layout[] = [];
  for (const devices of [[0], [1], [0, 1], [2, 3], [0, 1, 2, 3]]) {
    const n = devices.length;
    for (let dp = 1; dp <= n; dp *= 2)
      for (let tp = 1; dp * tp <= n; tp *= 2) {
        const pp = n / (dp * tp);
        if (Number.isInteger(pp) && pp <= model.layers) out.push({ devices, dp, tp, pp });
      }
  }
  return out;
}

describe('relaidSlices', () => {
  it('rebuilds every new slice from what the device held and the pieces it lacks, for every pair of layouts', () => {
    let pairs = 0;
    for (const a of layouts()) {
      for (const b of layouts()) {
        for (const device of a.devices.filter((x) => b.devices.includes(x))) {
          const from = { layout: a, rank: a.devices.indexOf(device) };
          const to = { layout: b, rank: b.devices.indexOf(device) };
          const old = new Map(shardSlices(model, a, from.rank).map((s) => [s.name, of(s)]));
          const pieces = relaidSlices(model, from, to);
          for (const s of pieces) {
            const missing = new Map(s.missing.map((p) => [pieceName(p), of(p)]));
            const built = assemble(
              s,
              (name) => old.get(name)!,
              (name) => missing.get(name)!,
            );
            expect(Buffer.from(built.buffer).equals(Buffer.from(of(s.slice).slice().buffer))).toBe(true);
            // Held and missing pieces cover the slice once.
            const count = (xs: Slice[]) => xs.reduce((n, p) => n + sliceShape(p).reduce((x, y) => x * y, 1), 0);
            expect(count([...s.held.map((h) => h.piece), ...s.missing])).toBe(sliceElements(s.slice));
            // Nothing is missing that the old rank held, and nothing held that it did not.
            for (const h of s.held) expect(old.has(h.from.name)).toBe(true);
            if (!old.has(s.slice.name)) expect(s.held).toEqual([]);
          }
          pairs++;
        }
      }
    }
    expect(pairs).toBeGreaterThan(100);
  });

  it('keeps everything on the same slices, and lacks everything of a stage it never held', () => {
    const dp2: Layout = { devices: [0, 1], dp: 2, tp: 1, pp: 1 };
    const alone: Layout = { devices: [0], dp: 1, tp: 1, pp: 1 };
    expect(relaidSlices(model, { layout: dp2, rank: 0 }, { layout: alone, rank: 0 }).every((s) => s.missing.length === 0)).toBe(true);
    // Stage 1 of a pipeline, then the whole model: the embedding and layer 0 are missing whole.
    const pp2: Layout = { devices: [0, 1], dp: 1, tp: 1, pp: 2 };
    const back = relaidSlices(model, { layout: pp2, rank: 1 }, { layout: { devices: [1], dp: 1, tp: 1, pp: 1 }, rank: 0 });
    expect(back.filter((s) => s.held.length === 0).map((s) => s.slice.name)).toEqual(['wte', 'h0.ln.g', 'h0.wq', 'h0.bq', 'h0.wo']);
    // Half of a tensor-parallel pair, then the whole: the other half of each split matrix.
    const tp2: Layout = { devices: [0, 1], dp: 1, tp: 2, pp: 1 };
    const wq = relaidSlices(model, { layout: tp2, rank: 0 }, { layout: alone, rank: 0 }).find((s) => s.slice.name === 'h0.wq')!;
    expect(wq.missing.map(pieceName)).toEqual(['h0.wq[1:4-8]']);
  });
});
