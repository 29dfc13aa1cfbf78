// Keys and values of every position decoded so far, per layer, for the rows and heads a rank
// generates: prefill the prompt in one pass, then one position per step, each attending to what
// is cached. Where the backend's memory is in the host's reach (wasm, cpu) the cache is allocated
// once, for the whole sequence, and each step writes its position in place, so a step costs the
// same at position 16 as at position 256; the attention runs over the whole capacity with the
// positions not yet written masked out. Elsewhere each step appends by concatenation.
import * as tf from '@tensorflow/tfjs';
import { totalmem } from 'node:os';
import { hostView } from './staging.ts';
import { paddedMask } from './gpt.ts';

/**
 * Bytes a cache of `rows` sequences (× heads), `headSize`, `capacity` positions and `layers` layers
 * holds: keys and values, of `bytes` each (4: float32, what the runtime keeps). The runtime sizes
 * and refuses its caches by it, and the planner prices decoding memory and traffic by it.
 */
export function kvCacheBytes(rows: number, headSize: number, capacity: number, layers: number, bytes = 4): number {
  return 2 * rows * headSize * capacity * layers * bytes;
}

/** The wasm backend's heap cannot grow past this (emscripten's getHeapMax in tfjs-backend-wasm). */
export const WASM_HEAP_MAX = 4294901760;

/**
 * The most bytes this process's backend can hold in tensors, and what sets it: the wasm heap's
 * maximum on wasm; the host's memory elsewhere (a GPU's own memory is not visible to TensorFlow.js).
 */
export function backendMemoryLimit(): { bytes: number; what: string } {
  if (tf.getBackend() === 'wasm') return { bytes: WASM_HEAP_MAX, what: "the wasm heap's maximum" };
  return { bytes: totalmem(), what: "the host's memory" };
}

/** Bytes in the largest unit that keeps the number at least 1: B, KiB, MiB or GiB. */
export function bytesText(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB'];
  let i = 0;
  while (i < units.length - 1 && Math.abs(n) >= 1024 ** (i + 1)) i += 1;
  return i === 0 ? `${n} B` : `${(n / 1024 ** i).toFixed(1)} ${units[i]}`;
}

/**
 * Why a cache of `need` bytes cannot be allocated now, or undefined: it must fit beside what the
 * backend already holds, under `limit` bytes (default: backendMemoryLimit()).
 */
export function kvCacheProblem(need: number, limit?: number): string | undefined {
  const cap = limit === undefined ? backendMemoryLimit() : { bytes: limit, what: 'the memory given to the call' };
  const held = tf.memory().numBytes;
  if (need <= cap.bytes - held) return undefined;
  return `its KV cache needs ${bytesText(need)}, and the device has ${bytesText(Math.max(0, cap.bytes - held))} free (${bytesText(held)} held of ${bytesText(cap.bytes)}, ${cap.what}); generate fewer sequences at once or shorter responses`;
}

interface LayerCache {
  /** Keys, transposed: [rows, hd, capacity] (in place) or [rows, hd, length] (appended). */
  kT: tf.Tensor;
  /** Values: [rows, capacity, hd] or [rows, length, hd]. */
  v: tf.Tensor;
}

export class KvCache {
  private readonly layers = new Map<number, LayerCache>();
  /** Positions written so far. */
  length = 0;
  private readonly inPlace: boolean;

  /**
   * `rows`: sequences × this rank's heads; `headSize`: elements per head; `capacity`: prompt plus
   * response, the most positions it will hold.
   */
  constructor(
    /** Sequences × heads held now (fewer after `keep`). */
    public rows: number,
    readonly headSize: number,
    readonly capacity: number,
    options: { inPlace?: boolean } = {},
  ) {
    const probe = tf.zeros([1]);
    // `inPlace: false` takes the path of a backend whose memory the host cannot reach (tests).
    this.inPlace = hostView(probe) !== undefined && options.inPlace !== false;
    probe.dispose();
  }

  /**
   * Writes the keys (kT [rows, hd, n]) and values (v [rows, n, hd]) of positions
   * [start, start + n) of layer `l`, then returns the layer's keys and values to attend to: all
   * of the capacity when written in place (later positions masked by `mask`), else what is
   * cached. With `start` per sequence (an Int32Array of rows ÷ heads), each sequence's positions
   * start at its own (episodes of several turns): the layer is then always the whole capacity.
   * The caller keeps nothing it got from an earlier step.
   */
  write(l: number, start: number | Int32Array, kT: tf.Tensor, v: tf.Tensor): LayerCache {
    const n = v.shape[1]!;
    const { rows, headSize: hd, capacity: C } = this;
    const per = typeof start === 'number' ? undefined : start;
    const startOf = (r: number) => (per ? per[Math.floor((r * per.length) / rows)]! : (start as number));
    const last = per ? Math.max(...per) : (start as number);
    if (last + n > this.capacity) throw new RangeError(`the KV cache holds ${this.capacity} positions; positions ${last}-${last + n} do not fit`);
    let layer = this.layers.get(l);
    if (!this.inPlace && per) return this.place(l, per, kT, v);
    if (!this.inPlace) {
      // Kept: a caller's tf.tidy must not take the cache with it.
      if (!layer) layer = { kT: tf.keep(kT.clone()), v: tf.keep(v.clone()) };
      else {
        const next = { kT: tf.keep(tf.concat([layer.kT, kT], 2)), v: tf.keep(tf.concat([layer.v, v], 1)) };
        tf.dispose([layer.kT, layer.v]);
        layer = next;
      }
      this.layers.set(l, layer);
      return layer;
    }
    if (!layer) {
      layer = { kT: tf.keep(tf.zeros([rows, hd, C])), v: tf.keep(tf.zeros([rows, C, hd])) };
      this.layers.set(l, layer);
    }
    const [k, vv] = [kT.dataSync() as Float32Array, v.dataSync() as Float32Array];
    // Views taken after the reads: a read may grow the heap, which moves it.
    const [kc, vc] = [hostView(layer.kT)!, hostView(layer.v)!];
    // Keys go in column by column (a step writes one element per row of kT: no subarray per element).
    for (let rd = 0; rd < rows * hd; rd++) {
      const at = startOf(Math.floor(rd / hd));
      for (let j = 0; j < n; j++) kc[rd * C + at + j] = k[rd * n + j]!;
    }
    for (let r = 0; r < rows; r++) vc.set(vv.subarray(r * n * hd, (r + 1) * n * hd), (r * C + startOf(r)) * hd);
    return layer;
  }

  /**
   * write() with a start per sequence where the backend's memory is out of the host's reach: the
   * new columns are placed by a one-hot product (exact: each output is one value times 1 plus
   * zeros) and the rest of the capacity kept, so the layer is always [rows, ·, capacity].
   */
  private place(l: number, starts: Int32Array, kT: tf.Tensor, v: tf.Tensor): LayerCache {
    const n = v.shape[1]!;
    const { rows, headSize: hd, capacity: C } = this;
    const onehot = new Float32Array(rows * n * C);
    for (let r = 0; r < rows; r++) {
      const at = starts[Math.floor((r * starts.length) / rows)]!;
      for (let j = 0; j < n; j++) onehot[(r * n + j) * C + at + j] = 1;
    }
    const old = this.layers.get(l) ?? { kT: tf.zeros([rows, hd, C]), v: tf.zeros([rows, C, hd]) };
    const next = tf.tidy(() => {
      const P = tf.tensor3d(onehot, [rows, n, C]);
      const keepK = tf.sub(1, tf.sum(P, 1, true)); // [rows, 1, C]
      const kNew = tf.add(tf.mul(old.kT, keepK), tf.matMul(kT as tf.Tensor3D, P));
      const vNew = tf.add(tf.mul(old.v, tf.reshape(keepK, [rows, C, 1])), tf.matMul(P, v as tf.Tensor3D, true, false));
      return { kT: tf.keep(kNew), v: tf.keep(vNew) };
    });
    tf.dispose([old.kT, old.v]);
    this.layers.set(l, next);
    return next;
  }

  /**
   * The additive mask of queries at positions [start, start + n) over the keys the cache hands
   * out: a query sees its own position and every earlier one, nothing later (nor, in place, any
   * position not yet written); with `pads`, per row, [rows, 1, n, width], nor its left padding.
   * With `start` per sequence, always per row over the whole capacity.
   */
  mask(start: number | Int32Array, n: number, pads?: Int32Array): tf.Tensor {
    if (typeof start !== 'number') {
      const C = this.capacity;
      const m = new Float32Array(start.length * n * C);
      for (let b = 0; b < start.length; b++) {
        const lo = pads?.[b] ?? 0;
        for (let i = 0; i < n; i++) for (let j = 0; j < C; j++) if (j > start[b]! + i || j < lo) m[(b * n + i) * C + j] = -1e9;
      }
      return tf.tensor4d(m, [start.length, 1, n, C]);
    }
    const width = this.inPlace ? this.capacity : start + n;
    if (pads) return paddedMask(pads, n, width, start);
    const m = new Float32Array(n * width);
    for (let i = 0; i < n; i++) for (let j = start + i + 1; j < width; j++) m[i * width + j] = -1e9;
    return tf.tensor2d(m, [n, width]);
  }

  /**
   * Keeps only the sequences `seqs` (indices of the sequences held now, in the order they are to
   * be held), each with its `heads` rows: every layer's keys and values are gathered down to them,
   * exactly (a generation whose other rows have ended stops attending over theirs).
   */
  keep(seqs: ArrayLike<number>, heads: number): void {
    const idx = Int32Array.from({ length: seqs.length * heads }, (_, i) => seqs[Math.floor(i / heads)]! * heads + (i % heads));
    const at = tf.tensor1d(idx, 'int32');
    for (const [l, layer] of this.layers) {
      const next = { kT: tf.keep(tf.gather(layer.kT, at)), v: tf.keep(tf.gather(layer.v, at)) };
      tf.dispose([layer.kT, layer.v]);
      this.layers.set(l, next);
    }
    at.dispose();
    this.rows = idx.length;
  }

  dispose(): void {
    for (const layer of this.layers.values()) tf.dispose([layer.kT, layer.v]);
    this.layers.clear();
  }
}
