import { describe, it, expect, beforeAll } from 'vitest';
import * as tf from '@tensorflow/tfjs';
import { initBackend } from './backend/backend.ts';
import { forward, initialWeights, isHead, parameterCount, parameterShapes, responseLogprobs, responseValues, type GptSpec, type Weights } from './gpt.ts';
import { modelDigest } from '../../mesh/wire/transfer/transfer.ts';

const policy: GptSpec = { kind: 'policy', vocab: 5, context: 6, layers: 1, width: 8, heads: 2 };
const value: GptSpec = { ...policy, kind: 'value' };

beforeAll(async () => {
  await initBackend('cpu');
});

const weightsOf = (spec: GptSpec, seed: number): Weights => Object.fromEntries(initialWeights(spec, seed).map((t) => [t.name, tf.tensor(t.data, t.shape)]));

describe('parameterShapes and parameterCount', () => {
  it('lists the tensors in canonical order', () => {
    expect(parameterShapes(policy).map(([n]) => n)).toEqual([
      'wte',
      'wpe',
      'h0.ln1.g',
      'h0.ln1.b',
      'h0.attn.wq',
      'h0.attn.bq',
      'h0.attn.wk',
      'h0.attn.bk',
      'h0.attn.wv',
      'h0.attn.bv',
      'h0.attn.wo',
      'h0.attn.bo',
      'h0.ln2.g',
      'h0.ln2.b',
      'h0.mlp.w1',
      'h0.mlp.b1',
      'h0.mlp.w2',
      'h0.mlp.b2',
      'lnf.g',
      'lnf.b',
      'head.w',
      'head.b',
    ]);
    expect(Object.fromEntries(parameterShapes(policy))['h0.mlp.w1']).toEqual([8, 32]);
    expect(Object.fromEntries(parameterShapes(policy))['head.w']).toEqual([8, 5]);
    expect(Object.fromEntries(parameterShapes(value))['head.w']).toEqual([8, 1]);
  });

  it('counts by hand: V=5, C=6, D=8, L=1', () => {
    // wte 5·8 = 40, wpe 6·8 = 48                                              →   88
    // block: ln1 2·8 = 16; q, k, v, o each 8·8 + 8 = 72 → 288; ln2 16;
    //        w1 8·32 + 32 = 288; w2 32·8 + 8 = 264                              →  872
    // lnf 16; policy head 8·5 + 5 = 45 → 61; value head 8·1 + 1 = 9 → 25
    // policy 88 + 872 + 61 = 1021; value 88 + 872 + 25 = 985
    expect(parameterCount(policy)).toBe(1021);
    expect(parameterCount(value)).toBe(985);
    // two layers add one more block of 872
    expect(parameterCount({ ...policy, layers: 2 })).toBe(1021 + 872);
  });

  it('agrees with initialWeights', () => {
    for (const spec of [policy, value, { ...policy, layers: 3 }]) {
      const w = initialWeights(spec, 1);
      expect(w.map((t) => [t.name, t.shape])).toEqual(parameterShapes(spec));
      for (const t of w) expect(t.data.length).toBe(t.shape.reduce((a, b) => a * b, 1));
      expect(w.reduce((n, t) => n + t.data.length, 0)).toBe(parameterCount(spec));
    }
  });

  it('isHead tells the head from the shared body', () => {
    expect(
      parameterShapes(policy)
        .filter(([n]) => isHead(n))
        .map(([n]) => n),
    ).toEqual(['head.w', 'head.b']);
  });
});

describe('initialWeights', () => {
  it('is deterministic per seed, bit for bit', () => {
    expect(modelDigest(initialWeights(policy, 7))).toBe(modelDigest(initialWeights(policy, 7)));
    expect(modelDigest(initialWeights(policy, 7))).not.toBe(modelDigest(initialWeights(policy, 8)));
  });

  it('a policy and a value model of the same seed start from different bodies', () => {
    const p = initialWeights(policy, 7);
    const v = initialWeights(value, 7);
    expect(Array.from(p[0]!.data)).not.toEqual(Array.from(v[0]!.data));
  });

  it('GPT-2 init: gains 1, biases 0, matrices N(0, 0.02), residual projections scaled by 1/√(2L)', () => {
    const spec = { ...policy, width: 32, layers: 2 };
    const w = Object.fromEntries(initialWeights(spec, 3).map((t) => [t.name, t.data]));
    expect(Array.from(w['h1.ln2.g']!).every((x) => x === 1)).toBe(true);
    expect(Array.from(w['lnf.b']!).every((x) => x === 0)).toBe(true);
    expect(Array.from(w['head.b']!).every((x) => x === 0)).toBe(true);
    const std = (a: Float32Array) => Math.sqrt(a.reduce((s, x) => s + x * x, 0) / a.length);
    // w1 has 32·128 = 4096 draws: its std is within a few % of 0.02
    expect(std(w['h0.mlp.w1']!)).toBeGreaterThan(0.019);
    expect(std(w['h0.mlp.w1']!)).toBeLessThan(0.021);
    // w2 is residual: 0.02/√(2·2) = 0.01
    expect(std(w['h0.mlp.w2']!)).toBeGreaterThan(0.0095);
    expect(std(w['h0.mlp.w2']!)).toBeLessThan(0.0105);
  });
});

describe('forward', () => {
  it('policy gives [B, T, V], value gives [B, T, 1]', () => {
    const tokens = tf.tensor2d(
      [
        [0, 1, 2],
        [4, 3, 2],
      ],
      [2, 3],
      'int32',
    );
    const p = forward(policy, weightsOf(policy, 1), tokens);
    const v = forward(value, weightsOf(value, 1), tokens);
    expect(p.shape).toEqual([2, 3, 5]);
    expect(v.shape).toEqual([2, 3, 1]);
    tf.dispose([tokens, p, v]);
  });

  it('refuses a sequence longer than the context', () => {
    const tokens = tf.zeros([1, 7], 'int32') as tf.Tensor2D;
    expect(() => forward(policy, weightsOf(policy, 1), tokens)).toThrow(RangeError);
    expect(() => forward(policy, weightsOf(policy, 1), tokens)).toThrow(/sequence of 7 tokens exceeds the context of 6/);
  });

  it('is causal: a later token does not change earlier outputs', () => {
    const w = weightsOf(policy, 2);
    const out = forward(
      policy,
      w,
      tf.tensor2d(
        [
          [1, 2, 3, 0],
          [1, 2, 3, 4],
        ],
        [2, 4],
        'int32',
      ),
    );
    const [a, b] = out.arraySync() as number[][][];
    for (let t = 0; t < 3; t++) a![t]!.forEach((x, k) => expect(b![t]![k]).toBeCloseTo(x, 6));
    expect(a![3]).not.toEqual(b![3]);
  });
});

describe('responseLogprobs and responseValues', () => {
  it('log-probs of every possible next token sum to 1 in probability', () => {
    // Five rows share a prompt of 3 and differ only in the one response token (0..4).
    const w = weightsOf(policy, 4);
    const rows = [0, 1, 2, 3, 4].map((k) => [3, 1, 4, k]);
    const lp = responseLogprobs(policy, w, tf.tensor2d(rows, [5, 4], 'int32'), 3);
    expect(lp.shape).toEqual([5, 1]);
    const p = Array.from(lp.dataSync(), Math.exp);
    expect(p.reduce((a, b) => a + b, 0)).toBeCloseTo(1, 5);
    // with N(0, 0.02) weights the distribution is near uniform (1/5)
    for (const x of p) expect(Math.abs(x - 0.2)).toBeLessThan(0.05);
  });

  it('scores response positions P..T−1 with outputs P−1..T−2', () => {
    const w = weightsOf(policy, 5);
    const tokens = tf.tensor2d([[0, 1, 2, 3, 4, 0]], [1, 6], 'int32');
    const lp = responseLogprobs(policy, w, tokens, 2).arraySync()[0]!; // 4 response tokens
    const logits = forward(policy, w, tokens).arraySync()[0]!;
    const logSoftmax = (xs: number[]) => {
      const m = Math.max(...xs);
      const z = Math.log(xs.reduce((s, x) => s + Math.exp(x - m), 0)) + m;
      return xs.map((x) => x - z);
    };
    const next = [2, 3, 4, 0];
    next.forEach((tok, r) => expect(lp[r]).toBeCloseTo(logSoftmax(logits[1 + r]!)[tok]!, 5));
  });

  it('values of the states before each response token, [B, R]', () => {
    const w = weightsOf(value, 5);
    const tokens = tf.tensor2d(
      [
        [0, 1, 2, 3, 4],
        [4, 3, 2, 1, 0],
      ],
      [2, 5],
      'int32',
    );
    const v = responseValues(value, w, tokens, 3);
    expect(v.shape).toEqual([2, 2]);
    const out = forward(value, w, tokens).arraySync();
    const got = v.arraySync();
    for (let b = 0; b < 2; b++) for (let r = 0; r < 2; r++) expect(got[b]![r]).toBeCloseTo(out[b]![2 + r]![0]!, 6);
  });
});
