// Layouts as pure data: which slice of which tensor lives on which device. A layout is a mesh of
// devices and a dp × tp × pp strategy over it; ranks are laid out tp fastest, then pp, then dp,
// so that a tensor-parallel group sits on neighbouring devices (inside one node).
//
// The model is described generically (mesh/ knows nothing of engine/ models): each parameter
// names its layer and the axis along which tensor parallelism cuts it, if any.

export interface Strategy {
  dp: number;
  tp: number;
  pp: number;
}

export interface Layout extends Strategy {
  /** Global device indices; rank r runs on devices[r]. */
  devices: number[];
}

export interface ParamInfo {
  name: string;
  shape: number[];
  /** Pipeline placement: a layer index, or the embedding (first stage) or the head (last stage). */
  layer: number | 'embed' | 'head';
  /** The axis tensor parallelism splits (Megatron column/row split), or null when replicated. */
  splitAxis: number | null;
}

export interface ModelInfo {
  layers: number;
  params: ParamInfo[];
}

export interface Coords {
  dp: number;
  pp: number;
  tp: number;
}

export class LayoutError extends Error {
  override name = 'LayoutError';
}

export function rankCoords(s: Strategy, rank: number): Coords {
  return { tp: rank % s.tp, pp: Math.floor(rank / s.tp) % s.pp, dp: Math.floor(rank / (s.tp * s.pp)) };
}

export function rankOf(s: Strategy, c: Coords): number {
  return (c.dp * s.pp + c.pp) * s.tp + c.tp;
}

export function layoutKey(l: Layout): string {
  return `${l.devices.join(',')}/dp${l.dp}tp${l.tp}pp${l.pp}`;
}

const count = (shape: readonly number[]) => shape.reduce((a, b) => a * b, 1);

/**
 * Splits layers 0..L-1 into `pp` contiguous stages balanced by parameter count (the embedding
 * weighs on the first stage, the head on the last): the partition whose heaviest stage is
 * lightest, found exactly by dynamic programming. Returns the first layer of each stage and L.
 */
export function stageBounds(model: ModelInfo, pp: number): number[] {
  const L = model.layers;
  if (pp > L) throw new LayoutError(`pp=${pp} needs at least ${pp} layers; the model has ${L}`);
  const w = new Array<number>(L).fill(0);
  let embed = 0;
  let head = 0;
  for (const p of model.params) {
    if (p.layer === 'embed') embed += count(p.shape);
    else if (p.layer === 'head') head += count(p.shape);
    else w[p.layer]! += count(p.shape);
  }
  // weight of layers [a, b) as stage s of pp
  const prefix = [0];
  for (const x of w) prefix.push(prefix.at(-1)! + x);
  const cost = (a: number, b: number, s: number) => prefix[b]! - prefix[a]! + (s === 0 ? embed : 0) + (s === pp - 1 ? head : 0);
  // best[s][b]: lightest heaviest stage when stages 0..s cover layers [0, b); ties go to earlier cuts.
  const best: number[][] = Array.from({ length: pp }, () => new Array<number>(L + 1).fill(Infinity));
  const cut: number[][] = Array.from({ length: pp }, () => new Array<number>(L + 1).fill(-1));
  for (let b = 1; b <= L; b++) best[0]![b] = cost(0, b, 0);
  for (let s = 1; s < pp; s++) {
    for (let b = s + 1; b <= L; b++) {
      for (let a = s; a < b; a++) {
        const v = Math.max(best[s - 1]![a]!, cost(a, b, s));
        if (v < best[s]![b]!) {
          best[s]![b] = v;
          cut[s]![b] = a;
        }
      }
    }
  }
  const bounds = [L];
  for (let s = pp - 1, b = L; s > 0; s--) {
    b = cut[s]![b]!;
    bounds.unshift(b);
  }
  bounds.unshift(0);
  return bounds;
}

export function stageOfLayer(bounds: readonly number[], layer: ParamInfo['layer']): number {
  const pp = bounds.length - 1;
  if (layer === 'embed') return 0;
  if (layer === 'head') return pp - 1;
  for (let s = 0; s < pp; s++) if (layer < bounds[s + 1]!) return s;
  throw new LayoutError(`layer ${layer} is outside the model`);
}

/** A contiguous range along one axis of a parameter, or the whole of it (axis null). */
export interface Slice {
  name: string;
  /** The full parameter's shape. */
  shape: number[];
  axis: number | null;
  start: number;
  end: number;
}

export function sliceShape(s: Slice): number[] {
  if (s.axis === null) return [...s.shape];
  const out = [...s.shape];
  out[s.axis] = s.end - s.start;
  return out;
}

export function sliceElements(s: Slice): number {
  return count(sliceShape(s));
}

export function sliceKey(s: Slice): string {
  return s.axis === null ? s.name : `${s.name}[${s.axis}:${s.start}:${s.end}]`;
}

/** Checks a strategy against a model: tp must divide every split axis, pp must not exceed the layers. */
export function checkStrategy(model: ModelInfo, s: Strategy): string[] {
  const problems: string[] = [];
  if (s.pp > model.layers) problems.push(`pp=${s.pp} exceeds the model's ${model.layers} layers`);
  for (const p of model.params) {
    if (p.splitAxis !== null && p.shape[p.splitAxis]! % s.tp !== 0) {
      problems.push(`tp=${s.tp} does not divide axis ${p.splitAxis} (${p.shape[p.splitAxis]}) of '${p.name}'`);
      break;
    }
  }
  return problems;
}

/** The slices held by one rank of a layout, in the model's parameter order. */
export function shardSlices(model: ModelInfo, layout: Strategy, rank: number, bounds = stageBounds(model, layout.pp)): Slice[] {
  const c = rankCoords(layout, rank);
  const out: Slice[] = [];
  for (const p of model.params) {
    if (stageOfLayer(bounds, p.layer) !== c.pp) continue;
    if (p.splitAxis === null || layout.tp === 1) {
      out.push({ name: p.name, shape: p.shape, axis: null, start: 0, end: p.shape[0] ?? 1 });
    } else {
      const size = p.shape[p.splitAxis]! / layout.tp;
      out.push({ name: p.name, shape: p.shape, axis: p.splitAxis, start: c.tp * size, end: (c.tp + 1) * size });
    }
  }
  return out;
}

/** The range along `axis` that a slice covers (the whole axis when the slice is whole). */
export function rangeOn(s: Slice, axis: number): [number, number] {
  return s.axis === axis ? [s.start, s.end] : [0, s.shape[axis]!];
}
