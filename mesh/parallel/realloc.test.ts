// Reallocation plans, executed in memory: every pair of layouts over 4 devices, and a sample over
// 8 devices in 2 nodes, must rebuild every destination slice bit-exact from the source layout,
// with exactly the minimum bytes received and nothing published twice on one node.
import { describe, expect, it } from 'vitest';
import { layoutKey, shardSlices, sliceShape, type Layout, type ModelInfo, type Slice } from './layout.ts';
import { planMigration, planRealloc } from './realloc.ts';
import { cut, paste, pasteRange } from './slices.ts';

// A GPT-shaped model: 4 layers of column/row-split matrices, replicated norms, embeddings, head.
const D = 8;
const model: ModelInfo = {
  layers: 4,
  params: [
    { name: 'wte', shape: [5, D], layer: 'embed', splitAxis: null },
    ...[0, 1, 2, 3].flatMap((l) => [
      { name: `h${l}.ln.g`, shape: [D], layer: l, splitAxis: null },
      { name: `h${l}.wq`, shape: [D, D], layer: l, splitAxis: 1 },
      { name: `h${l}.bq`, shape: [D], layer: l, splitAxis: 0 },
      { name: `h${l}.wo`, shape: [D, D], layer: l, splitAxis: 0 },
      { name: `h${l}.w1`, shape: [D, 4 * D], layer: l, splitAxis: 1 },
    ]),
    { name: 'head.w', shape: [D, 5], layer: 'head', splitAxis: null },
  ],
};

const truth = new Map(model.params.map((p, i) => [p.name, Float32Array.from({ length: p.shape.reduce((a, b) => a * b, 1) }, (_, j) => i * 1000 + j + 0.5)]));

/** The bytes of an array or of a view, exactly. */
const bytesOf = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength);

function layouts(devices: number[][]): Layout[] {
  const out: Layout[] = [];
  for (const d of devices) {
    const n = d.length;
    for (let dp = 1; dp <= n; dp *= 2)
      for (let tp = 1; dp * tp <= n; tp *= 2) {
        const pp = n / (dp * tp);
        if (Number.isInteger(pp) && pp <= model.layers) out.push({ devices: d, dp, tp, pp });
      }
  }
  return out;
}

/** Runs a plan in memory and returns, per device of `to`, its rebuilt slices. */
function execute(from: Layout, to: Layout, nodeOf: (d: number) => number) {
  const plan = planRealloc(model, from, to, nodeOf);
  const held = new Map<number, Map<string, { slice: Slice; data: Float32Array }>>();
  from.devices.forEach((dev, rank) => {
    const m = new Map();
    for (const s of shardSlices(model, from, rank)) m.set(s.name, { slice: s, data: cut(truth.get(s.name)!, { ...s, axis: null, start: 0, end: s.shape[0]! }, s) });
    held.set(dev, m);
  });
  const built = new Map<number, Map<string, { slice: Slice; data: Float32Array; filled: number }>>();
  to.devices.forEach((dev, rank) => {
    const m = new Map();
    for (const s of shardSlices(model, to, rank)) m.set(s.name, { slice: s, data: new Float32Array(sliceShape(s).reduce((a, b) => a * b, 1)).fill(NaN), filled: 0 });
    built.set(dev, m);
  });
  const put = (dev: number, part: Slice, data: Float32Array) => {
    const target = built.get(dev)!.get(part.name)!;
    paste(target.data, target.slice, part, data);
    target.filled += data.length;
  };
  for (const l of plan.locals) {
    const src = held.get(l.device)!.get(l.name)!;
    put(l.device, l, cut(src.data, src.slice, l));
  }
  // Transfers arrive in chunks, each placed as it comes (pasteRange); 7 elements cut rows anywhere.
  for (const g of plan.transfers) {
    for (const piece of g.pieces) {
      const src = held.get(g.src)!.get(piece.name)!;
      const bytes = cut(src.data, src.slice, piece);
      for (const dst of g.dsts) {
        const target = built.get(dst)!.get(piece.name)!;
        for (let at = 0; at < bytes.length; at += 7) pasteRange(target.data, target.slice, piece, at, bytes.subarray(at, at + 7));
        target.filled += bytes.length;
      }
    }
  }
  return { plan, built };
}

/**
 * The minimum, computed apart from the planner: each destination rank's slices, less what the
 * same device already holds of them in the source layout.
 */
function independentMinimum(from: Layout, to: Layout): number {
  let bytes = 0;
  to.devices.forEach((dev, rank) => {
    const mine = from.devices.indexOf(dev);
    const held = mine < 0 ? [] : shardSlices(model, from, mine);
    for (const s of shardSlices(model, to, rank)) {
      const size = sliceShape(s).reduce((a, b) => a * b, 1);
      const h = held.find((x) => x.name === s.name);
      let overlap = 0;
      if (h) {
        const axis = s.axis ?? h.axis;
        if (axis === null) overlap = size;
        else {
          const [a0, a1] = s.axis === null ? [0, s.shape[axis]!] : [s.start, s.end];
          const [b0, b1] = h.axis === null ? [0, h.shape[axis]!] : [h.start, h.end];
          overlap = (Math.max(0, Math.min(a1, b1) - Math.max(a0, b0)) * size) / (a1 - a0);
        }
      }
      bytes += (size - overlap) * 4;
    }
  });
  return bytes;
}

function check(from: Layout, to: Layout, nodeOf: (d: number) => number) {
  const { plan, built } = execute(from, to, nodeOf);
  expect(plan.minimumBytes).toBe(independentMinimum(from, to));
  for (const [, slices] of built) {
    for (const { slice, data, filled } of slices.values()) {
      expect(filled, `${slice.name} filled once`).toBe(data.length);
      const want = cut(truth.get(slice.name)!, { ...slice, axis: null, start: 0, end: slice.shape[0]! }, slice);
      expect(bytesOf(data).equals(bytesOf(want)), `${slice.name} bit-exact`).toBe(true);
    }
  }
  expect(plan.receivedBytes).toBe(plan.minimumBytes);
  // No source publishes the same bytes twice, on one node or across nodes: a source's pieces of a
  // parameter never overlap (NATS fans one publish out to every destination).
  {
    const byName = new Map<string, Array<[number, number]>>();
    for (const p of plan.pieces) {
      const r: [number, number] = p.axis === null ? [0, Infinity] : [p.start, p.end];
      const key = `${p.src}:${p.name}`;
      for (const q of byName.get(key) ?? []) expect(r[1] <= q[0] || q[1] <= r[0], `${p.name} published twice by ${p.src}`).toBe(true);
      byName.set(key, [...(byName.get(key) ?? []), r]);
    }
  }
  return plan;
}

describe('reallocation plans', () => {
  const four = layouts([[0], [1], [2], [3], [0, 1], [2, 3], [0, 1, 2, 3]]);

  it(`round-trips every pair of ${four.length} layouts over 4 devices bit-exact, with minimum bytes`, () => {
    expect(four.length).toBe(4 + 2 * 3 + 6);
    for (const a of four)
      for (const b of four) {
        const there = check(a, b, () => 0);
        const back = check(b, a, () => 0);
        if (layoutKey(a) === layoutKey(b)) expect(there.minimumBytes + back.minimumBytes).toBe(0);
      }
  });

  it('round-trips a sample of layouts over 8 devices in 2 nodes, preferring senders on the same node', () => {
    const nodeOf = (d: number) => Math.floor(d / 4);
    const eight = layouts([
      [0, 1],
      [4, 5],
      [0, 1, 2, 3],
      [4, 5, 6, 7],
      [0, 1, 2, 3, 4, 5, 6, 7],
    ]);
    let n = 0;
    for (const [i, a] of eight.entries())
      for (const [j, b] of eight.entries()) {
        if ((i * 7 + j * 3) % 5 !== 0) continue; // a fixed, spread-out sample
        const plan = check(a, b, nodeOf);
        for (const p of plan.pieces) {
          const sameNodeHolder = a.devices.some((d) => nodeOf(d) === nodeOf(p.dsts[0]!));
          if (sameNodeHolder && a.dp * a.tp === 1 && a.devices.length === 1) expect(nodeOf(p.src)).toBe(nodeOf(p.dsts[0]!));
        }
        n += 1;
      }
    expect(n).toBeGreaterThan(20);
  });

  it('moves nothing between identical layouts and everything between disjoint ones', () => {
    const a: Layout = { devices: [0, 1], dp: 1, tp: 2, pp: 1 };
    expect(planRealloc(model, a, a, () => 0)).toMatchObject({ pieces: [], receivedBytes: 0, minimumBytes: 0 });
    const total = [...truth.values()].reduce((s, t) => s + t.byteLength, 0);
    const far = planRealloc(model, { devices: [0], dp: 1, tp: 1, pp: 1 }, { devices: [1], dp: 1, tp: 1, pp: 1 }, () => 0);
    expect(far.receivedBytes).toBe(total);
  });

  it('publishes once what replicas on two nodes want from one holder', () => {
    const eight = [0, 1, 2, 3, 4, 5, 6, 7];
    const plan = planRealloc(model, { devices: [0], dp: 1, tp: 1, pp: 1 }, { devices: eight, dp: 8, tp: 1, pp: 1 }, (d) => Math.floor(d / 4));
    const total = [...truth.values()].reduce((s, t) => s + t.byteLength, 0);
    expect(plan.publishedBytes).toBe(total);
    expect(plan.receivedBytes).toBe(7 * total);
  });

  it('publishes a slice wanted by several replicas once (NATS fans it out)', () => {
    const plan = planRealloc(model, { devices: [0], dp: 1, tp: 1, pp: 1 }, { devices: [0, 1, 2, 3], dp: 4, tp: 1, pp: 1 }, () => 0);
    const total = [...truth.values()].reduce((s, t) => s + t.byteLength, 0);
    expect(plan.publishedBytes).toBe(total);
    expect(plan.receivedBytes).toBe(3 * total);
    expect(plan.locals.filter((l) => l.device === 0)).toHaveLength(model.params.length);
  });
});

describe('migration plans after a device is lost', () => {
  const four = layouts([[0], [1], [2], [3], [0, 1], [2, 3], [0, 1, 2, 3]]);

  /** Runs a migration in memory: survivors send and copy what they hold, the snapshot (the truth) fills the rest. */
  function migrate(from: Layout, to: Layout, lost: number) {
    const plan = planMigration(model, from, to, () => 0, new Set([lost]));
    const held = (dev: number, name: string) => {
      const rank = from.devices.indexOf(dev);
      expect(dev, `a piece from the lost device ${lost}`).not.toBe(lost);
      const s = shardSlices(model, from, rank).find((x) => x.name === name)!;
      return { slice: s, data: cut(truth.get(name)!, { ...s, axis: null, start: 0, end: s.shape[0]! }, s) };
    };
    const built = new Map<string, { slice: Slice; data: Float32Array; filled: number }>();
    to.devices.forEach((dev, rank) => {
      for (const s of shardSlices(model, to, rank)) built.set(`${dev}/${s.name}`, { slice: s, data: new Float32Array(sliceShape(s).reduce((a, b) => a * b, 1)).fill(NaN), filled: 0 });
    });
    const put = (dev: number, part: Slice, data: Float32Array) => {
      const t = built.get(`${dev}/${part.name}`)!;
      paste(t.data, t.slice, part, data);
      t.filled += data.length;
    };
    for (const l of plan.locals) {
      const h = held(l.device, l.name);
      put(l.device, l, cut(h.data, h.slice, l));
    }
    for (const g of plan.transfers) {
      for (const piece of g.pieces) {
        const h = held(g.src, piece.name);
        for (const dst of g.dsts) put(dst, piece, cut(h.data, h.slice, piece));
      }
    }
    for (const r of plan.restores) put(r.device, r, cut(truth.get(r.name)!, { ...r, axis: null, start: 0, end: r.shape[0]! }, r));
    for (const [key, { slice, data, filled }] of built) {
      expect(filled, `${key} filled once`).toBe(data.length);
      const want = cut(truth.get(slice.name)!, { ...slice, axis: null, start: 0, end: slice.shape[0]! }, slice);
      expect(bytesOf(data).equals(bytesOf(want)), `${key} bit-exact`).toBe(true);
    }
    return plan;
  }

  it('rebuilds every layout on the devices left, bit-exact, reading from the snapshot only what no survivor holds', () => {
    let cases = 0;
    let fromSnapshot = 0;
    for (const a of four.filter((l) => l.devices.length > 1))
      for (const lost of a.devices)
        for (const b of four.filter((l) => !l.devices.includes(lost))) {
          const plan = migrate(a, b, lost);
          cases += 1;
          // What the survivors and the snapshot give together is what the destinations lacked.
          expect(plan.minimumBytes + plan.snapshotBytes).toBe(independentMinimum(a, b));
          expect(plan.receivedBytes).toBe(plan.minimumBytes);
          // A restored interval is one that no surviving rank holds.
          for (const r of plan.restores) {
            const survivors = a.devices.map((d, rank) => ({ d, rank })).filter(({ d }) => d !== lost);
            for (const { rank } of survivors) {
              const s = shardSlices(model, a, rank).find((x) => x.name === r.name);
              if (!s) continue; // another pipeline stage's
              const [lo, hi] = s.axis === null ? [0, Infinity] : [s.start, s.end];
              const [rlo, rhi] = r.axis === null ? [0, Infinity] : [r.start, r.end];
              expect(Math.min(hi, rhi) <= Math.max(lo, rlo), `${r.name} ${rlo}-${rhi} restored though device ${a.devices[rank]} holds ${lo}-${hi}`).toBe(true);
            }
          }
          if (a.dp === a.devices.length) expect(plan.snapshotBytes, 'every replica whole: nothing from the snapshot').toBe(0);
          fromSnapshot += plan.snapshotBytes > 0 ? 1 : 0;
        }
    expect(cases).toBeGreaterThan(60);
    expect(fromSnapshot).toBeGreaterThan(10);
  });

  it('a tp shard at dp = 1 comes back from the snapshot; its replica at dp = 2 from the survivor', () => {
    const tp2: Layout = { devices: [0, 1], dp: 1, tp: 2, pp: 1 };
    const one: Layout = { devices: [0], dp: 1, tp: 1, pp: 1 };
    const alone = planMigration(model, tp2, one, () => 0, new Set([1]));
    expect(alone.snapshotBytes).toBeGreaterThan(0);
    expect(alone.receivedBytes).toBe(0); // device 0 keeps its half; the other half is device 1's alone
    const dp2: Layout = { devices: [0, 1, 2, 3], dp: 2, tp: 2, pp: 1 };
    const replica = planMigration(model, dp2, { devices: [0, 2], dp: 1, tp: 2, pp: 1 }, () => 0, new Set([1]));
    expect(replica.snapshotBytes).toBe(0);
    expect(replica.receivedBytes).toBeGreaterThan(0);
    expect(replica.transfers.some((g) => g.src === 1)).toBe(false);
  });

  it('refuses a new layout on a lost device, naming it', () => {
    expect(() => planMigration(model, { devices: [0, 1], dp: 2, tp: 1, pp: 1 }, { devices: [1], dp: 1, tp: 1, pp: 1 }, () => 0, new Set([1]))).toThrow(
      'the new layout places shards on device 1, which the run has lost',
    );
  });
});
