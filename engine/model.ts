// A small GPT-style decoder: token and position embeddings, pre-norm blocks of causal multi-head
// attention and a GELU MLP, a final norm, and either a token head (policy) or a scalar head
// (value). Parameters are a flat, ordered list of named tensors: that list is what shards,
// transfers, digests and checkpoints agree on.
import * as tf from '@tensorflow/tfjs';
import { Rng, Stream, seedOf } from './rng.ts';
import type { NamedTensor } from '../mesh/transfer.ts';
import { parameterShapes, type GptSpec } from './params.ts';

export { parameterShapes, parameterCount, isHead, type GptSpec } from './params.ts';

export type Weights = Record<string, tf.Tensor>;

/**
 * GPT-2 initialisation (N(0, 0.02), residual projections scaled by 1/√(2L), norms at 1, biases
 * at 0), drawn in JavaScript from the seed so that every backend starts from the same bits.
 */
export function initialWeights(spec: GptSpec, seed: number): NamedTensor[] {
  const rng = new Rng(seedOf(seed, Stream.init, spec.kind === 'policy' ? 0 : 1));
  return parameterShapes(spec).map(([name, shape]) => {
    const size = shape.reduce((a, b) => a * b, 1);
    const data = new Float32Array(size);
    if (name.endsWith('.g')) data.fill(1);
    else if (shape.length === 2) {
      const residual = name.endsWith('attn.wo') || name.endsWith('mlp.w2');
      const std = residual ? 0.02 / Math.sqrt(2 * spec.layers) : 0.02;
      for (let i = 0; i < size; i++) data[i] = rng.normal() * std;
    }
    return { name, shape, data };
  });
}

function layerNorm(x: tf.Tensor, g: tf.Tensor, b: tf.Tensor): tf.Tensor {
  const { mean, variance } = tf.moments(x, -1, true);
  return tf.add(tf.mul(tf.div(tf.sub(x, mean), tf.sqrt(tf.add(variance, 1e-5))), g), b);
}

function gelu(x: tf.Tensor): tf.Tensor {
  // tanh approximation, as in GPT-2
  const inner = tf.mul(Math.sqrt(2 / Math.PI), tf.add(x, tf.mul(0.044715, tf.pow(x, 3))));
  return tf.mul(tf.mul(0.5, x), tf.add(1, tf.tanh(inner)));
}

/** x @ w + b over the last axis of a rank-3 tensor. */
function dense(x: tf.Tensor, w: tf.Tensor, b: tf.Tensor): tf.Tensor {
  const [B, T, D] = x.shape as [number, number, number];
  const y = tf.add(tf.matMul(tf.reshape(x, [B * T, D]), w as tf.Tensor2D), b); // [B·T, out]
  return tf.reshape(y, [B, T, w.shape[1]!]);
}

function attention(x: tf.Tensor, w: Weights, h: string, heads: number, mask: tf.Tensor): tf.Tensor {
  const [B, T, D] = x.shape as [number, number, number];
  const hd = D / heads;
  const split = (t: tf.Tensor) => tf.transpose(tf.reshape(t, [B, T, heads, hd]), [0, 2, 1, 3]); // [B, H, T, hd]
  const q = split(dense(x, w[`${h}.attn.wq`]!, w[`${h}.attn.bq`]!));
  const k = split(dense(x, w[`${h}.attn.wk`]!, w[`${h}.attn.bk`]!));
  const v = split(dense(x, w[`${h}.attn.wv`]!, w[`${h}.attn.bv`]!));
  const scores = tf.add(tf.mul(tf.matMul(q, k, false, true), 1 / Math.sqrt(hd)), mask); // [B, H, T, T]
  const y = tf.matMul(tf.softmax(scores), v); // [B, H, T, hd]
  const merged = tf.reshape(tf.transpose(y, [0, 2, 1, 3]), [B, T, D]);
  return dense(merged, w[`${h}.attn.wo`]!, w[`${h}.attn.bo`]!);
}

/** Additive causal mask: 0 on and below the diagonal, −1e9 above. */
function causalMask(T: number): tf.Tensor {
  const m = new Float32Array(T * T);
  for (let i = 0; i < T; i++) for (let j = i + 1; j < T; j++) m[i * T + j] = -1e9;
  return tf.tensor2d(m, [T, T]);
}

/** tokens [B, T] → head outputs [B, T, V] (policy) or [B, T, 1] (value). */
export function forward(spec: GptSpec, w: Weights, tokens: tf.Tensor2D): tf.Tensor3D {
  return tf.tidy(() => {
    const [B, T] = tokens.shape;
    if (T > spec.context) throw new RangeError(`sequence of ${T} tokens exceeds the context of ${spec.context}`);
    // A one-hot matmul is the embedding lookup: its gradient exists on every backend (the wasm
    // backend lacks the gradient of gather).
    const onehot = tf.oneHot(tf.reshape(tokens, [B * T]), spec.vocab); // [B·T, V]
    const tok = tf.reshape(tf.matMul(onehot, w.wte as tf.Tensor2D), [B, T, spec.width]);
    const pos = tf.slice(w.wpe!, [0, 0], [T, spec.width]); // [T, D]
    let x: tf.Tensor = tf.add(tok, pos); // [B, T, D]
    const mask = causalMask(T);
    for (let l = 0; l < spec.layers; l++) {
      const h = `h${l}`;
      x = tf.add(x, attention(layerNorm(x, w[`${h}.ln1.g`]!, w[`${h}.ln1.b`]!), w, h, spec.heads, mask));
      const m = layerNorm(x, w[`${h}.ln2.g`]!, w[`${h}.ln2.b`]!);
      x = tf.add(x, dense(gelu(dense(m, w[`${h}.mlp.w1`]!, w[`${h}.mlp.b1`]!)), w[`${h}.mlp.w2`]!, w[`${h}.mlp.b2`]!));
    }
    x = layerNorm(x, w['lnf.g']!, w['lnf.b']!);
    return dense(x, w['head.w']!, w['head.b']!) as tf.Tensor3D;
  });
}

/**
 * Log-probabilities of the response tokens under a policy: position t predicts token t+1, so the
 * response tokens at positions P..P+R−1 are scored by outputs P−1..P+R−2. Returns [B, R].
 */
export function responseLogprobs(spec: GptSpec, w: Weights, tokens: tf.Tensor2D, promptLen: number): tf.Tensor2D {
  return tf.tidy(() => {
    const [B, T] = tokens.shape;
    const R = T - promptLen;
    const logits = forward(spec, w, tokens); // [B, T, V]
    const pred = tf.slice(logits, [0, promptLen - 1, 0], [B, R, spec.vocab]); // [B, R, V]
    const chosen = tf.slice(tokens, [0, promptLen], [B, R]); // [B, R]
    const logp = tf.logSoftmax(pred);
    return tf.sum(tf.mul(logp, tf.oneHot(chosen, spec.vocab)), -1) as tf.Tensor2D; // [B, R]
  });
}

/** Values of the states before each response token: outputs P−1..P+R−2 of the scalar head. [B, R] */
export function responseValues(spec: GptSpec, w: Weights, tokens: tf.Tensor2D, promptLen: number): tf.Tensor2D {
  return tf.tidy(() => {
    const [B, T] = tokens.shape;
    const R = T - promptLen;
    const out = forward(spec, w, tokens); // [B, T, 1]
    return tf.reshape(tf.slice(out, [0, promptLen - 1, 0], [B, R, 1]), [B, R]) as tf.Tensor2D;
  });
}
