import { beforeAll, describe, expect, it } from 'vitest';
import * as tf from '@tensorflow/tfjs';
import { initBackend } from './backend/backend.ts';
import {
  attention,
  attentionBackward,
  batchMatMul,
  embedBackward,
  embedRows,
  layerNorm,
  layerNormBackward,
  linear,
  linearBackward,
  mlp,
  mlpBackward,
  rmsNorm,
  rmsNormBackward,
  rope,
  ropeBackward,
  ropeTables,
  sumRows,
  swiglu,
  swigluBackward,
  weightGrad,
} from './blocks.ts';
import { attnPartial, causalMask, embed, layerNorm as plainLayerNorm, mlpPartial } from './gpt.ts';
import { Rng } from './rng.ts';

const rand = (rng: Rng, shape: number[], scale = 1) =>
  tf.tensor(
    Float32Array.from({ length: shape.reduce((a, b) => a * b, 1) }, () => rng.normal() * scale),
    shape,
  );

/** max |a − b| over every element. */
const gap = (a: tf.Tensor, b: tf.Tensor) => tf.tidy(() => tf.max(tf.abs(tf.sub(a, b))).dataSync()[0]!);

// Each written-out backward pass against TensorFlow.js's automatic differentiation of gpt.ts's plain
// forward (the same math written once, independently), on the wasm backend that ferry runs by
// default, where the products take their 2-D and sliced paths.
describe('blocks: written-out backward passes equal automatic differentiation', () => {
  beforeAll(async () => {
    await initBackend('wasm');
  });

  it('layer norm', () => {
    const rng = new Rng(1);
    const [x, g, b, dy] = [rand(rng, [6, 8]), rand(rng, [8]), rand(rng, [8]), rand(rng, [6, 8])];
    const mine = layerNorm(x, g, b, true);
    expect(gap(mine.y, plainLayerNorm(x, g, b))).toBeLessThan(1e-5);
    const ours = layerNormBackward(mine.cache!, g, dy);
    const auto = tf.grads((xx: tf.Tensor, gg: tf.Tensor, bb: tf.Tensor) => plainLayerNorm(xx, gg, bb))([x, g, b], dy);
    expect(gap(ours.dx, auto[0]!)).toBeLessThan(1e-5);
    expect(gap(ours.dg, auto[1]!)).toBeLessThan(1e-5);
    expect(gap(ours.db, auto[2]!)).toBeLessThan(1e-5);
  });

  it('MLP, GELU included', () => {
    const rng = new Rng(2);
    const [h, w1, b1, w2, dy] = [rand(rng, [5, 4]), rand(rng, [4, 16], 0.5), rand(rng, [16], 0.5), rand(rng, [16, 4], 0.5), rand(rng, [5, 4])];
    const mine = mlp(h, w1, b1, w2, true);
    const plain = (hh: tf.Tensor, a: tf.Tensor, bb: tf.Tensor, c: tf.Tensor) => tf.reshape(mlpPartial(tf.reshape(hh, [1, 5, 4]), a, bb, c), [5, 4]);
    expect(gap(mine.out, plain(h, w1, b1, w2))).toBeLessThan(1e-5);
    const ours = mlpBackward(mine.cache!, w1, w2, dy);
    const auto = tf.grads(plain)([h, w1, b1, w2], dy);
    expect(gap(ours.dh, auto[0]!)).toBeLessThan(1e-5);
    expect(gap(ours.grads.w1!, auto[1]!)).toBeLessThan(1e-5);
    expect(gap(ours.grads.b1!, auto[2]!)).toBeLessThan(1e-5);
    expect(gap(ours.grads.w2!, auto[3]!)).toBeLessThan(1e-5);
  });

  it('causal attention over several rows and heads', () => {
    const rng = new Rng(3);
    const [B, T, D, H] = [3, 5, 8, 2];
    const w = {
      wq: rand(rng, [D, D], 0.4),
      bq: rand(rng, [D], 0.1),
      wk: rand(rng, [D, D], 0.4),
      bk: rand(rng, [D], 0.1),
      wv: rand(rng, [D, D], 0.4),
      bv: rand(rng, [D], 0.1),
      wo: rand(rng, [D, D], 0.4),
    };
    const h = rand(rng, [B * T, D]);
    const dy = rand(rng, [B * T, D]);
    const mask = causalMask(T);
    const mine = attention(h, w, { B, T, heads: H, kvHeads: H }, mask, true);
    const plain = (hh: tf.Tensor, wq: tf.Tensor, bq: tf.Tensor, wk: tf.Tensor, bk: tf.Tensor, wv: tf.Tensor, bv: tf.Tensor, wo: tf.Tensor) =>
      tf.reshape(attnPartial(tf.reshape(hh, [B, T, D]), { wq, bq, wk, bk, wv, bv, wo }, H, mask), [B * T, D]);
    const args = [h, w.wq, w.bq, w.wk, w.bk, w.wv, w.bv, w.wo];
    expect(gap(mine.out, plain(...(args as [tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor])))).toBeLessThan(1e-5);
    const ours = attentionBackward(mine.cache!, w, { B, T, heads: H, kvHeads: H }, dy);
    const auto = tf.grads(plain)(args, dy);
    expect(gap(ours.dh, auto[0]!)).toBeLessThan(1e-5);
    (['wq', 'bq', 'wk', 'bk', 'wv', 'bv', 'wo'] as const).forEach((n, i) => expect(gap(ours.grads[n]!, auto[i + 1]!), n).toBeLessThan(1e-5));
  });

  it('embeddings: the lookup, and the scatter-add of its gradient (positions past T get zero)', () => {
    const rng = new Rng(4);
    const [V, C, D, B, T] = [7, 6, 4, 2, 3];
    const [wte, wpe] = [rand(rng, [V, D]), rand(rng, [C, D])];
    const tokens = new Int32Array([1, 6, 1, 0, 1, 3]);
    const tokensT = tf.tensor2d(tokens, [B, T], 'int32');
    const dx = rand(rng, [B * T, D]);
    expect(gap(embedRows(tokensT, wte, wpe), tf.reshape(embed(tokensT, wte, wpe, V), [B * T, D]))).toBe(0);
    const ours = embedBackward(tokens, T, V, C, dx);
    const auto = tf.grads((a: tf.Tensor, b: tf.Tensor) => tf.reshape(embed(tokensT, a, b, V), [B * T, D]))([wte, wpe], dx);
    expect(gap(ours.dwte, auto[0]!)).toBeLessThan(1e-6);
    expect(gap(ours.dwpe!, auto[1]!)).toBeLessThan(1e-6);
    expect(Array.from(ours.dwpe!.dataSync().slice(T * D))).toEqual(new Array((C - T) * D).fill(0));
  });

  it('RMSNorm', () => {
    const rng = new Rng(7);
    const [x, g, dy] = [rand(rng, [6, 8]), rand(rng, [8]), rand(rng, [6, 8])];
    const plain = (xx: tf.Tensor, gg: tf.Tensor) => tf.mul(tf.div(xx, tf.sqrt(tf.add(tf.mean(tf.square(xx), -1, true), 1e-6))), gg);
    const mine = rmsNorm(x, g, 1e-6, true);
    expect(gap(mine.y, plain(x, g))).toBeLessThan(1e-5);
    const ours = rmsNormBackward(mine.cache!, g, dy);
    const auto = tf.grads(plain)([x, g], dy);
    expect(gap(ours.dx, auto[0]!)).toBeLessThan(1e-5);
    expect(gap(ours.dg, auto[1]!)).toBeLessThan(1e-5);
  });

  it('SwiGLU MLP', () => {
    const rng = new Rng(8);
    const [h, w1, w3, w2, dy] = [rand(rng, [5, 4]), rand(rng, [4, 12], 0.5), rand(rng, [4, 12], 0.5), rand(rng, [12, 4], 0.5), rand(rng, [5, 4])];
    const plain = (hh: tf.Tensor, a: tf.Tensor, c: tf.Tensor, d: tf.Tensor) => {
      const u = tf.matMul(hh as tf.Tensor2D, a as tf.Tensor2D);
      return tf.matMul(tf.mul(tf.mul(u, tf.sigmoid(u)), tf.matMul(hh as tf.Tensor2D, c as tf.Tensor2D)) as tf.Tensor2D, d as tf.Tensor2D);
    };
    const mine = swiglu(h, w1, w3, w2, true);
    expect(gap(mine.out, plain(h, w1, w3, w2))).toBeLessThan(1e-5);
    const ours = swigluBackward(mine.cache!, w1, w3, w2, dy);
    const auto = tf.grads(plain)([h, w1, w3, w2], dy);
    [ours.dh, ours.grads.w1!, ours.grads.w3!, ours.grads.w2!].forEach((t, i) => expect(gap(t, auto[i]!), `input ${i}`).toBeLessThan(1e-5));
  });

  it('rotary positions: pairs (i, i + hd/2) turned by position / θ^(2i/hd), and the backward pass', () => {
    const rng = new Rng(9);
    const [x, dy] = [rand(rng, [2, 3, 4]), rand(rng, [2, 3, 4])];
    const t = ropeTables(100, 4, 5, 3);
    // By hand: position 5 + j, element pair (i, i + 2) turns by (5 + j) / 100^(i/2).
    const xs = x.arraySync() as number[][][];
    const got = rope(x, t).arraySync() as number[][][];
    for (let r = 0; r < 2; r++)
      for (let j = 0; j < 3; j++)
        for (let i = 0; i < 2; i++) {
          const a = (5 + j) / 100 ** (i / 2);
          const [u, v] = [xs[r]![j]![i]!, xs[r]![j]![i + 2]!];
          expect(got[r]![j]![i]).toBeCloseTo(u * Math.cos(a) - v * Math.sin(a), 5);
          expect(got[r]![j]![i + 2]).toBeCloseTo(v * Math.cos(a) + u * Math.sin(a), 5);
        }
    const auto = tf.grads((xx: tf.Tensor) => rope(xx, t))([x], dy);
    expect(gap(ropeBackward(dy, t), auto[0]!)).toBeLessThan(1e-6);
  });

  it('grouped-query attention with rotary positions and q/k/v biases (2 key/value heads for 4 query heads)', () => {
    const rng = new Rng(10);
    const [B, T, H, KV, hd] = [2, 5, 4, 2, 3 * 2];
    const D = H * hd;
    const w = {
      wq: rand(rng, [D, D], 0.3),
      bq: rand(rng, [D], 0.1),
      wk: rand(rng, [D, KV * hd], 0.3),
      bk: rand(rng, [KV * hd], 0.1),
      wv: rand(rng, [D, KV * hd], 0.3),
      bv: rand(rng, [KV * hd], 0.1),
      wo: rand(rng, [D, D], 0.3),
    };
    const h = rand(rng, [B * T, D]);
    const dy = rand(rng, [B * T, D]);
    const mask = causalMask(T);
    const t = ropeTables(10000, hd, 0, T);
    const dims = { B, T, heads: H, kvHeads: KV, rope: t };
    // Independently: each key/value head repeated for its query heads, [B, H, T, hd] throughout.
    const plain = (hh: tf.Tensor, wq: tf.Tensor, bq: tf.Tensor, wk: tf.Tensor, bk: tf.Tensor, wv: tf.Tensor, bv: tf.Tensor, wo: tf.Tensor) => {
      const heads = (x: tf.Tensor, n: number) => tf.transpose(tf.reshape(x, [B, T, n, hd]), [0, 2, 1, 3]);
      const repeat = (x: tf.Tensor) => tf.reshape(tf.tile(tf.reshape(x, [B * KV, 1, T * hd]), [1, H / KV, 1]), [B, H, T, hd]);
      const lin = (x: tf.Tensor, ww: tf.Tensor, b: tf.Tensor) => tf.add(tf.matMul(x as tf.Tensor2D, ww as tf.Tensor2D), b);
      const q = rope(heads(lin(hh, wq, bq), H), t);
      const k = repeat(rope(heads(lin(hh, wk, bk), KV), t));
      const v = repeat(heads(lin(hh, wv, bv), KV));
      const p = tf.softmax(tf.add(tf.div(tf.matMul(q, k, false, true), Math.sqrt(hd)), mask));
      return tf.matMul(tf.reshape(tf.transpose(tf.matMul(p, v), [0, 2, 1, 3]), [B * T, D]) as tf.Tensor2D, wo as tf.Tensor2D);
    };
    const args = [h, w.wq, w.bq, w.wk, w.bk, w.wv, w.bv, w.wo] as [tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor];
    const mine = attention(h, w, dims, mask, true);
    expect(gap(mine.out, plain(...args))).toBeLessThan(1e-5);
    const ours = attentionBackward(mine.cache!, w, dims, dy);
    const auto = tf.grads(plain)(args, dy);
    expect(gap(ours.dh, auto[0]!)).toBeLessThan(1e-5);
    (['wq', 'bq', 'wk', 'bk', 'wv', 'bv', 'wo'] as const).forEach((n, i) => expect(gap(ours.grads[n]!, auto[i + 1]!), n).toBeLessThan(1e-5));
  });

  it('a weight gradient in pieces of rows, either operand transposed, equals xᵀ·dy', () => {
    const rng = new Rng(5);
    for (const [N, D, O] of [
      [3000, 3, 5],
      [3000, 6, 2],
      [40, 3, 5],
      [40, 6, 2],
    ] as const) {
      const [x, dy] = [rand(rng, [N, D]), rand(rng, [N, O])];
      expect(gap(weightGrad(x, dy), tf.matMul(x, dy, true, false)), `${N}×${D}, ${N}×${O}`).toBeLessThan(1e-3);
    }
  });

  it('a LoRA adapter on a linear layer: x·w + b + s·(x·a)·b, its gradients, a frozen base, and a zero b that changes no bit', () => {
    const rng = new Rng(16);
    const [x, w, bias, a, b, dy] = [rand(rng, [9, 6]), rand(rng, [6, 5]), rand(rng, [5]), rand(rng, [6, 2]), rand(rng, [2, 5]), rand(rng, [9, 5])];
    const adapter = { a, b, scale: 1.5, aName: 'x.lora_a', bName: 'x.lora_b' };
    const plain = (xx: tf.Tensor, aa: tf.Tensor, bb: tf.Tensor) => tf.add(tf.matMul(xx as tf.Tensor2D, tf.add(w, tf.mul(tf.matMul(aa as tf.Tensor2D, bb as tf.Tensor2D), 1.5)) as tf.Tensor2D), bias);
    expect(gap(linear(x, w, bias, adapter), plain(x, a, b))).toBeLessThan(1e-5);
    const ours = linearBackward(x, w, dy, { adapter, frozen: true });
    const auto = tf.grads(plain)([x, a, b], dy);
    expect(gap(ours.dx, auto[0]!)).toBeLessThan(1e-5);
    expect(gap(ours.adapter!['x.lora_a']!, auto[1]!)).toBeLessThan(1e-5);
    expect(gap(ours.adapter!['x.lora_b']!, auto[2]!)).toBeLessThan(1e-5);
    expect(ours.dw).toBeUndefined();
    expect(ours.db).toBeUndefined();
    // A fresh adapter (b = 0) leaves the product as it was, to the bit.
    const fresh = { ...adapter, b: tf.zerosLike(b) };
    expect(Array.from(linear(x, w, bias, fresh).dataSync())).toEqual(Array.from(linear(x, w, bias).dataSync()));
  });

  it('a linear layer, row sums, and batched products', () => {
    const rng = new Rng(6);
    const [x, w, dy] = [rand(rng, [9, 4]), rand(rng, [4, 3]), rand(rng, [9, 3])];
    const ours = linearBackward(x, w, dy);
    const auto = tf.grads((a: tf.Tensor, b: tf.Tensor, c: tf.Tensor) => tf.add(tf.matMul(a as tf.Tensor2D, b as tf.Tensor2D), c))([x, w, tf.zeros([3])], dy);
    expect(gap(ours.dx, auto[0]!)).toBeLessThan(1e-5);
    expect(gap(ours.dw!, auto[1]!)).toBeLessThan(1e-5);
    expect(gap(ours.db!, auto[2]!)).toBeLessThan(1e-5);
    expect(gap(sumRows(dy), tf.sum(dy, 0))).toBeLessThan(1e-5);
    // Small matrices take the batched product, large ones one 2-D product each.
    for (const [n, M, K, N] of [
      [4, 3, 5, 2],
      [3, 40, 30, 40],
    ]) {
      const [a, b] = [rand(rng, [n!, M!, K!]), rand(rng, [n!, K!, N!])];
      expect(gap(batchMatMul(a, b), tf.matMul(a as tf.Tensor3D, b as tf.Tensor3D))).toBeLessThan(1e-4);
    }
  });
});
