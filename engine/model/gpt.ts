// A small GPT-style decoder: token and position embeddings, pre-norm blocks of causal multi-head
// attention and a GELU MLP, a final norm, and either a token head (policy) or a scalar head
// (value). Parameters are a flat, ordered list of named tensors: that list is what shards,
// transfers, digests and checkpoints agree on.
import * as tf from '@tensorflow/tfjs';
import { Rng, Stream, seedOf } from './rng.ts';
import type { NamedTensor } from '../../mesh/wire/index.ts';
import { archOf, isTied, parameterShapes, type GptSpec } from './params.ts';
import { ropeTables, type Adapter } from './blocks.ts';
import { adapterMap } from '../adapters/index.ts';

export { archOf, parameterShapes, parameterCount, isHead, isTied, specProblem, type Arch, type GptSpec } from './params.ts';

export type Weights = Record<string, tf.Tensor>;

/**
 * GPT-2 initialisation (N(0, 0.02), residual projections scaled by 1/√(2L), norms at 1, biases
 * at 0), drawn in JavaScript from the seed so that every backend starts from the same bits.
 */
export function initialWeights(spec: GptSpec, seed: number): NamedTensor[] {
  return parameterShapes(spec).map(([name, shape], index) => initialParameter(spec, seed, name, shape, index));
}

/**
 * One parameter's initial values, from its own random stream: a shard can draw just the
 * parameters it holds and still match the whole model bit for bit.
 */
export function initialParameter(spec: GptSpec, seed: number, name: string, shape: number[], index: number): NamedTensor {
  const rng = new Rng(seedOf(seed, Stream.init, spec.kind === 'policy' ? 0 : 1, index));
  {
    const size = shape.reduce((a, b) => a * b, 1);
    const data = new Float32Array(size);
    if (name.endsWith('.g')) data.fill(1);
    else if (name.endsWith('.lora_b')) {
      // An adapter starts as no change at all: B is zero.
    } else if (name.endsWith('.lora_a')) {
      // PEFT's: Kaiming-uniform with a = √5 over A's fan-in, U(−1/√in, 1/√in).
      const bound = 1 / Math.sqrt(shape[0]!);
      for (let i = 0; i < size; i++) data[i] = (2 * rng.uniform() - 1) * bound;
    } else if (shape.length === 2) {
      const residual = name.endsWith('attn.wo') || name.endsWith('mlp.w2');
      const std = residual ? 0.02 / Math.sqrt(2 * spec.layers) : 0.02;
      for (let i = 0; i < size; i++) data[i] = rng.normal() * std;
    }
    return { name, shape, data };
  }
}

export function layerNorm(x: tf.Tensor, g: tf.Tensor, b: tf.Tensor): tf.Tensor {
  const { mean, variance } = tf.moments(x, -1, true);
  return tf.add(tf.mul(tf.div(tf.sub(x, mean), tf.sqrt(tf.add(variance, 1e-5))), g), b);
}

function gelu(x: tf.Tensor): tf.Tensor {
  // tanh approximation, as in GPT-2
  const inner = tf.mul(Math.sqrt(2 / Math.PI), tf.add(x, tf.mul(0.044715, tf.pow(x, 3))));
  return tf.mul(tf.mul(0.5, x), tf.add(1, tf.tanh(inner)));
}

/** x @ w (+ b) over the last axis of a rank-3 tensor. */
function dense(x: tf.Tensor, w: tf.Tensor, b?: tf.Tensor): tf.Tensor {
  const [B, T, D] = x.shape as [number, number, number];
  const xw = tf.matMul(tf.reshape(x, [B * T, D]), w as tf.Tensor2D); // [B·T, out]
  return tf.reshape(b ? tf.add(xw, b) : xw, [B, T, w.shape[1]!]);
}

/** Additive causal mask: 0 on and below the diagonal, −1e9 above. */
export function causalMask(T: number): tf.Tensor {
  const m = new Float32Array(T * T);
  for (let i = 0; i < T; i++) for (let j = i + 1; j < T; j++) m[i * T + j] = -1e9;
  return tf.tensor2d(m, [T, T]);
}

/**
 * The additive mask of left-padded rows, [rows, 1, n, S]: query i (position start + i) of row b
 * sees key j when j ≤ start + i and j is not one of the row's `pads[b]` padding positions. A
 * padding query sees nothing (its output is read by no one).
 */
export function paddedMask(pads: Int32Array, n: number, S: number, start = 0): tf.Tensor {
  const m = new Float32Array(pads.length * n * S);
  for (let b = 0; b < pads.length; b++) for (let i = 0; i < n; i++) for (let j = 0; j < S; j++) if (j > start + i || j < pads[b]!) m[(b * n + i) * S + j] = -1e9;
  return tf.tensor4d(m, [pads.length, 1, n, S]);
}

/** Token and position embeddings: tokens [B, T] → [B, T, D]. */
export function embed(tokens: tf.Tensor2D, wte: tf.Tensor, wpe: tf.Tensor, vocab: number): tf.Tensor {
  const [B, T] = tokens.shape;
  const D = wte.shape[1]!;
  // A one-hot matmul is the embedding lookup: its gradient exists on every backend (the wasm
  // backend lacks the gradient of gather).
  const onehot = tf.oneHot(tf.reshape(tokens, [B * T]), vocab); // [B·T, V]
  const tok = tf.reshape(tf.matMul(onehot, wte as tf.Tensor2D), [B, T, D]);
  return tf.add(tok, tf.slice(wpe, [0, 0], [T, D])); // [B, T, D]
}

/** One block's attention weights (a type, not an interface, so tf.tidy can return it). */
export type AttnWeights = {
  wq: tf.Tensor;
  bq?: tf.Tensor;
  wk: tf.Tensor;
  bk?: tf.Tensor;
  wv: tf.Tensor;
  bv?: tf.Tensor;
  wo: tf.Tensor;
  /** LoRA adapters on the block's matrices (blocks.ts), by matrix. */
  lora?: { wq?: Adapter; wk?: Adapter; wv?: Adapter; wo?: Adapter };
};

/**
 * Causal self-attention over `heads` heads, projected by (a row block of) the output matrix,
 * without its bias: [B, T, D] → [B, T, D]. With tensor parallelism each rank passes its own
 * heads' columns of wq/wk/wv and rows of wo, and the ranks' results sum to the whole.
 */
export function attnPartial(h: tf.Tensor, w: AttnWeights, heads: number, mask: tf.Tensor): tf.Tensor {
  const [B, T] = h.shape as [number, number, number];
  const local = w.wq.shape[1]!; // heads · head size held here
  const hd = local / heads;
  const split = (t: tf.Tensor) => tf.transpose(tf.reshape(t, [B, T, heads, hd]), [0, 2, 1, 3]); // [B, H, T, hd]
  const q = split(dense(h, w.wq, w.bq));
  const k = split(dense(h, w.wk, w.bk));
  const v = split(dense(h, w.wv, w.bv));
  const scores = tf.add(tf.mul(tf.matMul(q, k, false, true), 1 / Math.sqrt(hd)), mask); // [B, H, T, T]
  const y = tf.matMul(tf.softmax(scores), v); // [B, H, T, hd]
  return dense(tf.reshape(tf.transpose(y, [0, 2, 1, 3]), [B, T, local]), w.wo);
}

/** The MLP up to its output bias: gelu(h @ w1 + b1) @ w2 (column, then row, blocks under tp). */
export function mlpPartial(h: tf.Tensor, w1: tf.Tensor, b1: tf.Tensor, w2: tf.Tensor): tf.Tensor {
  return dense(gelu(dense(h, w1, b1)), w2);
}

/** Final norm and head: [B, T, D] → [B, T, V] (policy) or [B, T, 1] (value). */
export function headOut(x: tf.Tensor, g: tf.Tensor, b: tf.Tensor, w: tf.Tensor, bias: tf.Tensor): tf.Tensor {
  return dense(layerNorm(x, g, b), w, bias);
}

export function attnWeights(w: Weights, h: string): AttnWeights {
  const get = (n: string) => w[`${h}.attn.${n}`]!;
  return { wq: get('wq'), bq: get('bq'), wk: get('wk'), bk: get('bk'), wv: get('wv'), bv: get('bv'), wo: get('wo') };
}

/**
 * The weights a model with adapters computes with: each adapted matrix W merged as W + s·A·B
 * (differentiable in A and B); a model without adapters, its own weights.
 */
export function mergedWeights(spec: GptSpec, w: Weights): Weights {
  if (!spec.lora) return w;
  const out: Weights = { ...w };
  for (const [name, ad] of adapterMap(archOf(spec).family, spec.layers, spec.lora)) out[name] = tf.add(w[name]!, tf.mul(tf.matMul(w[ad.a] as tf.Tensor2D, w[ad.b] as tf.Tensor2D), ad.scale));
  return out;
}

/** tokens [B, T] → head outputs [B, T, V] (policy) or [B, T, 1] (value). */
export function forward(spec: GptSpec, weights: Weights, tokens: tf.Tensor2D): tf.Tensor3D {
  return tf.tidy(() => {
    const w = mergedWeights(spec, weights);
    const T = tokens.shape[1];
    if (T > spec.context) throw new RangeError(`sequence of ${T} tokens exceeds the context of ${spec.context}`);
    if (archOf(spec).family === 'llama') return llamaForward(spec, w, tokens);
    let x = embed(tokens, w.wte!, w.wpe!, spec.vocab); // [B, T, D]
    const mask = causalMask(T);
    for (let l = 0; l < spec.layers; l++) {
      const h = `h${l}`;
      x = tf.add(tf.add(x, attnPartial(layerNorm(x, w[`${h}.ln1.g`]!, w[`${h}.ln1.b`]!), attnWeights(w, h), spec.heads, mask)), w[`${h}.attn.bo`]!);
      const m = layerNorm(x, w[`${h}.ln2.g`]!, w[`${h}.ln2.b`]!);
      x = tf.add(tf.add(x, mlpPartial(m, w[`${h}.mlp.w1`]!, w[`${h}.mlp.b1`]!, w[`${h}.mlp.w2`]!)), w[`${h}.mlp.b2`]!);
    }
    if (isTied(spec)) return dense(layerNorm(x, w['lnf.g']!, w['lnf.b']!), tf.transpose(w.wte!)) as tf.Tensor3D;
    return headOut(x, w['lnf.g']!, w['lnf.b']!, w['head.w']!, w['head.b']!) as tf.Tensor3D;
  });
}

/** RMSNorm over the last axis: x / √(mean(x²) + eps) · g. */
function rmsNorm(x: tf.Tensor, g: tf.Tensor, eps: number): tf.Tensor {
  return tf.mul(tf.div(x, tf.sqrt(tf.add(tf.mean(tf.square(x), -1, true), eps))), g);
}

/** Each head's halves (x1, x2) turned by its position's angles: x·cos + (−x2, x1)·sin, for x [B, H, T, hd]. */
function rotate(x: tf.Tensor, theta: number): tf.Tensor {
  const hd = x.shape[3]!;
  const { cos, sin } = ropeTables(theta, hd, 0, x.shape[2]!);
  const [x1, x2] = tf.split(x, 2, -1);
  return tf.add(tf.mul(x, cos), tf.mul(tf.concat([tf.neg(x2!), x1!], -1), sin));
}

/**
 * The llama family: token embeddings, pre-norm blocks of RMSNorm, causal attention with rotary
 * positions and grouped-query heads (each key/value head repeated for its group), and a SwiGLU
 * MLP, without biases (but Qwen2's on q, k and v); a final RMSNorm and the head.
 */
function llamaForward(spec: GptSpec, w: Weights, tokens: tf.Tensor2D): tf.Tensor3D {
  const a = archOf(spec);
  const [B, T] = tokens.shape;
  const { width: D, heads: H } = spec;
  const { kvHeads: KV, headSize: hd } = a;
  const onehot = tf.oneHot(tf.reshape(tokens, [B * T]), spec.vocab);
  let x = tf.reshape(tf.matMul(onehot, w.wte as tf.Tensor2D), [B, T, D]);
  const mask = causalMask(T);
  const heads = (t: tf.Tensor, n: number) => tf.transpose(tf.reshape(t, [B, T, n, hd]), [0, 2, 1, 3]); // [B, n, T, hd]
  const repeat = (t: tf.Tensor) => tf.reshape(tf.tile(tf.reshape(t, [B * KV, 1, T * hd]), [1, H / KV, 1]), [B, H, T, hd]);
  for (let l = 0; l < spec.layers; l++) {
    const p = (n: string) => w[`h${l}.${n}`];
    const h = rmsNorm(x, p('ln1.g')!, a.normEps);
    const q = rotate(heads(dense(h, p('attn.wq')!, p('attn.bq')), H), a.ropeTheta);
    const k = repeat(rotate(heads(dense(h, p('attn.wk')!, p('attn.bk')), KV), a.ropeTheta));
    const v = repeat(heads(dense(h, p('attn.wv')!, p('attn.bv')), KV));
    const scores = tf.add(tf.mul(tf.matMul(q, k, false, true), 1 / Math.sqrt(hd)), mask);
    const y = tf.reshape(tf.transpose(tf.matMul(tf.softmax(scores), v), [0, 2, 1, 3]), [B, T, D]);
    x = tf.add(x, dense(y, p('attn.wo')!));
    const m = rmsNorm(x, p('ln2.g')!, a.normEps);
    const u = dense(m, p('mlp.w1')!);
    x = tf.add(x, dense(tf.mul(tf.mul(u, tf.sigmoid(u)), dense(m, p('mlp.w3')!)), p('mlp.w2')!));
  }
  const y = rmsNorm(x, w['lnf.g']!, a.normEps);
  return dense(y, isTied(spec) ? tf.transpose(w.wte!) : w['head.w']!) as tf.Tensor3D;
}

/**
 * Log-probabilities of the response tokens from head outputs: position t predicts token t+1, so
 * the response tokens at positions P..P+R−1 are scored by outputs P−1..P+R−2. Returns [B, R].
 */
export function logprobsOf(logits: tf.Tensor, tokens: tf.Tensor2D, promptLen: number, vocab: number): tf.Tensor2D {
  const [B, T] = tokens.shape;
  const R = T - promptLen;
  const pred = tf.slice(logits, [0, promptLen - 1, 0], [B, R, vocab]); // [B, R, V]
  const chosen = tf.slice(tokens, [0, promptLen], [B, R]); // [B, R]
  return tf.sum(tf.mul(tf.logSoftmax(pred), tf.oneHot(chosen, vocab)), -1) as tf.Tensor2D; // [B, R]
}

/**
 * The log-softmax of `rows` rows of logits [rows, vocab]: the numbers logprobsOf takes a sampled
 * token's log-probability from, row by row (a row's are the same in any batch), for the tokens a
 * decoding step draws from these logits (their behaviour log-probabilities).
 */
export function logSoftmaxRows(logits: Float32Array, rows: number, vocab: number): Float32Array {
  const t = tf.tidy(() => tf.logSoftmax(tf.tensor2d(logits.subarray(0, rows * vocab), [rows, vocab])));
  const out = t.dataSync() as Float32Array;
  t.dispose();
  return out;
}

/** Values of the states before each response token: outputs P−1..P+R−2 of the scalar head. [B, R] */
export function valuesOf(out: tf.Tensor, promptLen: number): tf.Tensor2D {
  const [B, T] = out.shape as [number, number, number];
  const R = T - promptLen;
  return tf.reshape(tf.slice(out, [0, promptLen - 1, 0], [B, R, 1]), [B, R]) as tf.Tensor2D;
}

export function responseLogprobs(spec: GptSpec, w: Weights, tokens: tf.Tensor2D, promptLen: number): tf.Tensor2D {
  return tf.tidy(() => logprobsOf(forward(spec, w, tokens), tokens, promptLen, spec.vocab));
}

export function responseValues(spec: GptSpec, w: Weights, tokens: tf.Tensor2D, promptLen: number): tf.Tensor2D {
  return tf.tidy(() => valuesOf(forward(spec, w, tokens), promptLen));
}

/** A value model's output after the last token of each sequence: [batch]. */
export function lastValues(spec: GptSpec, w: Weights, tokens: tf.Tensor2D): tf.Tensor1D {
  return tf.tidy(() => {
    const out = forward(spec, w, tokens); // [B, T, 1]
    const [B, T] = tokens.shape;
    return tf.reshape(tf.slice(out, [0, T - 1, 0], [B, 1, 1]), [B]) as tf.Tensor1D;
  });
}
