import { describe, it, expect, beforeAll } from 'vitest';
import { initBackend } from '../engine/model/backend/backend.ts';
import { ShardError } from '../engine/model/steps.ts';
import { ReferenceGpt } from './reference-gpt.ts';
import type { GptSpec } from '../engine/model/gpt.ts';
import { demonstrations, makeTask } from '../engine/device/task.ts';
import { seedOf } from '../engine/model/rng.ts';
import { modelDigest, type NamedTensor } from '../mesh/wire/transfer/transfer.ts';
import type { LossSpec, Optim } from '../mesh/wire/messages/protocol.ts';

const policy: GptSpec = { kind: 'policy', vocab: 5, context: 6, layers: 1, width: 8, heads: 2 };
const value: GptSpec = { ...policy, kind: 'value' };
const optim: Optim = { lr: 1e-2, beta1: 0.9, beta2: 0.999, eps: 1e-8, clipNorm: 1 };
const clipPolicy: LossSpec = { name: 'clip_policy', params: { clip: 0.2 } };
const clipValue: LossSpec = { name: 'clip_value', params: { clip: 0.2 } };
// copy 2 digits in base 4: prompt [d, d, 4], response [d, d]; vocab 5, 5 tokens ≤ context 6
const task = makeTask('copy', 2, 4);

beforeAll(async () => {
  await initBackend('cpu');
});

const digest = (s: ReferenceGpt) => modelDigest(s.exportTensors());
/** Copies, so that later changes to a shard cannot reach what a test holds. */
const snapshot = (s: ReferenceGpt): NamedTensor[] => s.exportTensors().map((t) => ({ ...t, shape: [...t.shape], data: t.data.slice() }));
/** Runs `fn` so that a synchronous throw and a rejection look the same (sync or async methods). */
const attempt = (fn: () => unknown): Promise<unknown> => (async () => fn())();
const seedsFor = (base: number, n: number) => Uint32Array.from({ length: n }, (_, i) => seedOf(base, 3, 0, i));

describe('ReferenceGpt construction and export', () => {
  it('starts from initialWeights(seed): same seed, same digest', () => {
    const a = new ReferenceGpt(policy, 11);
    const b = new ReferenceGpt(policy, 11, optim);
    const c = new ReferenceGpt(policy, 12);
    expect(digest(a)).toBe(digest(b));
    expect(digest(a)).not.toBe(digest(c));
    expect(a.trainable).toBe(false);
    expect(b.trainable).toBe(true);
    expect(a.exportTensors().reduce((n, t) => n + t.data.length, 0)).toBe(1021);
    [a, b, c].forEach((s) => s.dispose());
  });
});

describe('sft', () => {
  it('lowers the loss on a trivial copy task', async () => {
    const shard = new ReferenceGpt(policy, 1, optim);
    const demos = demonstrations(task, 1, 32); // 32 rows of 5 tokens
    const { loss, first_loss } = await shard.sft(demos, 32, task.promptLen, 40, 16, 1e-2, 0);
    // an untrained model is near uniform over 5 tokens: cross-entropy ≈ ln 5 = 1.609
    expect(first_loss).toBeGreaterThan(1.4);
    expect(first_loss).toBeLessThan(1.8);
    expect(loss).toBeLessThan(first_loss * 0.8);
    shard.dispose();
  });

  it('is refused without an optimizer, and changes nothing', async () => {
    const shard = new ReferenceGpt(policy, 1);
    const before = digest(shard);
    await expect(attempt(() => shard.sft(demonstrations(task, 1, 4), 4, 3, 1, 4, 1e-2, 0))).rejects.toThrow(ShardError);
    expect(digest(shard)).toBe(before);
    shard.dispose();
  });
});

describe('generate', () => {
  const batch = 8;
  const prompts = task.prompts(3, 0, batch); // [8, 3]

  it('keeps the prompts, samples in-vocabulary tokens, and returns their log-probs', async () => {
    const shard = new ReferenceGpt(policy, 2);
    const { tokens, logprobs } = await shard.generate(prompts, batch, 3, 3, seedsFor(1, batch), 1);
    expect(tokens).toBeInstanceOf(Int32Array);
    expect(tokens.length).toBe(batch * 6);
    for (let b = 0; b < batch; b++) {
      expect(Array.from(tokens.subarray(b * 6, b * 6 + 3))).toEqual(Array.from(prompts.subarray(b * 3, b * 3 + 3)));
      for (const t of tokens.subarray(b * 6 + 3, b * 6 + 6)) {
        expect(t).toBeGreaterThanOrEqual(0);
        expect(t).toBeLessThan(policy.vocab);
      }
    }
    expect(logprobs).toBeInstanceOf(Float32Array);
    expect(logprobs.length).toBe(batch * 3);
    for (const x of logprobs) expect(x).toBeLessThan(0);
    expect(Array.from(logprobs)).toEqual(Array.from(shard.logprobs(tokens, batch, 3)));
    shard.dispose();
  });

  it('the same seeds give identical tokens; different seeds give different tokens', async () => {
    const shard = new ReferenceGpt(policy, 2);
    const a = (await shard.generate(prompts, batch, 3, 3, seedsFor(1, batch), 1)).tokens;
    const b = (await shard.generate(prompts, batch, 3, 3, seedsFor(1, batch), 1)).tokens;
    const c = (await shard.generate(prompts, batch, 3, 3, seedsFor(2, batch), 1)).tokens;
    expect(b).toEqual(a);
    // 24 near-uniform draws over 5 tokens: all equal by chance has probability ≈ 0.2^24
    expect(c).not.toEqual(a);
    // another shard with the same weights samples the same tokens (no hidden state)
    const other = new ReferenceGpt(policy, 2);
    expect((await other.generate(prompts, batch, 3, 3, seedsFor(1, batch), 1)).tokens).toEqual(a);
    shard.dispose();
    other.dispose();
  });

  it('row b depends only on its own seed', async () => {
    const shard = new ReferenceGpt(policy, 2);
    const seeds = seedsFor(1, batch);
    const a = (await shard.generate(prompts, batch, 3, 3, seeds, 1)).tokens;
    const changed = seeds.slice();
    changed[5] = 12345;
    const b = (await shard.generate(prompts, batch, 3, 3, changed, 1)).tokens;
    for (let r = 0; r < batch; r++) {
      if (r === 5) continue;
      expect(Array.from(b.subarray(r * 6, r * 6 + 6))).toEqual(Array.from(a.subarray(r * 6, r * 6 + 6)));
    }
    shard.dispose();
  });

  it('is a policy call: a value shard refuses it', async () => {
    const shard = new ReferenceGpt(value, 2);
    const run = () => attempt(() => shard.generate(prompts, batch, 3, 3, seedsFor(1, batch), 1));
    await expect(run()).rejects.toThrow(ShardError);
    await expect(run()).rejects.toThrow('generate needs a policy model; this shard is a value model');
    shard.dispose();
  });
});

describe('importTensors', () => {
  it('copies another shard’s weights (digests then agree)', () => {
    const a = new ReferenceGpt(policy, 1);
    const b = new ReferenceGpt(policy, 2);
    b.importTensors(snapshot(a));
    expect(digest(b)).toBe(digest(a));
    a.dispose();
    b.dispose();
  });

  it('a subset (the body) leaves the rest alone', () => {
    const p = new ReferenceGpt(policy, 1);
    const v = new ReferenceGpt(value, 2);
    const headBefore = v
      .exportTensors()
      .filter((t) => t.name.startsWith('head.'))
      .map((t) => Array.from(t.data));
    v.importTensors(snapshot(p).filter((t) => !t.name.startsWith('head.')));
    const after = v.exportTensors();
    expect(Array.from(after.find((t) => t.name === 'wte')!.data)).toEqual(Array.from(p.exportTensors()[0]!.data));
    expect(after.filter((t) => t.name.startsWith('head.')).map((t) => Array.from(t.data))).toEqual(headBefore);
    p.dispose();
    v.dispose();
  });

  it('a wrong shape throws and changes nothing, even after valid tensors in the same set', () => {
    const a = new ReferenceGpt(policy, 1);
    const b = new ReferenceGpt(policy, 2);
    const before = digest(b);
    const bad = snapshot(a).map((t) => (t.name === 'head.w' ? { ...t, shape: [5, 8] } : t)); // [8, 5] expected
    expect(() => b.importTensors(bad)).toThrow(ShardError);
    expect(() => b.importTensors(bad)).toThrow("parameter 'head.w': expected shape [8,5], got [5,8]");
    expect(digest(b)).toBe(before);
    a.dispose();
    b.dispose();
  });

  it('an unknown name throws and changes nothing', () => {
    const a = new ReferenceGpt(policy, 1);
    const v = new ReferenceGpt(value, 2);
    const before = digest(v);
    const set = [...snapshot(a).slice(0, 3), { name: 'h9.attn.wq', shape: [8, 8], data: new Float32Array(64) }];
    expect(() => v.importTensors(set)).toThrow("no parameter 'h9.attn.wq' in a value model");
    expect(digest(v)).toBe(before);
    a.dispose();
    v.dispose();
  });

  it('a tensor whose data does not fill its shape throws and changes nothing', () => {
    // "Shapes are checked first, so a bad set changes nothing": a set whose first tensor is
    // valid and whose second has the right shape but too few values must leave the shard as it was.
    const a = new ReferenceGpt(policy, 1);
    const b = new ReferenceGpt(policy, 2);
    const before = digest(b);
    const good = snapshot(a);
    const bad = [good[0]!, { ...good[1]!, data: good[1]!.data.subarray(0, 10) }]; // wpe [6, 8] needs 48 values
    expect(() => b.importTensors(bad)).toThrow();
    expect(digest(b)).toBe(before);
    a.dispose();
    b.dispose();
  });
});

describe('train', () => {
  /** A rollout of 8 rows from the policy itself, with made-up advantages. */
  async function rollout(shard: ReferenceGpt) {
    const batch = 8;
    const { tokens, logprobs } = await shard.generate(task.prompts(5, 0, batch), batch, 3, 2, seedsFor(9, batch), 1);
    const advantages = Float32Array.from({ length: batch * 2 }, (_, i) => (i % 3) - 1);
    return { batch, tokens, logprobs, advantages };
  }

  it('a policy with an optimizer changes its parameters, reproducibly', async () => {
    const run = async () => {
      const shard = new ReferenceGpt(policy, 3, optim);
      const before = digest(shard);
      const r = await rollout(shard);
      const stats = await shard.train(r.tokens, r.batch, 3, 2, clipPolicy, { old: r.logprobs, advantages: r.advantages }, 2, 2, 17);
      const after = digest(shard);
      shard.dispose();
      return { before, after, stats };
    };
    const first = await run();
    expect(first.after).not.toBe(first.before);
    expect(Number.isFinite(first.stats.loss)).toBe(true);
    expect(first.stats.gradNorm).toBeGreaterThan(0);
    expect(first.stats.stats.clipfrac).toBeGreaterThanOrEqual(0);
    expect(first.stats.stats.clipfrac).toBeLessThanOrEqual(1);
    // the same inputs and seed end in the same bits
    expect((await run()).after).toBe(first.after);
  });

  it('at the behaviour policy, one minibatch of everything: loss −mean(A), nothing clipped', async () => {
    // One epoch, one minibatch of all rows: the loss is computed before the step, where the
    // ratio is 1 everywhere, so it is −mean(A) and clipfrac is 0.
    // A = [(i mod 3) − 1] for i = 0..15 = [−1, 0, 1, −1, 0, 1, …, −1]: five full cycles sum to 0,
    // plus A_15 = −1 → sum −1 → −mean = 1/16 = 0.0625
    const shard = new ReferenceGpt(policy, 3, optim);
    const r = await rollout(shard);
    const stats = await shard.train(r.tokens, r.batch, 3, 2, clipPolicy, { old: r.logprobs, advantages: r.advantages }, 1, 1, 1);
    expect(stats.loss).toBeCloseTo(0.0625, 5);
    expect(stats.stats.clipfrac).toBe(0);
    shard.dispose();
  });

  it('a value model with an optimizer changes its parameters', async () => {
    const p = new ReferenceGpt(policy, 3);
    const v = new ReferenceGpt(value, 3, optim);
    const r = await rollout(p);
    const before = digest(v);
    const old = v.values(r.tokens, r.batch, 3);
    // returns 1 away from the old values: ½·mean((V − R)²) = ½ at the first step
    const returns = Float32Array.from(old, (x, i) => x + (i % 2 ? 1 : -1));
    const stats = await v.train(r.tokens, r.batch, 3, 2, clipValue, { old, returns }, 1, 1, 4);
    expect(stats.loss).toBeCloseTo(0.5, 5);
    expect(digest(v)).not.toBe(before);
    p.dispose();
    v.dispose();
  });

  it('a loss for the other head is refused with a ShardError, and changes nothing', async () => {
    const p = new ReferenceGpt(policy, 3, optim);
    const v = new ReferenceGpt(value, 3, optim);
    const r = await rollout(p);
    const [pBefore, vBefore] = [digest(p), digest(v)];
    const zeros = new Float32Array(r.batch * 2);
    await expect(attempt(() => p.train(r.tokens, r.batch, 3, 2, clipValue, { old: zeros, returns: zeros }, 1, 1, 1))).rejects.toThrow(
      "the loss 'clip_value' needs a value model; this shard is a policy model",
    );
    await expect(attempt(() => v.train(r.tokens, r.batch, 3, 2, clipPolicy, { old: zeros, advantages: zeros }, 1, 1, 1))).rejects.toThrow(ShardError);
    expect([digest(p), digest(v)]).toEqual([pBefore, vBefore]);
    p.dispose();
    v.dispose();
  });

  it('dpo at the reference, one mini-batch of every pair: loss ln 2, and the parameters move', async () => {
    // ref = the policy's own log-probs, so every h = Σ(logp − ref) is 0 before the step and the
    // loss is softplus(0) = ln 2 = 0.6931472. Rows 0..3 are the chosen halves, 4..7 the rejected.
    const shard = new ReferenceGpt(policy, 3, optim);
    const r = await rollout(shard);
    const before = digest(shard);
    const ref = shard.logprobs(r.tokens, r.batch, 3);
    const stats = await shard.train(r.tokens, r.batch, 3, 2, { name: 'pair_sigmoid', params: { beta: 0.1 } }, { ref }, 1, 1, 1);
    expect(stats.loss).toBeCloseTo(Math.LN2, 5);
    // pair_sigmoid clips nothing, so it reports no clip fraction.
    expect(stats.stats).toEqual({});
    expect(digest(shard)).not.toBe(before);
    shard.dispose();
  });

  it('a shard built without an optimizer refuses train with a ShardError and changes nothing', async () => {
    const shard = new ReferenceGpt(policy, 3);
    const r = await rollout(shard);
    const before = digest(shard);
    const run = () => attempt(() => shard.train(r.tokens, r.batch, 3, 2, clipPolicy, { old: r.logprobs, advantages: r.advantages }, 2, 2, 1));
    await expect(run()).rejects.toThrow(ShardError);
    await expect(run()).rejects.toThrow(/holds no optimizer/);
    expect(digest(shard)).toBe(before);
    shard.dispose();
  });
});
