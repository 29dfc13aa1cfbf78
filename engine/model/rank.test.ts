// Every strategy over up to 4 devices against the unsharded model: logits (as log-probabilities
// and values), generated tokens, and the parameters after a training call. The ranks run as
// separate Device objects talking over an in-memory bus (test/sharded-nats.test.ts does the same over
// NATS with worker processes).
import { beforeAll, describe, expect, it } from 'vitest';
import { shardSlices, type Layout } from '../../mesh/parallel/layout.ts';
import { PROTOCOL_VERSION, type CallBody, type CallOf, type Optim } from '../../mesh/wire/messages/protocol.ts';
import { cut } from '../../mesh/parallel/slices.ts';
import { initBackend } from './backend/backend.ts';
import { expectClose, mesh, strategies } from '../../test/in-memory-mesh.ts';
import { modelInfo, parameterShapes, type GptSpec } from './params.ts';
import { maskOfLengths, responseLengths, responseMask } from './mask.ts';
import { ReferenceGpt } from '../../test/reference-gpt.ts';

const policy: GptSpec = { kind: 'policy', vocab: 11, context: 9, layers: 4, width: 16, heads: 4 };
const value: GptSpec = { ...policy, kind: 'value' };
// eps = 1e-3, not 1e-8: with a tiny eps Adam's first step is lr·sign(g), which turns a last-bit
// difference in a near-zero gradient (summation order differs across ranks) into a full step;
// a larger eps keeps parameters linear in the gradients, which is what this test compares.
const optim: Optim = { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-3, clipNorm: 1 };
const epochs = 1;
const minibatches = 1;
const policyLoss = { name: 'clip_policy', params: { clip: 0.2 } };
/** The actor's loss in a comparison, and its per-token arrays from the log-probs, advantages and mask. */
interface ActorLoss {
  spec: { name: string; params: Record<string, number | string | boolean> };
  data(logprobs: Float32Array, advantages: Float32Array, mask: Float32Array): Record<string, Float32Array>;
}
const clipPolicyLoss: ActorLoss = { spec: policyLoss, data: (old, advantages, mask) => ({ old, advantages, mask }) };
const valueLoss = { name: 'clip_value', params: { clip: 0.2 } };
const B = 8;
const P = 5;
const R = 4;
/** An end token the untrained model draws often enough that the seeded rollout is ragged (checked below). */
const EOS = 6;

function prompts(): Int32Array {
  return Int32Array.from({ length: B * P }, (_, i) => (i % P === P - 1 ? 10 : (i * 7 + 3) % 10));
}
const seeds = Uint32Array.from({ length: B }, (_, i) => 1000 + i);

async function scenario(layout: Layout, actorSpec: GptSpec = policy, criticSpec: GptSpec = value, actorLoss: ActorLoss = clipPolicyLoss) {
  const m = mesh(layout);
  const load =
    (spec: GptSpec, role: 'actor' | 'critic') =>
    (rank: number): CallBody => ({ fn: 'load', role, spec, layout, rank, seed: 7, optim });
  await m.run('actor', load(actorSpec, 'actor'));
  await m.run('critic', load(criticSpec, 'critic'));
  const gen = await m.run('actor', () => ({ fn: 'generate', prompts: prompts(), batch: B, promptLen: P, responseLen: R, seeds, temperature: 1, eos: EOS }));
  const tokens = m.gather<Int32Array>(gen, 'tokens');
  const mask = responseMask(tokens, P, R, EOS);
  const genLogprobs = m.gather<Float32Array>(gen, 'logprobs');
  const batch = { tokens, batch: B, promptLen: P, responseLen: R };
  const logprobs = m.gather<Float32Array>(await m.run('actor', () => ({ fn: 'inference', ...batch })), 'logprobs');
  const values = m.gather<Float32Array>(await m.run('critic', () => ({ fn: 'inference', ...batch })), 'values');
  const adv = Float32Array.from({ length: B * R }, (_, i) => Math.sin(i));
  const ret = Float32Array.from({ length: B * R }, (_, i) => Math.cos(i) * 0.5);
  const actorTrain = await m.run('actor', () => ({ fn: 'train', ...batch, seed: 11, epochs, minibatches, loss: actorLoss.spec, data: actorLoss.data(logprobs, adv, mask) }));
  const criticTrain = await m.run('critic', () => ({ fn: 'train', ...batch, seed: 12, epochs, minibatches, loss: valueLoss, data: { old: values, returns: ret, mask } }));
  const sum = (outs: Array<Record<string, unknown>>, k: string) => outs.reduce((a, o) => a + (o[k] as number), 0);
  const after = async (model: string) => (await m.run(model, () => ({ fn: 'manifest' }))).map((o) => o.digest as string);
  // The parameters after training, per rank, as the ranks hold them.
  const slices = (model: string) =>
    m.devices.map((d) =>
      (d as unknown as { hosted: Map<string, { shard: { weights: { exportTensors(): Array<{ name: string; data: Float32Array }> } } }> }).hosted.get(model)!.shard.weights.exportTensors(),
    );
  return {
    tokens,
    genLogprobs,
    logprobs,
    values,
    actorLoss: sum(actorTrain, 'loss'),
    criticLoss: sum(criticTrain, 'loss'),
    actorSlices: slices('actor'),
    criticSlices: slices('critic'),
    digests: [...(await after('actor')), ...(await after('critic'))],
  };
}

async function reference(
  actorSpec: GptSpec = policy,
  criticSpec: GptSpec = actorSpec.family === 'llama' ? { ...value, family: 'llama', kvHeads: actorSpec.kvHeads, ffn: actorSpec.ffn, ropeTheta: actorSpec.ropeTheta } : value,
  actorLoss: ActorLoss = clipPolicyLoss,
) {
  const actor = new ReferenceGpt(actorSpec, 7, optim);
  const critic = new ReferenceGpt(criticSpec, 7, optim);
  const gen = await actor.generate(prompts(), B, P, R, seeds, 1, false, EOS);
  const mask = responseMask(gen.tokens, P, R, EOS);
  const logprobs = actor.logprobs(gen.tokens, B, P);
  const values = critic.values(gen.tokens, B, P);
  const adv = Float32Array.from({ length: B * R }, (_, i) => Math.sin(i));
  const ret = Float32Array.from({ length: B * R }, (_, i) => Math.cos(i) * 0.5);
  const a = await actor.train(gen.tokens, B, P, R, actorLoss.spec, actorLoss.data(logprobs, adv, mask), epochs, minibatches, 11);
  const c = await critic.train(gen.tokens, B, P, R, valueLoss, { old: values, returns: ret, mask }, epochs, minibatches, 12);
  return { tokens: gen.tokens, genLogprobs: gen.logprobs, logprobs, values, actorLoss: a.loss, criticLoss: c.loss, actor: actor.exportTensors(), critic: critic.exportTensors() };
}

describe('every layout, one device included, against the reference (automatic differentiation)', () => {
  let ref: Awaited<ReturnType<typeof reference>>;
  beforeAll(async () => {
    await initBackend('wasm');
    ref = await reference();
  });

  // One device is the one-rank case of a mesh: it is checked like every other layout.
  const all = strategies(4);

  it('generates a ragged rollout: some rows end early at EOS, some run to the budget', () => {
    const lengths = Array.from(responseLengths(ref.tokens, P, R, EOS));
    expect(lengths.some((l) => l < R)).toBe(true);
    expect(lengths.some((l) => l === R)).toBe(true);
    // After its end a row holds EOS, with log-probability 0.
    lengths.forEach((l, b) => {
      for (let t = l; t < R; t++) {
        expect(ref.tokens[b * (P + R) + P + t]).toBe(EOS);
        expect(ref.genLogprobs[b * R + t]).toBe(0);
      }
    });
  });

  it('covers one device and every dp × tp × pp over 2 and 4 devices', () => {
    expect(all.map((l) => `${l.dp}${l.tp}${l.pp}`).sort()).toEqual(['111', '112', '114', '121', '122', '141', '211', '212', '221', '411'].sort());
  });

  it.each(all.map((l) => [`dp=${l.dp} tp=${l.tp} pp=${l.pp}`, l] as const))(
    '%s: same tokens, log-probs, values and trained parameters',
    async (_, layout) => {
      await compare(layout, ref, policy);
    },
    60_000,
  );
});

describe("a tied head (GPT-2's: the logits are the rows times the token embedding, transposed)", () => {
  const tied: GptSpec = { ...policy, tied: true };
  let ref: Awaited<ReturnType<typeof reference>>;
  beforeAll(async () => {
    await initBackend('wasm');
    ref = await reference(tied);
  });

  it('has no head parameters of its own, and differs from the untied model', async () => {
    expect(ref.actor.map((t) => t.name).filter((n) => n.startsWith('head.'))).toEqual([]);
    const untied = await reference(policy);
    expect(Array.from(ref.logprobs)).not.toEqual(Array.from(untied.logprobs));
  });

  it('on a pipeline, the last stage reads the embedding as it is after each step: four steps, then log-probs', async () => {
    const layout: Layout = { devices: [0, 1, 2, 3], dp: 2, tp: 1, pp: 2 };
    const tokens = Int32Array.from({ length: B * (P + R) }, (_, i) => (i * 7 + 3) % 10);
    const data = { old: new Float32Array(B * R).fill(-2.4), advantages: Float32Array.from({ length: B * R }, (_, i) => Math.sin(i)) };
    const whole = new ReferenceGpt(tied, 7, optim);
    await whole.train(tokens, B, P, R, policyLoss, data, 2, 2, 5);
    const m = mesh(layout);
    await m.run('actor', (rank) => ({ fn: 'load', role: 'actor', spec: tied, layout, rank, seed: 7, optim }));
    await m.run('actor', () => ({ fn: 'train', tokens, batch: B, promptLen: P, responseLen: R, seed: 5, epochs: 2, minibatches: 2, loss: policyLoss, data }));
    const got = m.gather<Float32Array>(await m.run('actor', () => ({ fn: 'inference', tokens, batch: B, promptLen: P, responseLen: R })), 'logprobs');
    expectClose(got, whole.logprobs(tokens, B, P), 'log-probs after four steps');
    whole.dispose();
  }, 60_000);

  // On a pipeline the last stage reads a copy of the first stage's embedding, and sends its gradient back.
  it.each(strategies(4).map((l) => [`dp=${l.dp} tp=${l.tp} pp=${l.pp}`, l] as const))(
    '%s: same tokens, log-probs and trained parameters (the embedding learns from both ends)',
    async (_, layout) => {
      await compare(layout, ref, tied);
    },
    60_000,
  );
});

describe('the llama family (RMSNorm, rotary positions, SwiGLU, 2 key/value heads for 4 query heads)', () => {
  // tp = 4 would split 2 key/value heads four ways: refused; every other layout runs.
  const llama: GptSpec = { ...policy, family: 'llama', kvHeads: 2, ffn: 24, ropeTheta: 500 };
  const qwen: GptSpec = { ...llama, qkvBias: true, tied: true };
  const refs = new Map<GptSpec, Awaited<ReturnType<typeof reference>>>();
  beforeAll(async () => {
    await initBackend('wasm');
    for (const spec of [llama, qwen]) refs.set(spec, await reference(spec));
  });

  it("has the family's parameters: no position embeddings, no biases but Qwen2's on q, k and v, a gate and an up projection", () => {
    const names = (spec: GptSpec) => parameterShapes(spec).map(([n]) => n);
    expect(names(llama).filter((n) => n.startsWith('h0.'))).toEqual(['h0.ln1.g', 'h0.attn.wq', 'h0.attn.wk', 'h0.attn.wv', 'h0.attn.wo', 'h0.ln2.g', 'h0.mlp.w1', 'h0.mlp.w3', 'h0.mlp.w2']);
    expect(names(llama)).not.toContain('wpe');
    expect(names(llama).slice(-2)).toEqual(['lnf.g', 'head.w']);
    expect(names(qwen).filter((n) => n.startsWith('h0.attn.b'))).toEqual(['h0.attn.bq', 'h0.attn.bk', 'h0.attn.bv']);
    expect(parameterShapes(llama).find(([n]) => n === 'h0.attn.wk')![1]).toEqual([16, 8]);
  });

  it.each(
    strategies(4)
      .filter((l) => l.tp <= 2)
      .map((l) => [`dp=${l.dp} tp=${l.tp} pp=${l.pp}`, l] as const),
  )(
    '%s: same tokens, log-probs, values and trained parameters',
    async (_, layout) => {
      await compare(layout, refs.get(llama)!, llama, { ...value, family: 'llama', kvHeads: 2, ffn: 24, ropeTheta: 500 });
    },
    60_000,
  );

  it.each(
    strategies(4)
      .filter((l) => l.tp <= 2)
      .map((l) => [`dp=${l.dp} tp=${l.tp} pp=${l.pp}`, l] as const),
  )(
    'tied, with q/k/v biases (Qwen2), %s: same tokens, log-probs and trained parameters',
    async (_, layout) => {
      await compare(layout, refs.get(qwen)!, qwen, { ...value, family: 'llama', kvHeads: 2, ffn: 24, ropeTheta: 500 });
    },
    60_000,
  );

  it('refuses tp = 4 over 2 key/value heads, naming them', async () => {
    const layout: Layout = { devices: [0, 1, 2, 3], dp: 1, tp: 4, pp: 1 };
    const m = mesh(layout);
    await expect(m.run('actor', (rank) => ({ fn: 'load', role: 'actor', spec: llama, layout, rank, seed: 7, optim }))).rejects.toThrow(/tp=4 does not divide the 2 key\/value heads/);
  });
});

describe('left-padded prompts read as the prompts alone (padding masked out, positions from the first real token)', () => {
  const PAD = 10; // the separator: it ends these prompts and never leads one
  const pads = [0, 3, 1, 2, 3, 0, 2, 1];
  const EXTRA = 3;
  /** Row b's real prompt: prompts()'s row without its first pads[b] tokens. */
  const real = (b: number) => prompts().subarray(b * P + pads[b]!, (b + 1) * P);
  /** Every real prompt left-padded to `width` tokens. */
  function leftPadded(width: number): Int32Array {
    const out = new Int32Array(B * width).fill(PAD);
    for (let b = 0; b < B; b++) out.set(real(b), (b + 1) * width - real(b).length);
    return out;
  }
  const specs: Array<[string, GptSpec]> = [
    ['gpt2', { ...policy, context: P + EXTRA + R }],
    ['llama', { ...policy, context: P + EXTRA + R, family: 'llama', kvHeads: 2, ffn: 24, ropeTheta: 500 }],
  ];
  const held = (m: ReturnType<typeof mesh>) =>
    m.devices.flatMap((d) =>
      (d as unknown as { hosted: Map<string, { shard: { weights: { exportTensors(): Array<{ name: string; data: Float32Array }> } } }> }).hosted.get('actor')!.shard.weights.exportTensors(),
    );

  it.each(specs)(
    '%s: each padded row generates (greedy) and scores as its prompt alone does, on one device and on dp=1 tp=2 pp=2',
    async (_, spec) => {
      await initBackend('wasm');
      // Each prompt alone, unpadded, on one device.
      const alone: Array<{ tokens: Int32Array; logprobs: Float32Array }> = [];
      for (let b = 0; b < B; b++) {
        const one = mesh({ devices: [0], dp: 1, tp: 1, pp: 1 });
        const L = real(b).length;
        await one.run('actor', (rank) => ({ fn: 'load', role: 'actor', spec, layout: { devices: [0], dp: 1, tp: 1, pp: 1 }, rank, seed: 7 }));
        const g = (await one.run('actor', () => ({ fn: 'generate', prompts: real(b), batch: 1, promptLen: L, responseLen: R, seeds: seeds.subarray(b, b + 1), temperature: 1, greedy: true })))[0]!;
        alone.push({ tokens: (g.tokens as Int32Array).subarray(L), logprobs: g.logprobs as Float32Array });
      }
      for (const layout of [
        { devices: [0], dp: 1, tp: 1, pp: 1 },
        { devices: [0, 1, 2, 3], dp: 1, tp: 2, pp: 2 },
      ] satisfies Layout[]) {
        const m = mesh(layout);
        await m.run('actor', (rank) => ({ fn: 'load', role: 'actor', spec: { ...spec, pad: PAD }, layout, rank, seed: 7 }));
        const gen = await m.run('actor', () => ({ fn: 'generate', prompts: leftPadded(P), batch: B, promptLen: P, responseLen: R, seeds, temperature: 1, greedy: true }));
        const tokens = m.gather<Int32Array>(gen, 'tokens');
        const logprobs = m.gather<Float32Array>(gen, 'logprobs');
        const lp = m.gather<Float32Array>(await m.run('actor', () => ({ fn: 'inference', tokens, batch: B, promptLen: P, responseLen: R })), 'logprobs');
        for (let b = 0; b < B; b++) {
          expect(Array.from(tokens.subarray(b * (P + R) + P, (b + 1) * (P + R))), `row ${b}`).toEqual(Array.from(alone[b]!.tokens));
          expectClose(logprobs.subarray(b * R, (b + 1) * R), alone[b]!.logprobs, `row ${b}: generation log-probs`);
          expectClose(lp.subarray(b * R, (b + 1) * R), alone[b]!.logprobs, `row ${b}: log-probs`);
        }
      }
    },
    60_000,
  );

  it.each(specs)(
    '%s: a training step on the rows padded by 3 more tokens leaves the same parameters',
    async (_, spec) => {
      await initBackend('wasm');
      const layout: Layout = { devices: [0, 1], dp: 2, tp: 1, pp: 1 };
      const trained: Array<Array<{ name: string; data: Float32Array }>> = [];
      for (const width of [P, P + EXTRA]) {
        const m = mesh(layout);
        await m.run('actor', (rank) => ({ fn: 'load', role: 'actor', spec: { ...spec, pad: PAD }, layout, rank, seed: 7, optim }));
        const responses = Int32Array.from({ length: B * R }, (_, i) => (i * 3 + 1) % 10);
        const tokens = new Int32Array(B * (width + R));
        const prompt = leftPadded(width);
        for (let b = 0; b < B; b++) {
          tokens.set(prompt.subarray(b * width, (b + 1) * width), b * (width + R));
          tokens.set(responses.subarray(b * R, (b + 1) * R), b * (width + R) + width);
        }
        const data = { old: new Float32Array(B * R).fill(-2.3), advantages: Float32Array.from({ length: B * R }, (_, i) => Math.sin(i)) };
        await m.run('actor', () => ({ fn: 'train', tokens, batch: B, promptLen: width, responseLen: R, seed: 3, epochs: 1, minibatches: 1, loss: policyLoss, data }));
        trained.push(held(m));
      }
      trained[1]!.forEach((t, i) => expectClose(t.data, trained[0]![i]!.data, `${t.name} after a step`));
    },
    60_000,
  );
});

/** One layout's run against the reference's: tokens, log-probs, values, losses, every trained slice, and a bit-exact repeat. */
async function compare(layout: Layout, ref: Awaited<ReturnType<typeof reference>>, actorSpec: GptSpec, criticSpec: GptSpec = value, actorLoss: ActorLoss = clipPolicyLoss) {
  const got = await scenario(layout, actorSpec, criticSpec, actorLoss);
  expect(Array.from(got.tokens)).toEqual(Array.from(ref.tokens));
  expectClose(got.genLogprobs, ref.genLogprobs, 'generation log-probs');
  expectClose(got.logprobs, ref.logprobs, 'log-probs');
  expectClose(got.values, ref.values, 'values');
  expect(got.actorLoss).toBeCloseTo(ref.actorLoss, 5);
  expect(got.criticLoss).toBeCloseTo(ref.criticLoss, 5);
  for (const [model, spec, full, ranks] of [
    ['actor', actorSpec, ref.actor, got.actorSlices],
    ['critic', criticSpec, ref.critic, got.criticSlices],
  ] as const) {
    const info = modelInfo(spec);
    const byName = new Map(full.map((t) => [t.name, t]));
    layout.devices.forEach((_, rank) => {
      const held = new Map(ranks[rank]!.map((t) => [t.name, t.data]));
      for (const s of shardSlices(info, layout, rank)) {
        const whole = byName.get(s.name)!;
        const want = cut(whole.data, { ...s, axis: null, start: 0, end: s.shape[0]! }, s);
        expectClose(held.get(s.name)!, want, `${model} ${s.name} on rank ${rank}`);
      }
    });
  }
  // And again from scratch: bit for bit the same.
  const again = await scenario(layout, actorSpec, criticSpec, actorLoss);
  expect(again.digests).toEqual(got.digests);
}

describe('GSPO, CISPO and decoupled PPO on sharded layouts against the unsharded model, to 1e-5', () => {
  // Old log-probs moved off the current ones, so that ratios differ from 1 from the first step: GSPO's
  // narrow clip then holds some sequences and not others, CISPO's some tokens. Decoupled PPO's
  // behaviour policy differs from the proximal one (weights ≠ 1, some over its cap).
  const shifted = (lp: Float32Array) => lp.map((x, i) => x + 0.05 * Math.sin(5 * i));
  const losses: Array<[string, ActorLoss]> = [
    ['gspo', { spec: { name: 'gspo', params: { clip: 0.02, clip_high: 0.02 } }, data: (lp, advantages, mask) => ({ old: shifted(lp), advantages, mask }) }],
    ['cispo', { spec: { name: 'cispo', params: { clip_high: 0.1 } }, data: (lp, advantages, mask) => ({ old: shifted(lp), advantages, mask }) }],
    [
      'decoupled',
      {
        spec: { name: 'decoupled', params: { clip: 0.2, cap: 1.5 } },
        data: (prox, advantages, mask) => ({ prox, behav: prox.map((x, i) => x - 0.3 * Math.sin(3 * i)), advantages, mask }),
      },
    ],
  ];
  // Data parallelism (a replica's part of each mini-batch, divided by the whole's norm), and tensor with pipeline.
  const layouts = strategies(4).filter((l) => ['211', '122'].includes(`${l.dp}${l.tp}${l.pp}`));
  beforeAll(async () => {
    await initBackend('wasm');
  });
  it.each(losses.flatMap(([name, loss]) => layouts.map((l) => [`${name}, dp=${l.dp} tp=${l.tp} pp=${l.pp}`, loss, l] as const)))(
    '%s: same trained parameters, and twice the same bits',
    async (_, loss, layout) => {
      await compare(layout, await reference(policy, value, loss), policy, value, loss);
    },
    60_000,
  );
});

describe('a loss over pairs (dpo) against the unsharded model', () => {
  // B = 8 rows are 4 pairs: rows 0..3 chosen, 4..7 rejected (eight different sequences). Replicas
  // split pairs, not rows: a replica must take rows i and 4 + i together, and a mini-batch needs a
  // pair for every replica (the scenario checks that), hence one mini-batch for dp = 4.
  const dpo = { name: 'pair_sigmoid', params: { beta: 0.5 } };
  const tokens = Int32Array.from({ length: B * (P + R) }, (_, i) => (i * 7 + 3) % 10);
  const ref = Float32Array.from({ length: B * R }, (_, i) => -2.4 + 0.3 * Math.sin(i));
  // Responses of 1 to 4 tokens: the loss sums each response's own tokens only.
  const pairMask = maskOfLengths([4, 1, 2, 3, 3, 4, 1, 2], R);

  it.each([
    [{ devices: [0], dp: 1, tp: 1, pp: 1 }, 2],
    [{ devices: [0, 1], dp: 2, tp: 1, pp: 1 }, 2],
    [{ devices: [0, 1, 2, 3], dp: 2, tp: 1, pp: 2 }, 2],
    [{ devices: [0, 1, 2, 3], dp: 2, tp: 2, pp: 1 }, 2],
    [{ devices: [0, 1, 2, 3], dp: 4, tp: 1, pp: 1 }, 1],
  ] satisfies Array<[Layout, number]>)(
    '%o, %i mini-batches: same loss and trained parameters',
    async (layout, minibatches) => {
      await initBackend('wasm');
      const whole = new ReferenceGpt(policy, 7, optim);
      const want = await whole.train(tokens, B, P, R, dpo, { ref, mask: pairMask }, 1, minibatches, 5);
      const m = mesh(layout);
      await m.run('actor', (rank) => ({ fn: 'load', role: 'actor', spec: policy, layout, rank, seed: 7, optim }));
      const outs = await m.run('actor', () => ({ fn: 'train', tokens, batch: B, promptLen: P, responseLen: R, seed: 5, epochs: 1, minibatches, loss: dpo, data: { ref, mask: pairMask } }));
      expect(outs.reduce((a, o) => a + (o.loss as number), 0)).toBeCloseTo(want.loss, 5);
      const trained = new Map(whole.exportTensors().map((t) => [t.name, t.data]));
      const info = modelInfo(policy);
      m.devices.forEach((d, rank) => {
        const held = new Map(
          (d as unknown as { hosted: Map<string, { shard: { weights: { exportTensors(): Array<{ name: string; data: Float32Array }> } } }> }).hosted
            .get('actor')!
            .shard.weights.exportTensors()
            .map((t) => [t.name, t.data]),
        );
        for (const s of shardSlices(info, layout, rank)) {
          expectClose(held.get(s.name)!, cut(trained.get(s.name)!, { ...s, axis: null, start: 0, end: s.shape[0]! }, s), `${s.name} on rank ${rank}`);
        }
      });
      whole.dispose();
    },
    30_000,
  );
});

describe('a rank that fails', () => {
  it('makes the other ranks of its call fail at once instead of waiting for it', async () => {
    await initBackend('wasm');
    const layout: Layout = { devices: [0, 1], dp: 2, tp: 1, pp: 1 };
    const m = mesh(layout);
    await m.run('actor', (rank) => ({ fn: 'load', role: 'actor', spec: policy, layout, rank, seed: 7, optim }));
    const tokens = Int32Array.from({ length: B * (P + R) }, (_, i) => i % 10);
    const data = { old: new Float32Array(B * R), advantages: new Float32Array(B * R) };
    const good: CallOf<'train'> = { fn: 'train', tokens, batch: B, promptLen: P, responseLen: R, seed: 1, epochs, minibatches, loss: policyLoss, data };
    const outcome = await Promise.allSettled(
      m.devices.map((d, rank) =>
        d.run({ type: 'call', v: PROTOCOL_VERSION, id: 'bad', group: 'bad', model: 'actor', iteration: 0, body: rank === 0 ? { ...good, data: { ...data, old: new Float32Array(3) } } : good }),
      ),
    );
    expect(outcome[0]).toMatchObject({ status: 'rejected', reason: { code: 'malformed' } });
    expect(outcome[1]).toMatchObject({ status: 'rejected', reason: { message: expect.stringMatching(/device 0 failed during call bad/) } });
  }, 10_000);
});
