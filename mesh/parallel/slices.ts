// Cutting ranges out of row-major tensors and writing them back, along any axis.
import { sliceShape, type Slice } from './layout.ts';

/** Outer count, axis length and inner count of a shape around `axis`. */
function around(shape: readonly number[], axis: number): [number, number, number] {
  let outer = 1;
  let inner = 1;
  for (let i = 0; i < axis; i++) outer *= shape[i]!;
  for (let i = axis + 1; i < shape.length; i++) inner *= shape[i]!;
  return [outer, shape[axis]!, inner];
}

/**
 * Elements [from, to) along `axis` of a row-major tensor of `shape`. A range that is contiguous in
 * memory (nothing outside the axis) comes back as a view of `data`, otherwise as a new array.
 */
export function extract(data: Float32Array, shape: readonly number[], axis: number, from: number, to: number): Float32Array {
  const [outer, len, inner] = around(shape, axis);
  if (from < 0 || to > len || from > to) throw new RangeError(`range ${from}-${to} is outside axis ${axis} of length ${len}`);
  if (outer === 1) return data.subarray(from * inner, to * inner);
  const width = (to - from) * inner;
  const out = new Float32Array(outer * width);
  for (let o = 0; o < outer; o++) out.set(data.subarray(o * len * inner + from * inner, o * len * inner + to * inner), o * width);
  return out;
}

/** Writes `src` (the range [at, at + its length) along `axis`) into `dst` of `shape`. */
export function insert(dst: Float32Array, shape: readonly number[], axis: number, at: number, src: Float32Array): void {
  const [outer, len, inner] = around(shape, axis);
  const width = src.length / outer;
  if (!Number.isInteger(width) || at * inner + width > len * inner) throw new RangeError(`a block of ${src.length} elements does not fit axis ${axis} of [${shape}] at ${at}`);
  for (let o = 0; o < outer; o++) dst.set(src.subarray(o * width, (o + 1) * width), o * len * inner + at * inner);
}

/**
 * The part `want` of a tensor held as slice `held` (same parameter). Both are ranges along the
 * same axis, or whole; `want` must lie inside `held`. It may share memory with `heldData`.
 */
export function cut(heldData: Float32Array, held: Slice, want: Slice): Float32Array {
  if (want.axis === null) {
    if (held.axis !== null) throw new RangeError(`'${want.name}': the whole tensor is wanted, only a slice is held`);
    return heldData;
  }
  const offset = held.axis === null ? 0 : held.start;
  if (held.axis !== null && held.axis !== want.axis) throw new RangeError(`'${want.name}': held along axis ${held.axis}, wanted along ${want.axis}`);
  // All of what is held: no copy.
  if (held.axis === want.axis && held.start === want.start && held.end === want.end) return heldData;
  if (want.start < offset || want.end > (held.axis === null ? held.shape[want.axis]! : held.end)) {
    throw new RangeError(`'${want.name}': range ${want.start}-${want.end} is not inside the held slice`);
  }
  return extract(heldData, sliceShape(held), want.axis, want.start - offset, want.end - offset);
}

/** Writes piece `part` into a tensor held as slice `target`. */
export function paste(targetData: Float32Array, target: Slice, part: Slice, partData: Float32Array): void {
  if (part.axis === null) {
    if (target.axis !== null) throw new RangeError(`'${part.name}': a whole tensor cannot go into a slice`);
    targetData.set(partData);
    return;
  }
  const offset = target.axis === null ? 0 : target.start;
  insert(targetData, sliceShape(target), part.axis, part.start - offset, partData);
}

/**
 * Writes elements [offset, offset + data.length) of piece `part`, in the piece's own row-major
 * order, into a tensor held as slice `target`: what `paste` does for a whole piece, for the part
 * of it that one chunk carries.
 */
export function pasteRange(targetData: Float32Array, target: Slice, part: Slice, offset: number, data: Float32Array): void {
  if (part.axis === null) {
    if (target.axis !== null) throw new RangeError(`'${part.name}': a whole tensor cannot go into a slice`);
    if (offset + data.length > targetData.length) throw new RangeError(`'${part.name}': elements ${offset}-${offset + data.length} run past its ${targetData.length}`);
    targetData.set(data, offset);
    return;
  }
  const [outer, len, inner] = around(sliceShape(target), part.axis);
  const at = part.start - (target.axis === null ? 0 : target.start);
  const width = (part.end - part.start) * inner; // one row of the piece
  if (at < 0 || at * inner + width > len * inner || offset + data.length > outer * width) {
    throw new RangeError(`'${part.name}': elements ${offset}-${offset + data.length} of range ${part.start}-${part.end} do not fit the held slice`);
  }
  for (let i = 0; i < data.length; ) {
    const row = Math.floor((offset + i) / width);
    const col = (offset + i) % width;
    const n = Math.min(width - col, data.length - i);
    targetData.set(data.subarray(i, i + n), row * len * inner + at * inner + col);
    i += n;
  }
}
