// Reallocation planning: going from layout A to layout B, who sends which slice to whom.
//
// Per parameter, the ranges held in A and wanted in B cut the split axis into elementary
// intervals. A destination that already holds an interval copies it locally; otherwise one source
// is chosen among A's holders — on the destination's node if there is one, else the least-loaded
// sender — and every destination of that node that wants the interval receives the same publish.
// Adjacent intervals with the same source and destinations merge into one piece. The bytes that
// destinations receive equal the minimum: what each needs minus what it already holds.
import { rangeOn, shardSlices, sliceElements, stageBounds, type Layout, type ModelInfo, type ParamInfo, type Slice } from './layout.ts';

export interface Piece extends Slice {
  src: number;
  dsts: number[];
}

export interface LocalCopy extends Slice {
  device: number;
}

/** Pieces that go from one source to the same destinations travel as one transfer. */
export interface TransferGroup {
  index: number;
  src: number;
  dsts: number[];
  pieces: Slice[];
}

export interface ReallocPlan {
  pieces: Piece[];
  locals: LocalCopy[];
  transfers: TransferGroup[];
  /** Bytes destinations receive over the bus (a piece counts once per destination). */
  receivedBytes: number;
  /** Bytes sources publish (a piece counts once). */
  publishedBytes: number;
  /** What each destination needs minus what it already holds, summed. */
  minimumBytes: number;
  /** Devices that send, receive or copy. */
  devices: number[];
}

/** A slice a destination needs that no surviving device holds: it comes from the last snapshot. */
export interface Restore extends Slice {
  device: number;
}

/** A reallocation after devices were lost: what survivors send, and what only a snapshot has. */
export interface MigrationPlan extends ReallocPlan {
  /** Slices nobody left holds (a tp or pp shard at dp = 1 on a lost device), by destination. */
  restores: Restore[];
  /** Bytes destinations read from the snapshot. */
  snapshotBytes: number;
}

const BYTES = 4;

interface Held {
  device: number;
  lo: number;
  hi: number;
}

const holdingCache = new WeakMap<ModelInfo, Map<string, Map<string, Held[]>>>();

function holdings(model: ModelInfo, layout: Layout, names: Set<string> | undefined): Map<string, Held[]> {
  // Planners (a plan search above all) ask for the same layouts again and again.
  let byLayout = holdingCache.get(model);
  if (!byLayout) holdingCache.set(model, (byLayout = new Map()));
  const key = `${layout.devices.join(',')}/${layout.dp}/${layout.tp}/${layout.pp}`;
  let all = byLayout.get(key);
  if (!all) byLayout.set(key, (all = computeHoldings(model, layout)));
  if (!names) return all;
  return new Map([...all].filter(([name]) => names.has(name)));
}

function computeHoldings(model: ModelInfo, layout: Layout): Map<string, Held[]> {
  const bounds = stageBounds(model, layout.pp);
  const out = new Map<string, Held[]>();
  layout.devices.forEach((device, rank) => {
    for (const s of shardSlices(model, layout, rank, bounds)) {
      const axis = cutAxis(model, s.name);
      const [lo, hi] = rangeOn(s, axis);
      (out.get(s.name) ?? out.set(s.name, []).get(s.name)!).push({ device, lo, hi });
    }
  });
  return out;
}

const infoCache = new WeakMap<ModelInfo, Map<string, ParamInfo>>();
function info(model: ModelInfo, name: string): ParamInfo {
  let m = infoCache.get(model);
  if (!m) infoCache.set(model, (m = new Map(model.params.map((p) => [p.name, p]))));
  return m.get(name)!;
}

/** The axis along which a parameter's slices are ranges (its split axis, or 0 if replicated). */
function cutAxis(model: ModelInfo, name: string): number {
  return info(model, name).splitAxis ?? 0;
}

function pieceSlice(p: ParamInfo, lo: number, hi: number): Slice {
  const axis = p.splitAxis ?? 0;
  const whole = lo === 0 && hi === p.shape[axis];
  return whole ? { name: p.name, shape: p.shape, axis: null, start: 0, end: p.shape[0] ?? 1 } : { name: p.name, shape: p.shape, axis, start: lo, end: hi };
}

/**
 * Plans the move of `names` (all parameters when absent) from layout `from` to layout `to`.
 * `nodeOf` maps a device to its node, for locality. `target` describes the destination model
 * when it differs from the source (a value model filled from a policy's body: the same parameters,
 * but another head, so its pipeline stages may fall elsewhere).
 */
export function planRealloc(model: ModelInfo, from: Layout, to: Layout, nodeOf: (device: number) => number, names?: readonly string[], target: ModelInfo = model): ReallocPlan {
  const { restores: _r, snapshotBytes: _b, ...plan } = plan_(model, from, to, nodeOf, names, target, undefined);
  return plan;
}

/**
 * Plans the move of a model from layout `from`, some of whose devices are `lost`, to layout `to`
 * on devices that are not: each interval from a surviving holder, as planRealloc chooses, and one
 * that no survivor holds from the snapshot (`restores`). The bytes from survivors are the minimum
 * for what survives; nothing a survivor holds is read from the snapshot. `names`: only these
 * parameters (all when absent).
 */
export function planMigration(model: ModelInfo, from: Layout, to: Layout, nodeOf: (device: number) => number, lost: ReadonlySet<number>, names?: readonly string[]): MigrationPlan {
  const onLost = to.devices.filter((d) => lost.has(d));
  if (onLost.length) throw new Error(`the new layout places shards on device${onLost.length > 1 ? 's' : ''} ${onLost.join(', ')}, which the run has lost`);
  return plan_(model, from, to, nodeOf, names, model, lost);
}

function plan_(
  model: ModelInfo,
  from: Layout,
  to: Layout,
  nodeOf: (device: number) => number,
  names: readonly string[] | undefined,
  target: ModelInfo,
  lost: ReadonlySet<number> | undefined,
): MigrationPlan {
  const wanted = names ? new Set(names) : undefined;
  const held = holdings(model, from, wanted);
  const needed = holdings(target, to, wanted);
  const load = new Map<number, number>();
  const pieces: Piece[] = [];
  const locals: LocalCopy[] = [];
  const restores: Restore[] = [];
  let minimum = 0;
  let snapshotBytes = 0;

  for (const p of model.params) {
    const needs = needed.get(p.name);
    if (!needs) continue;
    const all = held.get(p.name) ?? [];
    if (all.length === 0) throw new Error(`no device of the source layout holds '${p.name}'`);
    const has = lost ? all.filter((h) => !lost.has(h.device)) : all;
    const rowElems = sliceElements(pieceSlice(p, 0, p.shape[p.splitAxis ?? 0]!)) / p.shape[p.splitAxis ?? 0]!;
    const points = [...new Set([...has, ...needs].flatMap((h) => [h.lo, h.hi]))].sort((a, b) => a - b);
    // Open pieces per node, to merge adjacent intervals with the same source and destinations.
    let open: Piece[] = [];
    for (let i = 0; i + 1 < points.length; i++) {
      const lo = points[i]!;
      const hi = points[i + 1]!;
      const holders = has.filter((h) => h.lo <= lo && h.hi >= hi);
      const holderDevices = new Set(holders.map((h) => h.device));
      const remote = new Map<number, number[]>(); // node → destinations
      for (const n of needs) {
        if (!(n.lo <= lo && n.hi >= hi)) continue;
        if (holders.length === 0) {
          // Only the lost held it: from the snapshot, merged with the same device's last interval.
          const last = [...restores].reverse().find((r) => r.device === n.device && r.name === p.name);
          if (last && last.axis !== null && last.end === lo) last.end = hi;
          else restores.push({ ...pieceSlice(p, lo, hi), device: n.device });
          snapshotBytes += (hi - lo) * rowElems * BYTES;
          continue;
        }
        if (holderDevices.has(n.device)) {
          locals.push({ ...pieceSlice(p, lo, hi), device: n.device });
          continue;
        }
        minimum += (hi - lo) * rowElems * BYTES;
        const node = nodeOf(n.device);
        (remote.get(node) ?? remote.set(node, []).get(node)!).push(n.device);
      }
      // One source per destination node; nodes that end up with the same source share its one
      // publish (NATS fans it out to every subscriber, wherever it is).
      const bySrc = new Map<number, number[]>();
      for (const [node, dsts] of [...remote.entries()].sort((a, b) => a[0] - b[0])) {
        const near = holders.filter((h) => nodeOf(h.device) === node);
        const pool = near.length ? near : holders;
        const src = pool.reduce((best, h) => {
          const lb = load.get(best.device) ?? 0;
          const lh = load.get(h.device) ?? 0;
          return lh < lb || (lh === lb && h.device < best.device) ? h : best;
        }).device;
        if (!bySrc.has(src)) load.set(src, (load.get(src) ?? 0) + (hi - lo) * rowElems * BYTES);
        bySrc.set(src, [...(bySrc.get(src) ?? []), ...dsts]);
      }
      const next: Piece[] = [];
      for (const [src, dsts] of bySrc) {
        dsts.sort((a, b) => a - b);
        const prev = open.find((o) => o.src === src && o.dsts.join() === dsts.join() && o.end === lo && o.axis !== null);
        if (prev) {
          prev.end = hi;
          next.push(prev);
        } else {
          const piece: Piece = { ...pieceSlice(p, lo, hi), src, dsts };
          pieces.push(piece);
          next.push(piece);
        }
      }
      open = next;
    }
  }
  // A merged piece may have grown to the whole axis: write it as a whole tensor.
  for (const piece of [...pieces, ...restores]) {
    const p = info(model, piece.name);
    if (piece.axis !== null && piece.start === 0 && piece.end === p.shape[piece.axis]) Object.assign(piece, { axis: null, start: 0, end: p.shape[0] ?? 1 });
  }
  const groups = new Map<string, TransferGroup>();
  for (const piece of pieces) {
    const key = `${piece.src}>${piece.dsts.join(',')}`;
    let g = groups.get(key);
    if (!g) groups.set(key, (g = { index: groups.size, src: piece.src, dsts: piece.dsts, pieces: [] }));
    const { src: _src, dsts: _dsts, ...slice } = piece;
    g.pieces.push(slice);
  }
  const received = pieces.reduce((n, p) => n + sliceElements(p) * BYTES * p.dsts.length, 0);
  const published = pieces.reduce((n, p) => n + sliceElements(p) * BYTES, 0);
  const devices = new Set<number>();
  for (const p of pieces) [p.src, ...p.dsts].forEach((d) => devices.add(d));
  for (const l of locals) devices.add(l.device);
  return {
    pieces,
    locals,
    transfers: [...groups.values()],
    receivedBytes: received,
    publishedBytes: published,
    minimumBytes: minimum,
    devices: [...devices].sort((a, b) => a - b),
    restores,
    snapshotBytes,
  };
}
