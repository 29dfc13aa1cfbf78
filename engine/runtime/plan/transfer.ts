// The time of a move, as reallocSeconds (cost.ts) prices it from the runtime's transfer plan
// (mesh/parallel/realloc.ts planRealloc), without building the plan: the same sender for every
// interval, the same merging of adjacent pieces, the same sums in the same order, so the same
// number to the last bit (transfer.test.ts holds it to reallocSeconds), about three times faster
// (a move of LLaMA-2 70B between layouts of 128 A100s: 12 ms → 3.6 ms, measured here). A plan
// search prices hundreds of moves; with planRealloc, most of its time went there. A change to
// planRealloc's choices must be made here too: the test says so.
import { rangeOn, shardSlices, stageBounds, type Layout, type ModelInfo } from '../../../mesh/parallel/index.ts';
import type { DeviceProfile, ModelShape } from './catalog.ts';
import { coarseInfo } from './cost.ts';

/** One device's range of one parameter, along the axis the parameter is cut on. */
interface Held {
  device: number;
  lo: number;
  hi: number;
}

/**
 * An elementary interval of a parameter's cut axis between two layouts: who holds it, and the
 * destinations that need it and do not hold it, by node (ascending), in the order they need it.
 */
interface Interval {
  lo: number;
  hi: number;
  holders: number[];
  near: Map<number, number[]>;
  remote: Array<{ node: number; dsts: number[] }>;
}

/**
 * Per model: the distinct holdings of one parameter (many parameters share one: every layer of a
 * pipeline stage holds the same ranges of parameters of the same size), and the intervals of each
 * pair of them that a move has met, so that a move of 80 layers works out a few dozen of them.
 */
interface Tables {
  ids: Map<string, number>;
  held: Held[][];
  byLayout: Map<string, number[]>;
  intervals: Map<string, Interval[]>;
}

const tables = new WeakMap<ModelInfo, Tables>();

function tablesOf(model: ModelInfo): Tables {
  let t = tables.get(model);
  if (!t) tables.set(model, (t = { ids: new Map(), held: [], byLayout: new Map(), intervals: new Map() }));
  return t;
}

/** Per parameter (in the model's order), the id of who holds which range, rank by rank. */
function holdings(model: ModelInfo, t: Tables, layout: Layout): number[] {
  const key = `${layout.devices.join(',')}/${layout.dp}/${layout.tp}/${layout.pp}`;
  let out = t.byLayout.get(key);
  if (out) return out;
  const index = new Map(model.params.map((p, i) => [p.name, i]));
  const bounds = stageBounds(model, layout.pp);
  const held: Held[][] = model.params.map(() => []);
  layout.devices.forEach((device, rank) => {
    for (const s of shardSlices(model, layout, rank, bounds)) {
      const i = index.get(s.name)!;
      const [lo, hi] = rangeOn(s, model.params[i]!.splitAxis ?? 0);
      held[i]!.push({ device, lo, hi });
    }
  });
  out = held.map((h) => {
    const content = h.map((x) => `${x.device}:${x.lo}:${x.hi}`).join(',');
    let id = t.ids.get(content);
    if (id === undefined) {
      t.ids.set(content, (id = t.held.length));
      t.held.push(h);
    }
    return id;
  });
  t.byLayout.set(key, out);
  return out;
}

/** planRealloc's walk over one parameter's cut axis, the parts that do not depend on load. */
function intervalsOf(has: readonly Held[], needs: readonly Held[], nodeOf: (d: number) => number): Interval[] {
  const points = [...new Set([...has, ...needs].flatMap((h) => [h.lo, h.hi]))].sort((a, b) => a - b);
  const out: Interval[] = [];
  for (let i = 0; i + 1 < points.length; i++) {
    const lo = points[i]!;
    const hi = points[i + 1]!;
    const holders = has.filter((h) => h.lo <= lo && h.hi >= hi).map((h) => h.device);
    if (holders.length === 0) throw new Error(`no device of the source layout holds [${lo}, ${hi})`);
    const holding = new Set(holders);
    const remote = new Map<number, number[]>();
    for (const n of needs) {
      if (!(n.lo <= lo && n.hi >= hi) || holding.has(n.device)) continue;
      const node = nodeOf(n.device);
      (remote.get(node) ?? remote.set(node, []).get(node)!).push(n.device);
    }
    const near = new Map<number, number[]>();
    for (const d of holders) (near.get(nodeOf(d)) ?? near.set(nodeOf(d), []).get(nodeOf(d))!).push(d);
    out.push({ lo, hi, holders, near, remote: [...remote.entries()].sort((a, b) => a[0] - b[0]).map(([node, dsts]) => ({ node, dsts })) });
  }
  return out;
}

interface Piece {
  param: number;
  src: number;
  dsts: number[];
  start: number;
  end: number;
  /** The piece spans its whole parameter (planRealloc's axis null): it does not merge. */
  whole: boolean;
}

const sameList = (a: readonly number[], b: readonly number[]) => a.length === b.length && a.every((x, i) => x === b[i]);

export function transferSeconds(m: ModelShape, from: Layout, to: Layout, dev: DeviceProfile, perNode: number, valueHead = false): number {
  const model = coarseInfo(m, valueHead);
  const t = tablesOf(model);
  const held = holdings(model, t, from);
  const needed = holdings(model, t, to);
  const nodeOf = (d: number) => Math.floor(d / perNode);
  const load = new Map<number, number>();
  const loadOf = (d: number) => load.get(d) ?? 0;
  const pieces: Piece[] = [];
  model.params.forEach((p, param) => {
    const key = `${held[param]}>${needed[param]}|${perNode}`;
    let intervals = t.intervals.get(key);
    if (!intervals) t.intervals.set(key, (intervals = intervalsOf(t.held[held[param]!]!, t.held[needed[param]!]!, nodeOf)));
    const length = p.shape[p.splitAxis ?? 0]!;
    const rowElems = p.shape.reduce((a, b) => a * b, 1) / length;
    let open: Piece[] = [];
    for (const { lo, hi, holders, near, remote } of intervals) {
      if (remote.length === 0) {
        open = [];
        continue;
      }
      const bytes = (hi - lo) * rowElems * 4;
      // A sender on the destination's node if there is one, else among all holders: the least
      // loaded, ties to the lower device.
      const bySrc = new Map<number, number[]>();
      for (const { node, dsts } of remote) {
        let src = -1;
        let least = Infinity;
        for (const d of near.get(node) ?? holders) {
          const l = loadOf(d);
          if (src < 0 || l < least || (l === least && d < src)) [src, least] = [d, l];
        }
        const to = bySrc.get(src);
        if (to) to.push(...dsts);
        else {
          load.set(src, least + bytes);
          bySrc.set(src, [...dsts]);
        }
      }
      const whole = lo === 0 && hi === length;
      const next: Piece[] = [];
      for (const [src, dsts] of bySrc) {
        dsts.sort((a, b) => a - b);
        const prev = whole ? undefined : open.find((o) => o.src === src && o.end === lo && !o.whole && sameList(o.dsts, dsts));
        if (prev) {
          prev.end = hi;
          next.push(prev);
        } else {
          const piece: Piece = { param, src, dsts, start: lo, end: hi, whole };
          pieces.push(piece);
          next.push(piece);
        }
      }
      open = next;
    }
  });
  // reallocSeconds' sums, piece by piece in the plan's order.
  const scale = m.dtypeBytes / 4;
  const recv = new Map<number, number>();
  const send = new Map<number, number>();
  for (const piece of pieces) {
    const p = model.params[piece.param]!;
    const axis = p.splitAxis ?? 0;
    const count = p.shape.reduce((a, b) => a * b, 1);
    const whole = piece.whole || (piece.start === 0 && piece.end === p.shape[axis]);
    const size = whole ? count : (count / p.shape[axis]!) * (piece.end - piece.start);
    const b = size * 4 * scale;
    const srcNode = nodeOf(piece.src);
    for (const d of piece.dsts) {
      const bw = nodeOf(d) === srcNode ? dev.intraBandwidth : dev.interBandwidth;
      recv.set(d, (recv.get(d) ?? 0) + b / bw + dev.latency);
    }
    const bw = piece.dsts.every((d) => nodeOf(d) === srcNode) ? dev.intraBandwidth : dev.interBandwidth;
    send.set(piece.src, (send.get(piece.src) ?? 0) + b / bw);
  }
  return Math.max(0, ...recv.values(), ...send.values());
}
