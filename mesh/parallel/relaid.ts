// A rank moved onto another layout of its model, on the same device: the pieces of its new slices
// that it held on the old layout (copied in place) and the pieces it lacks (sent to it). A
// recovery or an elastic migration sends each device only what it lacks this way.
import { sliceShape, shardSlices, type Layout, type ModelInfo, type Slice } from './layout.ts';
import { cut, paste } from './slices.ts';

/** A rank of a layout. */
export interface RankOn {
  layout: Layout;
  rank: number;
}

/** One slice of the new rank: what of it the old rank held (each piece with the old slice it is cut from) and what it lacks. */
export interface RelaidSlice {
  slice: Slice;
  held: Array<{ piece: Slice; from: Slice }>;
  missing: Slice[];
}

/** A piece's name on the wire: the parameter's, with its range when it is not the whole tensor. */
export function pieceName(p: Slice): string {
  return p.axis === null ? p.name : `${p.name}[${p.axis}:${p.start}-${p.end}]`;
}

const range = (s: Slice, axis: number, start: number, end: number): Slice => ({ name: s.name, shape: s.shape, axis, start, end });

/** What the old rank's slice `h` (undefined: none of the parameter) holds of the new slice `w`. */
function split(w: Slice, h: Slice | undefined): RelaidSlice {
  if (!h) return { slice: w, held: [], missing: [w] };
  if (h.axis === null) return { slice: w, held: [{ piece: w, from: h }], missing: [] };
  const axis = h.axis;
  if (w.axis !== null && w.axis !== axis) return { slice: w, held: [], missing: [w] };
  const [ws, we] = w.axis === null ? [0, w.shape[axis]!] : [w.start, w.end];
  const from = Math.max(ws, h.start);
  const to = Math.min(we, h.end);
  if (from >= to) return { slice: w, held: [], missing: [w] };
  const missing = [...(ws < from ? [range(w, axis, ws, from)] : []), ...(to < we ? [range(w, axis, to, we)] : [])];
  return { slice: w, held: [{ piece: range(w, axis, from, to), from: h }], missing };
}

/**
 * The new rank's slices, each split into what the old rank of the same model held and what it
 * lacks. `stale`: parameters whose held elements are not the ones wanted (what trains, on a shard
 * that went on past the snapshot it is moved back to): lacked whole.
 */
export function relaidSlices(model: ModelInfo, from: RankOn, to: RankOn, stale: (name: string) => boolean = () => false): RelaidSlice[] {
  const old = new Map(shardSlices(model, from.layout, from.rank).map((s) => [s.name, s]));
  return shardSlices(model, to.layout, to.rank).map((w) => split(w, stale(w.name) ? undefined : old.get(w.name)));
}

/**
 * A new slice's elements: its held pieces cut from the old slice's data (`held(name)`), its
 * missing pieces from `missing(pieceName)`.
 */
export function assemble(s: RelaidSlice, held: (name: string) => Float32Array, missing: (name: string) => Float32Array): Float32Array {
  const out = new Float32Array(sliceShape(s.slice).reduce((a, b) => a * b, 1));
  for (const h of s.held) paste(out, s.slice, h.piece, cut(held(h.from.name), h.from, h.piece));
  for (const p of s.missing) paste(out, s.slice, p, missing(pieceName(p)));
  return out;
}
