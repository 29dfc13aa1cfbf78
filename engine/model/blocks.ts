// The transformer's blocks as GptRank runs them: each forward pass can keep what its backward
// pass needs, and each backward pass is written out by hand. The point is speed: the products a
// backward pass is made of (xᵀ·dy, dy·wᵀ, pᵀ·dy, …) are slow on the wasm backend when asked for
// with a transposed operand (0.4 GFLOP/s against 10–17 for the plain product), so every product
// here is a plain one, on operands transposed explicitly first. Rows are 2-D, [N, D] with
// N = batch × tokens; attention reshapes to [B, H, T, hd] inside.
//
// Both families' blocks are here: GPT-2's (layer norm, GELU MLP, learned positions) and LLaMA's
// (RMSNorm, SwiGLU MLP, rotary positions, grouped-query attention). The reference these are
// checked against is gpt.ts's forward, differentiated by TensorFlow.js.
import * as tf from '@tensorflow/tfjs';
import type { KvCache } from './kv-cache.ts';
import type { AttnWeights } from './gpt.ts';

/** Transposes the last two axes. */
const swap = (t: tf.Tensor): tf.Tensor => {
  const r = t.rank;
  return tf.transpose(t, [...Array.from({ length: r - 2 }, (_, i) => i), r - 1, r - 2]);
};

/**
 * Multiply-adds per matrix from which the wasm backend's 2-D products, one per matrix, beat a
 * batched product (measured against the backend's batched kernel: at 16K it is twice as fast,
 * at 32K they are even, at 1M the 2-D ones are 6 times as fast; that kernel is a generic loop at
 * about 1.6 GFLOP/s, the 2-D one XNNPACK's at 10–19, less a fixed cost per call). Below it,
 * products run as elementwise products summed, which sum in the same order as XNNPACK's.
 */
const SLICED_MACS = 32 * 1024;

/**
 * Rows of `a` up to which a large product (decoding's over a long cache: one query a sequence and
 * head, or a group's few) runs as products and sums of elements on wasm rather than as n 2-D
 * products: over 512 positions 6 times as fast (their slices copy the cache).
 */
const SUMMED_ROWS = 4;

/**
 * Terms up to which the wasm backend's batched kernel sums a product's terms in order (measured
 * here: up to 49 it does, from 64 on it does not, for every shape tried).
 */
const BATCHED_IN_ORDER = 48;

/**
 * a·b over a leading batch axis: [n, M, K] by [n, K, N] → [n, M, N]. On wasm every element is a
 * float32 sum of the products in order of k, however the product runs, so that one product
 * equals the same product asked for in another shape (a token decoded against a cache, against
 * reading the whole sequence): matrices of at least SLICED_MACS multiply-adds run as n 2-D
 * products (XNNPACK's, which sums so), or with at most SUMMED_ROWS rows as elementwise products
 * summed along k (tf.sum sums so); smaller ones by the backend's batched kernel where they have at
 * most BATCHED_IN_ORDER terms, else summed. Other backends batch natively.
 */
export function batchMatMul(a: tf.Tensor, b: tf.Tensor): tf.Tensor {
  if (tf.getBackend() !== 'wasm') return tf.matMul(a as tf.Tensor3D, b as tf.Tensor3D);
  const how = productOf(a, b.shape[2]!);
  if (how === 'summed') return tf.tidy(() => productSummed(a, swap(b)));
  return how === 'batched' ? tf.matMul(a as tf.Tensor3D, b as tf.Tensor3D) : productSliced(a, b);
}

/** a·bᵀ over a leading batch axis, `bT` given as [n, N, K]: [n, M, K] by [n, N, K] → [n, M, N]; summed as batchMatMul sums. */
export function batchMatMulT(a: tf.Tensor, bT: tf.Tensor): tf.Tensor {
  if (tf.getBackend() !== 'wasm') return tf.matMul(a as tf.Tensor3D, bT as tf.Tensor3D, false, true);
  const how = productOf(a, bT.shape[1]!);
  if (how === 'summed') return productSummed(a, bT);
  return tf.tidy(() => (how === 'batched' ? tf.matMul(a as tf.Tensor3D, swap(bT) as tf.Tensor3D) : productSliced(a, swap(bT))));
}

/** How a product of `a` [n, M, K] by a matrix of N columns runs on wasm (see batchMatMul). */
function productOf(a: tf.Tensor, N: number): 'summed' | 'batched' | 'sliced' {
  const [, M, K] = a.shape as [number, number, number];
  if (M * K * N >= SLICED_MACS) return M <= SUMMED_ROWS ? 'summed' : 'sliced';
  return K <= BATCHED_IN_ORDER ? 'batched' : 'summed';
}

/** [n, M, K] by [n, N, K] → [n, M, N], each element the products along k summed in order. */
function productSummed(a: tf.Tensor, bT: tf.Tensor): tf.Tensor {
  const [n, M, K] = a.shape as [number, number, number];
  const N = bT.shape[1]!;
  return tf.tidy(() => tf.sum(tf.mul(tf.reshape(a, [n, M, 1, K]), tf.reshape(bT, [n, 1, N, K])), -1));
}

/** [n, M, K] by [n, K, N] → [n, M, N] as n 2-D products. */
function productSliced(a: tf.Tensor, b: tf.Tensor): tf.Tensor {
  const [n, M, K] = a.shape as [number, number, number];
  const N = b.shape[2]!;
  return tf.tidy(() => {
    const outs: tf.Tensor[] = [];
    for (let i = 0; i < n; i++) outs.push(tf.matMul(tf.reshape(tf.slice(a, [i, 0, 0], [1, M, K]), [M, K]), tf.reshape(tf.slice(b, [i, 0, 0], [1, K, N]), [K, N])));
    return tf.reshape(tf.concat(outs, 0), [n, M, N]);
  });
}

/**
 * A LoRA adapter on a matrix w (engine/adapters): the product becomes x·w + scale·(x·a)·b, with a
 * [D, r] and b [r, O] (this rank's slices); `aName` and `bName` name their gradients.
 */
export type Adapter = { a: tf.Tensor; b: tf.Tensor; scale: number; aName: string; bName: string };

/** How a matrix computes: its adapter, if it has one, and whether the matrix itself is frozen (no gradient of its own). */
export type LinearOpts = { adapter?: Adapter; frozen?: boolean };

/**
 * x·w (+ b) (+ an adapter's scale·(x·a)·b): x [N, D], w [D, O] → [N, O]. The base product is the
 * same with an adapter or without, and an adapter whose b is zero adds exact zeros to it.
 */
export function linear(x: tf.Tensor, w: tf.Tensor, b?: tf.Tensor, adapter?: Adapter): tf.Tensor2D {
  const base = () => (b ? tf.fused.matMul({ a: x as tf.Tensor2D, b: w as tf.Tensor2D, bias: b }) : tf.matMul(x as tf.Tensor2D, w as tf.Tensor2D)) as tf.Tensor2D;
  if (!adapter) return base();
  return tf.tidy(() => tf.add(base(), tf.mul(tf.matMul(tf.matMul(x as tf.Tensor2D, adapter.a as tf.Tensor2D), adapter.b as tf.Tensor2D), adapter.scale)));
}

export type LinearGrads = {
  dx: tf.Tensor;
  /** The matrix's and its bias's gradients; absent for a frozen matrix. */
  dw?: tf.Tensor;
  db?: tf.Tensor;
  /** The adapter's gradients, by parameter name. */
  adapter?: Record<string, tf.Tensor>;
};

/** Adds `more`'s gradients into `into`, by name (GPT-2's q, k and v share one adapter A). */
export function addGrads(into: Record<string, tf.Tensor>, more: Record<string, tf.Tensor> | undefined): Record<string, tf.Tensor> {
  for (const [name, g] of Object.entries(more ?? {})) into[name] = into[name] ? tf.add(into[name]!, g) : g;
  return into;
}

/**
 * Σ over the rows of t [N, O] → [O], as the product of a row of ones with t: the wasm backend
 * reduces a leading axis by transposing it last first, about 30 times slower.
 */
export function sumRows(t: tf.Tensor): tf.Tensor {
  return tf.tidy(() => tf.reshape(tf.matMul(tf.ones([1, t.shape[0]!]), t as tf.Tensor2D), [t.shape[1]!]));
}

/**
 * Rows per partial product of a weight gradient: XNNPACK's product (the wasm backend's) slows
 * down once the shared dimension passes about a thousand (2048 rows: 11 GFLOP/s, 1024: 17, here),
 * so longer ones are summed from pieces of this many rows, in order.
 */
const GRAD_ROWS = 1024;

/**
 * The gradient of a weight, xᵀ·dy, for x [N, D] and dy [N, O], with plain products only: the
 * narrower of x and dy is the one transposed (a transpose costs its size), and N is cut into
 * pieces of at most GRAD_ROWS rows.
 */
export function weightGrad(x: tf.Tensor, dy: tf.Tensor): tf.Tensor {
  return tf.tidy(() => {
    const [N, D] = x.shape as [number, number];
    const O = dy.shape[1]!;
    const pieces = Math.ceil(N / GRAD_ROWS);
    if (pieces === 1) return D <= O ? tf.matMul(swap(x) as tf.Tensor2D, dy as tf.Tensor2D) : swap(tf.matMul(swap(dy) as tf.Tensor2D, x as tf.Tensor2D));
    let sum: tf.Tensor | undefined;
    for (let i = 0; i < pieces; i++) {
      const lo = Math.floor((i * N) / pieces);
      const n = Math.floor(((i + 1) * N) / pieces) - lo;
      const xi = tf.slice(x, [lo, 0], [n, D]);
      const dyi = tf.slice(dy, [lo, 0], [n, O]);
      // Products of the transposed gradient are transposed back once, after the sum.
      const part = D <= O ? tf.matMul(swap(xi) as tf.Tensor2D, dyi as tf.Tensor2D) : tf.matMul(swap(dyi) as tf.Tensor2D, xi as tf.Tensor2D);
      sum = sum ? tf.add(sum, part) : part;
    }
    return D <= O ? sum! : swap(sum!);
  });
}

/**
 * The vector–Jacobian product of x·w + b for upstream dy [N, O]: dx = dy·wᵀ, dw = xᵀ·dy, db = Σ dy
 * (not for a frozen matrix). With an adapter (scale s, a, b), g = dy·bᵀ: dx gains s·g·aᵀ, and
 * da = s·xᵀ·g, db = s·(x·a)ᵀ·dy.
 */
export function linearBackward(x: tf.Tensor, w: tf.Tensor, dy: tf.Tensor, o: LinearOpts = {}): LinearGrads {
  return tf.tidy(() => {
    const dxBase = tf.matMul(dy as tf.Tensor2D, swap(w) as tf.Tensor2D);
    const own = o.frozen ? {} : { dw: weightGrad(x, dy), db: sumRows(dy) };
    const ad = o.adapter;
    if (!ad) return { dx: dxBase, ...own };
    const g = tf.matMul(dy as tf.Tensor2D, swap(ad.b) as tf.Tensor2D); // [N, r]
    const dx = tf.add(dxBase, tf.mul(tf.matMul(g, swap(ad.a) as tf.Tensor2D), ad.scale));
    const da = tf.mul(weightGrad(x, g), ad.scale);
    const dbA = tf.mul(weightGrad(tf.matMul(x as tf.Tensor2D, ad.a as tf.Tensor2D), dy), ad.scale);
    return { dx, ...own, adapter: { [ad.aName]: da, [ad.bName]: dbA } };
  });
}

// ---- layer norm ---------------------------------------------------------------------------------

export type NormCache = {
  xhat: tf.Tensor;
  rstd: tf.Tensor;
};

/** Layer norm over the last axis; with `keep`, what its backward pass reads. */
export function layerNorm(x: tf.Tensor, g: tf.Tensor, b: tf.Tensor, keep: boolean): { y: tf.Tensor; cache?: NormCache } {
  return tf.tidy(() => {
    const centred = tf.sub(x, tf.mean(x, -1, true));
    const rstd = tf.rsqrt(tf.add(tf.mean(tf.square(centred), -1, true), 1e-5));
    const xhat = tf.mul(centred, rstd);
    const y = tf.add(tf.mul(xhat, g), b);
    return keep ? { y, cache: { xhat, rstd } } : { y };
  });
}

/** dx = rstd·(dx̂ − mean(dx̂) − x̂·mean(dx̂·x̂)), dx̂ = dy·g; dg = Σ dy·x̂, db = Σ dy over rows. dy: [N, D]. */
export function layerNormBackward(c: NormCache, g: tf.Tensor, dy: tf.Tensor): { dx: tf.Tensor; dg: tf.Tensor; db: tf.Tensor } {
  return tf.tidy(() => {
    const dxhat = tf.mul(dy, g);
    const dx = tf.mul(c.rstd, tf.sub(tf.sub(dxhat, tf.mean(dxhat, -1, true)), tf.mul(c.xhat, tf.mean(tf.mul(dxhat, c.xhat), -1, true))));
    return { dx, dg: sumRows(tf.mul(dy, c.xhat)), db: sumRows(dy) };
  });
}

/** RMSNorm over the last axis (LLaMA's): x·rsqrt(mean(x²) + eps)·g; with `keep`, what its backward pass reads. */
export function rmsNorm(x: tf.Tensor, g: tf.Tensor, eps: number, keep: boolean): { y: tf.Tensor; cache?: NormCache } {
  return tf.tidy(() => {
    const rstd = tf.rsqrt(tf.add(tf.mean(tf.square(x), -1, true), eps));
    const xhat = tf.mul(x, rstd);
    const y = tf.mul(xhat, g);
    return keep ? { y, cache: { xhat, rstd } } : { y };
  });
}

/** dx = rstd·(dx̂ − x̂·mean(dx̂·x̂)), dx̂ = dy·g; dg = Σ dy·x̂ over rows. */
export function rmsNormBackward(c: NormCache, g: tf.Tensor, dy: tf.Tensor): { dx: tf.Tensor; dg: tf.Tensor } {
  return tf.tidy(() => {
    const dxhat = tf.mul(dy, g);
    const dx = tf.mul(c.rstd, tf.sub(dxhat, tf.mul(c.xhat, tf.mean(tf.mul(dxhat, c.xhat), -1, true))));
    return { dx, dg: sumRows(tf.mul(dy, c.xhat)) };
  });
}

// ---- MLP ----------------------------------------------------------------------------------------

const GELU_C = Math.sqrt(2 / Math.PI);

export type MlpCache = {
  h: tf.Tensor;
  u: tf.Tensor;
  /** σ(2z), z = c·(u + 0.044715u³): GPT-2's GELU is ½u(1 + tanh z) = u·σ(2z). */
  s: tf.Tensor;
  a: tf.Tensor;
};

/**
 * gelu(h·w1 + b1)·w2 with GPT-2's tanh GELU, without the output bias (column, then row, blocks
 * under tp). The GELU is written with a sigmoid, which the wasm backend runs about 6 times as
 * fast as tanh.
 */
/** A block's MLP adapters, by its matrices' names. */
export type MlpAdapters = { w1?: Adapter; w2?: Adapter; w3?: Adapter };

export function mlp(h: tf.Tensor, w1: tf.Tensor, b1: tf.Tensor, w2: tf.Tensor, keep: boolean, ad: MlpAdapters = {}): { out: tf.Tensor; cache?: MlpCache } {
  return tf.tidy(() => {
    const u = linear(h, w1, b1, ad.w1);
    const s = tf.sigmoid(tf.mul(tf.add(u, tf.mul(tf.mul(tf.square(u), u), 0.044715)), 2 * GELU_C));
    const a = tf.mul(u, s);
    const out = linear(a, w2, undefined, ad.w2);
    return keep ? { out, cache: { h: h.clone(), u, s, a } } : { out };
  });
}

/** The MLP's backward pass: dh, the matrices' gradients (none when frozen) and the adapters', by name. */
export function mlpBackward(c: MlpCache, w1: tf.Tensor, w2: tf.Tensor, dout: tf.Tensor, ad: MlpAdapters = {}, frozen = false) {
  return tf.tidy(() => {
    const g2 = linearBackward(c.a, w2, dout, { adapter: ad.w2, frozen });
    // d(u·σ(2z))/du = s + 2u·s(1 − s)·c·(1 + 3·0.044715·u²), s = σ(2z)
    const slope = tf.add(c.s, tf.mul(tf.mul(tf.mul(c.u, 2 * GELU_C), tf.mul(c.s, tf.sub(1, c.s))), tf.add(1, tf.mul(tf.square(c.u), 3 * 0.044715))));
    const g1 = linearBackward(c.h, w1, tf.mul(g2.dx, slope), { adapter: ad.w1, frozen });
    const grads: Record<string, tf.Tensor> = frozen ? {} : { w1: g1.dw!, b1: g1.db!, w2: g2.dw! };
    g2.db?.dispose();
    return { dh: g1.dx, grads, adapters: addGrads(addGrads({}, g1.adapter), g2.adapter) };
  });
}

export type GluCache = {
  h: tf.Tensor;
  /** The gate's input, h·w1. */
  u: tf.Tensor;
  /** σ(u). */
  s: tf.Tensor;
  /** The up projection, h·w3. */
  up: tf.Tensor;
  /** silu(u)·up, the second matrix's input. */
  a: tf.Tensor;
};

/** LLaMA's SwiGLU MLP, (silu(h·w1) ⊙ h·w3)·w2 (column, column, then row blocks under tp). */
export function swiglu(h: tf.Tensor, w1: tf.Tensor, w3: tf.Tensor, w2: tf.Tensor, keep: boolean, ad: MlpAdapters = {}): { out: tf.Tensor; cache?: GluCache } {
  return tf.tidy(() => {
    const u = linear(h, w1, undefined, ad.w1);
    const s = tf.sigmoid(u);
    const up = linear(h, w3, undefined, ad.w3);
    const a = tf.mul(tf.mul(u, s), up);
    const out = linear(a, w2, undefined, ad.w2);
    return keep ? { out, cache: { h: h.clone(), u, s, up, a } } : { out };
  });
}

export function swigluBackward(c: GluCache, w1: tf.Tensor, w3: tf.Tensor, w2: tf.Tensor, dout: tf.Tensor, ad: MlpAdapters = {}, frozen = false) {
  return tf.tidy(() => {
    const g2 = linearBackward(c.a, w2, dout, { adapter: ad.w2, frozen });
    // d silu(u)/du = σ(u)·(1 + u·(1 − σ(u)))
    const dgate = tf.mul(tf.mul(g2.dx, c.up), tf.mul(c.s, tf.add(1, tf.mul(c.u, tf.sub(1, c.s)))));
    const dup = tf.mul(g2.dx, tf.mul(c.u, c.s));
    const g1 = linearBackward(c.h, w1, dgate, { adapter: ad.w1, frozen });
    const g3 = linearBackward(c.h, w3, dup, { adapter: ad.w3, frozen });
    tf.dispose([g1.db, g2.db, g3.db].filter((t): t is tf.Tensor => t !== undefined));
    const grads: Record<string, tf.Tensor> = frozen ? {} : { w1: g1.dw!, w3: g3.dw!, w2: g2.dw! };
    return { dh: tf.add(g1.dx, g3.dx), grads, adapters: addGrads(addGrads(addGrads({}, g1.adapter), g3.adapter), g2.adapter) };
  });
}

// ---- attention ----------------------------------------------------------------------------------

export type { AttnWeights };

/**
 * The shape of one attention call: `heads` query heads and `kvHeads` key/value heads (this rank's;
 * each key/value head serves heads / kvHeads query heads, a group), over B rows of T positions,
 * with rotary position tables when the model has them.
 */
export interface AttnDims {
  B: number;
  T: number;
  heads: number;
  kvHeads: number;
  rope?: RopeTables;
}

export type AttnCache = {
  h: tf.Tensor;
  /**
   * Queries (rotated, and scaled by 1/√hd), a key/value head's group of query heads stacked:
   * [B·KV, g·T, hd]. With g = 1 (no grouping) this is one matrix per (row, head).
   */
  q: tf.Tensor;
  /** Keys (rotated), transposed: [B·KV, hd, T]. */
  kT: tf.Tensor;
  v: tf.Tensor;
  /** Attention weights, [B·KV, g·T, T]. */
  p: tf.Tensor;
  /** The heads' outputs merged back to rows, [N, heads · hd]. */
  y: tf.Tensor;
};

/** Rows [B·T, H·hd] → one matrix per (row, head): [B·H, T, hd], or with `transposed`, [B·H, hd, T]. */
function toHeads(t: tf.Tensor, B: number, T: number, heads: number, transposed = false): tf.Tensor {
  const hd = t.shape[1]! / heads;
  const order = transposed ? [0, 2, 3, 1] : [0, 2, 1, 3];
  return tf.reshape(tf.transpose(tf.reshape(t, [B, T, heads, hd]), order), transposed ? [B * heads, hd, T] : [B * heads, T, hd]);
}

/** One matrix per (row, head), [B·H, T, hd] → rows [B·T, H·hd]: the inverse of toHeads. */
function fromHeads(t: tf.Tensor, B: number, T: number, heads: number): tf.Tensor {
  const hd = t.shape[2]!;
  return tf.reshape(tf.transpose(tf.reshape(t, [B, heads, T, hd]), [0, 2, 1, 3]), [B * T, heads * hd]);
}

/**
 * Scores [B·KV, g·T, S] plus a mask: one for every row ([T, S]), or each row's ([B, 1, T, S]:
 * left padding); a group of g query heads stacked as [g·T, ·] gets the same mask g times.
 */
function masked(scores: tf.Tensor, mask: tf.Tensor, d: AttnDims): tf.Tensor {
  const g = d.heads / d.kvHeads;
  if (mask.rank === 2) return tf.add(scores, g === 1 ? mask : tf.tile(mask, [g, 1]));
  const [gT, S] = [scores.shape[1]!, scores.shape[2]!];
  const rows = tf.add(tf.reshape(scores, [d.B, d.kvHeads, gT, S]), g === 1 ? mask : tf.tile(mask, [1, 1, g, 1]));
  return tf.reshape(rows, [d.B * d.kvHeads, gT, S]);
}

/**
 * Queries (rotated, scaled by 1/√hd, grouped by key/value head: [B·KV, g·T, hd]), transposed
 * keys [B·KV, hd, T] and values [B·KV, T, hd] of rows h. Query head i uses key/value head
 * ⌊i / g⌋, so stacking a group's query heads along the rows lets one product serve the group.
 */
function project(h: tf.Tensor, w: AttnWeights, d: AttnDims) {
  const { B, T, heads, kvHeads } = d;
  const hd = w.wq.shape[1]! / heads;
  const g = heads / kvHeads;
  const ad = w.lora ?? {};
  let q = toHeads(linear(h, w.wq, w.bq, ad.wq), B, T, heads);
  let kT: tf.Tensor;
  if (d.rope) {
    q = rope(q, d.rope);
    kT = swap(rope(toHeads(linear(h, w.wk, w.bk, ad.wk), B, T, kvHeads), d.rope));
  } else kT = toHeads(linear(h, w.wk, w.bk, ad.wk), B, T, kvHeads, true);
  return {
    q: tf.reshape(tf.mul(q, 1 / Math.sqrt(hd)), [B * kvHeads, g * T, hd]),
    kT,
    v: toHeads(linear(h, w.wv, w.bv, ad.wv), B, T, kvHeads),
  };
}

/** Attention outputs [B·KV, g·T, hd] of grouped queries → rows [B·T, H·hd]. */
function mergeGrouped(t: tf.Tensor, d: AttnDims): tf.Tensor {
  return fromHeads(tf.reshape(t, [d.B * d.heads, d.T, t.shape[2]!]), d.B, d.T, d.heads);
}

/**
 * Causal self-attention of rows h [B·T, D], projected by (a row block of) the output matrix,
 * without its bias: → [B·T, D]. Under tensor parallelism each rank passes its own heads' columns
 * of wq/wk/wv (its key/value heads' for wk/wv) and rows of wo, and the ranks' results sum to the whole.
 */
export function attention(h: tf.Tensor, w: AttnWeights, d: AttnDims, mask: tf.Tensor, keep: boolean): { out: tf.Tensor; cache?: AttnCache } {
  return tf.tidy(() => {
    const { q, kT, v } = project(h, w, d);
    const p = tf.softmax(masked(batchMatMul(q, kT), mask, d)); // [B·KV, g·T, T]
    const y = mergeGrouped(batchMatMul(p, v), d);
    const out = linear(y, w.wo, undefined, w.lora?.wo);
    return keep ? { out, cache: { h: h.clone(), q, kT, v, p, y } } : { out };
  });
}

/** Attention's backward pass: dh, the matrices' (and q, k, v biases') gradients, none when frozen, and the adapters', by name. */
export function attentionBackward(c: AttnCache, w: AttnWeights, d: AttnDims, dout: tf.Tensor, frozen = false) {
  return tf.tidy(() => {
    const { B, T, heads, kvHeads } = d;
    const hd = w.wq.shape[1]! / heads;
    const g = heads / kvHeads;
    const ad = w.lora ?? {};
    const go = linearBackward(c.y, w.wo, dout, { adapter: ad.wo, frozen });
    const dy = tf.reshape(toHeads(go.dx, B, T, heads), [B * kvHeads, g * T, hd]);
    const dv = batchMatMul(swap(c.p), dy); // a group's query heads sum into their key/value head
    const dp = batchMatMul(dy, swap(c.v));
    const ds = tf.mul(c.p, tf.sub(dp, tf.sum(tf.mul(dp, c.p), -1, true))); // softmax's backward
    let dq = tf.reshape(tf.mul(batchMatMul(ds, swap(c.kT)), 1 / Math.sqrt(hd)), [B * heads, T, hd]);
    let dk = batchMatMul(swap(ds), c.q); // [B·KV, T, hd]
    if (d.rope) {
      dq = ropeBackward(dq, d.rope);
      dk = ropeBackward(dk, d.rope);
    }
    const gq = linearBackward(c.h, w.wq, fromHeads(dq, B, T, heads), { adapter: ad.wq, frozen });
    const gk = linearBackward(c.h, w.wk, fromHeads(dk, B, T, kvHeads), { adapter: ad.wk, frozen });
    const gv = linearBackward(c.h, w.wv, fromHeads(dv, B, T, kvHeads), { adapter: ad.wv, frozen });
    const grads: Record<string, tf.Tensor> = frozen ? {} : { wq: gq.dw!, wk: gk.dw!, wv: gv.dw!, wo: go.dw! };
    if (w.bq && !frozen) Object.assign(grads, { bq: gq.db, bk: gk.db, bv: gv.db });
    const adapters: Record<string, tf.Tensor> = {};
    for (const x of [gq, gk, gv, go]) addGrads(adapters, x.adapter);
    return { dh: tf.add(tf.add(gq.dx, gk.dx), gv.dx), grads, adapters };
  });
}

/**
 * Attention of the new positions [start, start + T) of each row (h: [B·T, D]) during decoding:
 * their keys and values go into `cache` (layer `l`), and their queries attend to every cached
 * position up to their own. Without its output bias, like `attention`. The cache holds this
 * rank's key/value heads only: B·KV rows.
 */
export function attentionCached(h: tf.Tensor, w: AttnWeights, d: AttnDims, start: number | Int32Array, cache: KvCache, l: number, pads?: Int32Array): tf.Tensor {
  return tf.tidy(() => {
    const { q, kT, v } = project(h, w, d);
    const layer = cache.write(l, start, kT, v);
    const p = tf.softmax(masked(batchMatMulT(q, layer.k), cache.mask(start, d.T, pads), d)); // [B·KV, g·T, cached]
    return linear(mergeGrouped(batchMatMulT(p, layer.vT), d), w.wo, undefined, w.lora?.wo);
  });
}

// ---- rotary positions ---------------------------------------------------------------------------

/** cos and sin of each position's angles, [n, hd]: a head's two halves repeat the frequencies (the Hugging Face layout). */
export type RopeTables = { cos: tf.Tensor; sin: tf.Tensor };

/**
 * The rotary tables of each sequence's own positions [starts[b], starts[b] + n), [B, 1, n, hd]:
 * sequences of several turns decode at positions of their own.
 */
export function ropeTablesRows(theta: number, hd: number, starts: Int32Array, n: number): RopeTables {
  const parts = Array.from(starts, (s) => ropeTables(theta, hd, s, n));
  const stack = (k: 'cos' | 'sin') => tf.tidy(() => tf.reshape(tf.stack(parts.map((p) => p[k])), [starts.length, 1, n, hd]));
  const out = { cos: stack('cos'), sin: stack('sin') };
  for (const p of parts) tf.dispose([p.cos, p.sin]);
  return out;
}

/**
 * The rotary tables of positions [start, start + n) for heads of `hd` elements and base `theta`:
 * position t turns element pair (i, i + hd/2) by t / theta^(2i/hd). Computed in double precision.
 */
export function ropeTables(theta: number, hd: number, start: number, n: number): RopeTables {
  const half = hd / 2;
  const cos = new Float32Array(n * hd);
  const sin = new Float32Array(n * hd);
  for (let t = 0; t < n; t++) {
    for (let i = 0; i < half; i++) {
      const angle = (start + t) / theta ** ((2 * i) / hd);
      const [c, s] = [Math.cos(angle), Math.sin(angle)];
      cos[t * hd + i] = cos[t * hd + half + i] = c;
      sin[t * hd + i] = sin[t * hd + half + i] = s;
    }
  }
  return { cos: tf.tensor2d(cos, [n, hd]), sin: tf.tensor2d(sin, [n, hd]) };
}

/** (x1, x2) → (−x2, x1) over the halves of the last axis. */
function rotateHalf(x: tf.Tensor): tf.Tensor {
  const half = x.shape[x.rank - 1]! / 2;
  const [x1, x2] = tf.split(x, [half, half], -1);
  return tf.concat([tf.neg(x2!), x1!], -1);
}

/** x·cos + rotateHalf(x)·sin, for x [·, n, hd] and tables [n, hd], or x [B·H, n, hd] and each sequence's tables [B, 1, n, hd]. */
export function rope(x: tf.Tensor, t: RopeTables): tf.Tensor {
  if (t.cos.rank === 4) {
    const [B, , n, hd] = t.cos.shape as number[];
    return tf.tidy(() => {
      const rows = tf.reshape(x, [B!, x.shape[0]! / B!, n!, hd!]);
      return tf.reshape(tf.add(tf.mul(rows, t.cos), tf.mul(rotateHalf(rows), t.sin)), x.shape);
    });
  }
  return tf.tidy(() => tf.add(tf.mul(x, t.cos), tf.mul(rotateHalf(x), t.sin)));
}

/** rope's backward pass: rotateHalf's transpose is −rotateHalf, so dx = dy·cos − rotateHalf(dy·sin). */
export function ropeBackward(dy: tf.Tensor, t: RopeTables): tf.Tensor {
  return tf.tidy(() => tf.sub(tf.mul(dy, t.cos), rotateHalf(tf.mul(dy, t.sin))));
}

// ---- embedding ----------------------------------------------------------------------------------

/**
 * Token embeddings of tokens [B, T] as rows [B·T, D], plus the position embeddings of positions
 * [start, start + T) when the model has them (wpe; rotary models turn their queries and keys
 * instead). A row left-padded by `pads[b]` tokens counts its positions from its first real token.
 * With `start` per row, each row's positions start at its own.
 */
export function embedRows(tokens: tf.Tensor2D, wte: tf.Tensor, wpe: tf.Tensor | undefined, start: number | Int32Array = 0, pads?: Int32Array): tf.Tensor2D {
  return tf.tidy(() => {
    const [B, T] = tokens.shape;
    const D = wte.shape[1]!;
    const tok = tf.gather(wte, tf.reshape(tokens, [B * T]));
    if (!wpe) return tok as tf.Tensor2D;
    if (typeof start !== 'number') {
      // A row's own first position must be in the table; past it, only the padding of a row that
      // sits a pass out can reach, and it reads the table's last row (nothing ever sees its output).
      const C = wpe.shape[0]!;
      const at = new Int32Array(B * T);
      for (let b = 0; b < B; b++) {
        const first = start[b]! - (pads?.[b] ?? 0);
        if (first >= C) throw new RangeError(`position ${first} exceeds the context of ${C}`);
        for (let t = 0; t < T; t++) at[b * T + t] = Math.min(Math.max(first + t, 0), C - 1);
      }
      return tf.add(tok, tf.gather(wpe, tf.tensor1d(at, 'int32'))) as tf.Tensor2D;
    }
    if (start + T > wpe.shape[0]!) throw new RangeError(`positions ${start}-${start + T} exceed the context of ${wpe.shape[0]}`);
    if (pads) return tf.add(tok, tf.gather(wpe, tf.tensor1d(paddedPositions(pads, T, start), 'int32'))) as tf.Tensor2D;
    return tf.reshape(tf.add(tf.reshape(tok, [B, T, D]), tf.slice(wpe, [start, 0], [T, D])), [B * T, D]) as tf.Tensor2D;
  });
}

/** Each row's positions [start, start + T), counted from its first real token (padding at 0). */
function paddedPositions(pads: Int32Array, T: number, start: number): Int32Array {
  const out = new Int32Array(pads.length * T);
  for (let b = 0; b < pads.length; b++) for (let t = 0; t < T; t++) out[b * T + t] = Math.max(start + t - pads[b]!, 0);
  return out;
}

/**
 * The embeddings' gradients from dx [B·T, D], for tokens [B·T] of sequences of T: each row of dx
 * is added to its token's row of dwte and, with a `context` (a model with position embeddings),
 * its position's row of dwpe, in row order (a scatter-add on the host: fixed order, and no one-hot
 * product of the vocabulary's size); dwpe is zero past T.
 */
export function embedBackward(tokens: Int32Array, T: number, vocab: number, context: number | undefined, dx: tf.Tensor, pads?: Int32Array): { dwte: tf.Tensor; dwpe?: tf.Tensor } {
  const D = dx.shape[1]!;
  const g = dx.dataSync() as Float32Array;
  const dwte = new Float32Array(vocab * D);
  const dwpe = context === undefined ? undefined : new Float32Array(context * D);
  for (let i = 0; i < tokens.length; i++) {
    const row = i * D;
    const tok = tokens[i]! * D;
    for (let j = 0; j < D; j++) dwte[tok + j]! += g[row + j]!;
    if (!dwpe) continue;
    const pos = (pads ? Math.max((i % T) - pads[Math.floor(i / T)]!, 0) : i % T) * D;
    for (let j = 0; j < D; j++) dwpe[pos + j]! += g[row + j]!;
  }
  return { dwte: tf.tensor2d(dwte, [vocab, D]), ...(dwpe && context !== undefined ? { dwpe: tf.tensor2d(dwpe, [context, D]) } : {}) };
}
