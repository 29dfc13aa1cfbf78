// Keys and values of every position decoded so far, per layer, for the rows and heads a rank
// generates: prefill the prompt in one pass, then one position per step, each attending to what
// is cached. Where the backend's memory is in the host's reach (wasm, cpu) each step writes its
// position in place into a cache that grows by KV_GROWTH positions at a time, up to the capacity:
// the attention runs over the positions allocated so far (at most KV_GROWTH more than are written),
// those not yet written masked out, so a step near the start of a long budget costs what it does
// in a short one. Growing copies what the layer holds (64 times over 1024 positions: a few percent
// of what the steps read). Elsewhere each step appends by concatenation. Either way the attention
// is exact: a masked position adds a zero.
import * as tf from '@tensorflow/tfjs';
import { totalmem } from 'node:os';
import { hostView } from './backend/staging.ts';
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

/**
 * One layer's cache, laid out for the products attention takes of it (blocks.ts, batchMatMulT):
 * queries by keys, and probabilities by values, each with the summed axis innermost.
 */
interface LayerCache {
  /** Keys: [rows, width, hd] (in place) or [rows, length, hd] (appended). */
  k: tf.Tensor;
  /** Values, transposed: [rows, hd, width] or [rows, hd, length]. */
  vT: tf.Tensor;
}

/** Positions a cache written in place grows by: its width is at most this many past what is written. */
export const KV_GROWTH = 16;

export class KvCache {
  private readonly layers = new Map<number, LayerCache>();
  private readonly inPlace: boolean;
  /**
   * Positions allocated in every layer written in place (and by the one-hot placement): the
   * furthest position written so far rounded up to KV_GROWTH, at most the capacity; what a layer
   * hands out and what `mask` covers.
   */
  width = 0;

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
   * of the cache's width when written in place (later positions masked by `mask`), else what is
   * cached. With `start` per sequence (an Int32Array of rows ÷ heads), each sequence's positions
   * start at its own (episodes of several turns): the layer is then always the cache's width.
   * The caller keeps nothing it got from an earlier step.
   */
  write(l: number, start: number | Int32Array, kT: tf.Tensor, v: tf.Tensor): LayerCache {
    const n = v.shape[1]!;
    const { rows, headSize: hd } = this;
    const per = typeof start === 'number' ? undefined : start;
    const startOf = (r: number) => (per ? per[Math.floor((r * per.length) / rows)]! : (start as number));
    const last = per ? Math.max(...per) : (start as number);
    if (last + n > this.capacity) throw new RangeError(`the KV cache holds ${this.capacity} positions; positions ${last}-${last + n} do not fit`);
    this.grow(last + n);
    let layer = this.layers.get(l);
    if (!this.inPlace && per) return this.place(l, per, kT, v);
    if (!this.inPlace) {
      // Kept: a caller's tf.tidy must not take the cache with it.
      const [k, vT] = tf.tidy(() => [tf.transpose(kT, [0, 2, 1]), tf.transpose(v, [0, 2, 1])]);
      if (!layer) layer = { k: tf.keep(k), vT: tf.keep(vT) };
      else {
        const next = { k: tf.keep(tf.concat([layer.k, k], 1)), vT: tf.keep(tf.concat([layer.vT, vT], 2)) };
        tf.dispose([layer.k, layer.vT, k, vT]);
        layer = next;
      }
      this.layers.set(l, layer);
      return layer;
    }
    layer = this.widened(l, layer);
    const W = this.width;
    const [kIn, vIn] = [kT.dataSync() as Float32Array, v.dataSync() as Float32Array];
    // Views taken after the reads: a read may grow the heap, which moves it.
    const [kc, vc] = [hostView(layer.k)!, hostView(layer.vT)!];
    // kT [rows, hd, n] into k [rows, W, hd]; v [rows, n, hd] into vT [rows, hd, W], column by column.
    for (let r = 0; r < rows; r++) {
      const at = startOf(r);
      for (let d = 0; d < hd; d++) {
        for (let j = 0; j < n; j++) {
          kc[(r * W + at + j) * hd + d] = kIn[(r * hd + d) * n + j]!;
          vc[(r * hd + d) * W + at + j] = vIn[(r * n + j) * hd + d]!;
        }
      }
    }
    return layer;
  }

  /** Widens the cache (not yet its layers) to hold positions up to `end`, by whole KV_GROWTH steps, at most to the capacity. */
  private grow(end: number): void {
    this.width = Math.max(this.width, Math.min(this.capacity, Math.ceil(end / KV_GROWTH) * KV_GROWTH));
  }

  /**
   * Layer `l` at the cache's width: allocated (zeros) if it is not yet, else padded with zeros
   * after what it holds (a copy of it, exact) if the width grew since it was written.
   */
  private widened(l: number, layer: LayerCache | undefined): LayerCache {
    const { rows, headSize: hd, width: W } = this;
    if (layer && layer.k.shape[1] === W) return layer;
    const next = layer
      ? tf.tidy(() => {
          const more = W - layer.k.shape[1]!;
          return {
            k: tf.keep(
              tf.pad(layer.k, [
                [0, 0],
                [0, more],
                [0, 0],
              ]),
            ),
            vT: tf.keep(
              tf.pad(layer.vT, [
                [0, 0],
                [0, 0],
                [0, more],
              ]),
            ),
          };
        })
      : { k: tf.keep(tf.zeros([rows, W, hd])), vT: tf.keep(tf.zeros([rows, hd, W])) };
    if (layer) tf.dispose([layer.k, layer.vT]);
    this.layers.set(l, next);
    return next;
  }

  /**
   * write() with a start per sequence where the backend's memory is out of the host's reach: the
   * new columns are placed by a one-hot product (exact: each output is one value times 1 plus
   * zeros) and the rest of the layer kept, so the layer is always [rows, ·, width].
   */
  private place(l: number, starts: Int32Array, kT: tf.Tensor, v: tf.Tensor): LayerCache {
    const n = v.shape[1]!;
    const { rows, width: C } = this;
    const onehot = new Float32Array(rows * n * C);
    for (let r = 0; r < rows; r++) {
      const at = starts[Math.floor((r * starts.length) / rows)]!;
      for (let j = 0; j < n; j++) onehot[(r * n + j) * C + at + j] = 1;
    }
    const old = this.widened(l, this.layers.get(l));
    const next = tf.tidy(() => {
      const P = tf.tensor3d(onehot, [rows, n, C]);
      const kept = tf.sub(1, tf.sum(P, 1, true)); // [rows, 1, C]
      const kNew = tf.add(tf.mul(old.k, tf.reshape(kept, [rows, C, 1])), tf.matMul(P, tf.transpose(kT, [0, 2, 1]) as tf.Tensor3D, true, false));
      const vNew = tf.add(tf.mul(old.vT, kept), tf.matMul(tf.transpose(v, [0, 2, 1]) as tf.Tensor3D, P));
      return { k: tf.keep(kNew), vT: tf.keep(vNew) };
    });
    tf.dispose([old.k, old.vT]);
    this.layers.set(l, next);
    return next;
  }

  /**
   * The additive mask of queries at positions [start, start + n) over the keys the cache hands
   * out for them (its width widens to hold them, as their write does): a query sees its own
   * position and every earlier one, nothing later (nor, in place, any position not yet written);
   * with `pads`, per row, [rows, 1, n, width], nor its left padding. With `start` per sequence,
   * always per row over the cache's width.
   */
  mask(start: number | Int32Array, n: number, pads?: Int32Array): tf.Tensor {
    this.grow((typeof start === 'number' ? start : Math.max(...start)) + n);
    if (typeof start !== 'number') {
      const C = this.width;
      const m = new Float32Array(start.length * n * C);
      for (let b = 0; b < start.length; b++) {
        const lo = pads?.[b] ?? 0;
        for (let i = 0; i < n; i++) for (let j = 0; j < C; j++) if (j > start[b]! + i || j < lo) m[(b * n + i) * C + j] = -1e9;
      }
      return tf.tensor4d(m, [start.length, 1, n, C]);
    }
    const width = this.inPlace ? this.width : start + n;
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
      const next = { k: tf.keep(tf.gather(layer.k, at)), vT: tf.keep(tf.gather(layer.vT, at)) };
      tf.dispose([layer.k, layer.vT]);
      this.layers.set(l, next);
    }
    at.dispose();
    this.rows = idx.length;
  }

  /**
   * A new cache holding copies of sequences `seqs` (indices of the sequences held now, in that
   * order), each with its `heads` rows: every layer's keys and values at this cache's width, exactly
   * (what `put` places back; episodes waiting on their environment leave their slots so).
   */
  take(seqs: ArrayLike<number>, heads: number): KvCache {
    const out = new KvCache(seqs.length * heads, this.headSize, this.capacity, { inPlace: this.inPlace });
    out.width = this.width;
    if (this.inPlace) {
      // Copied out of the host's view of each layer, row by row (a gather on the backend costs more).
      const hd = this.headSize;
      for (const [l, layer] of this.layers) {
        const W = layer.k.shape[1]!;
        const [kc, vc] = [hostView(layer.k)!, hostView(layer.vT)!];
        const k = new Float32Array(out.rows * W * hd);
        const vT = new Float32Array(out.rows * hd * W);
        for (let i = 0; i < out.rows; i++) {
          const r = seqs[Math.floor(i / heads)]! * heads + (i % heads);
          k.set(kc.subarray(r * W * hd, (r + 1) * W * hd), i * W * hd);
          vT.set(vc.subarray(r * hd * W, (r + 1) * hd * W), i * hd * W);
        }
        out.layers.set(l, { k: tf.keep(tf.tensor3d(k, [out.rows, W, hd])), vT: tf.keep(tf.tensor3d(vT, [out.rows, hd, W])) });
      }
      return out;
    }
    const at = tf.tensor1d(
      Int32Array.from({ length: seqs.length * heads }, (_, i) => seqs[Math.floor(i / heads)]! * heads + (i % heads)),
      'int32',
    );
    for (const [l, layer] of this.layers) out.layers.set(l, { k: tf.keep(tf.gather(layer.k, at)), vT: tf.keep(tf.gather(layer.vT, at)) });
    at.dispose();
    return out;
  }

  /**
   * Sequences `into` (indices of the sequences held now) take `from`'s sequences, in order, each
   * with its `heads` rows: every layer's keys and values at the positions `from` holds, exactly (a
   * selection, no arithmetic). What an overwritten sequence held past them stays, masked for the
   * newcomer until its own writes reach it (continuous generation: a prompt prefilled alone takes
   * the slot of a sequence that ended).
   */
  put(into: ArrayLike<number>, from: KvCache, heads: number): void {
    if (from.rows !== into.length * heads) throw new RangeError(`put: ${from.rows} rows come for ${into.length} sequences of ${heads} heads`);
    if (from.headSize !== this.headSize) throw new RangeError(`put: heads of ${from.headSize} into a cache of heads of ${this.headSize}`);
    const source = new Int32Array(this.rows);
    const taken = new Uint8Array(this.rows);
    for (let j = 0; j < into.length; j++) {
      for (let h = 0; h < heads; h++) {
        source[into[j]! * heads + h] = j * heads + h;
        taken[into[j]! * heads + h] = 1;
      }
    }
    for (const [l, theirs] of from.layers) {
      this.grow(theirs.k.shape[1]!);
      const mine = this.widened(l, this.layers.get(l));
      const W = this.width;
      const Wf = theirs.k.shape[1]!;
      if (this.inPlace) {
        // Row by row in the host's view of the layer: k [rows, W, hd] holds a row's positions
        // together; vT [rows, hd, W] a row's positions of one element together.
        const hd = this.headSize;
        const [kIn, vIn] = [theirs.k.dataSync() as Float32Array, theirs.vT.dataSync() as Float32Array];
        const [kc, vc] = [hostView(mine.k)!, hostView(mine.vT)!];
        for (let r = 0; r < this.rows; r++) {
          if (!taken[r]) continue;
          const j = source[r]!;
          kc.set(kIn.subarray(j * Wf * hd, (j + 1) * Wf * hd), r * W * hd);
          for (let d = 0; d < hd; d++) vc.set(vIn.subarray((j * hd + d) * Wf, (j * hd + d + 1) * Wf), (r * hd + d) * W);
        }
        continue;
      }
      const next = tf.tidy(() => {
        const more = W - theirs.k.shape[1]!;
        const k = tf.pad(theirs.k, [
          [0, 0],
          [0, more],
          [0, 0],
        ]);
        const vT = tf.pad(theirs.vT, [
          [0, 0],
          [0, 0],
          [0, more],
        ]);
        const at = tf.tensor1d(source, 'int32');
        const cond = tf.tensor3d(taken, [taken.length, 1, 1], 'bool');
        return { k: tf.keep(tf.where(cond, tf.gather(k, at), mine.k)), vT: tf.keep(tf.where(cond, tf.gather(vT, at), mine.vT)) };
      });
      tf.dispose([mine.k, mine.vT]);
      this.layers.set(l, next);
    }
  }

  dispose(): void {
    for (const layer of this.layers.values()) tf.dispose([layer.k, layer.vT]);
    this.layers.clear();
  }
}
