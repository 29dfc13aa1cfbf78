// LoRA adapters on the ranks of every layout: a fresh adapter changes no bit of the base's
// log-probabilities; training moves the adapters (and a value model's head) alone, as the
// unsharded model does under automatic differentiation (test/reference-gpt.ts over gpt.ts's
// merged weights), to 1e-5, with the base left exactly as it was.
import { beforeAll, describe, expect, it } from 'vitest';
import { shardSlices, type Layout } from '../../mesh/parallel/layout.ts';
import type { Optim } from '../../mesh/wire/messages/protocol.ts';
import { cut } from '../../mesh/parallel/slices.ts';
import { initBackend } from './backend/backend.ts';
import { baseSpec, modelInfo, parameterShapes, specProblem, type GptSpec } from './params.ts';
import { isAdapter, adapterCount } from '../adapters/index.ts';
import { ReferenceGpt } from '../../test/reference-gpt.ts';
import { expectClose, mesh, strategies } from '../../test/in-memory-mesh.ts';

const optim: Optim = { lr: 1e-2, beta1: 0.9, beta2: 0.999, eps: 1e-3, clipNorm: 1 };
const B = 8;
const P = 5;
const R = 4;
const tokens = Int32Array.from({ length: B * (P + R) }, (_, i) => (i * 7 + 3) % 10);
const mask = Float32Array.from({ length: B * R }, (_, i) => (i % 5 === 4 ? 0 : 1));
const policyData = { old: new Float32Array(B * R).fill(-2.3), advantages: Float32Array.from({ length: B * R }, (_, i) => Math.sin(i)), mask };
const valueData = { old: new Float32Array(B * R), returns: Float32Array.from({ length: B * R }, (_, i) => Math.cos(i) * 0.5), mask };
const batch = { tokens, batch: B, promptLen: P, responseLen: R };

const gpt2: GptSpec = { kind: 'policy', vocab: 11, context: 9, layers: 4, width: 16, heads: 4, lora: { rank: 2, alpha: 4, targets: ['c_attn', 'c_proj', 'c_fc'] } };
const llama: GptSpec = {
  kind: 'policy',
  vocab: 11,
  context: 9,
  layers: 4,
  width: 16,
  heads: 4,
  family: 'llama',
  kvHeads: 2,
  ffn: 24,
  ropeTheta: 500,
  lora: { rank: 2, alpha: 4, targets: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'] },
};

/** Two epochs of two mini-batches (four steps: A moves from the second on, once B is not zero), then log-probs or values. */
async function onMesh(spec: GptSpec, layout: Layout) {
  const m = mesh(layout);
  await m.run('m', (rank) => ({ fn: 'load', role: 'actor', spec, layout, rank, seed: 7, optim }));
  const policy = spec.kind === 'policy';
  const loss = policy ? { name: 'clip_policy', params: { clip: 0.2 } } : { name: 'clip_value', params: { clip: 0.2 } };
  await m.run('m', () => ({ fn: 'train', ...batch, seed: 5, epochs: 2, minibatches: 2, loss, data: policy ? policyData : valueData }));
  const out = m.gather<Float32Array>(await m.run('m', () => ({ fn: 'inference', ...batch })), policy ? 'logprobs' : 'values');
  const held = m.devices.map((d) =>
    (d as unknown as { hosted: Map<string, { shard: { weights: { exportTensors(): Array<{ name: string; data: Float32Array }> } } }> }).hosted.get('m')!.shard.weights.exportTensors(),
  );
  return { out, held };
}

async function unsharded(spec: GptSpec) {
  const ref = new ReferenceGpt(spec, 7, optim);
  const before = new Map(ref.exportTensors().map((t) => [t.name, t.data]));
  const policy = spec.kind === 'policy';
  const loss = policy ? { name: 'clip_policy', params: { clip: 0.2 } } : { name: 'clip_value', params: { clip: 0.2 } };
  await ref.train(tokens, B, P, R, loss, policy ? policyData : valueData, 2, 2, 5);
  const out = policy ? ref.logprobs(tokens, B, P) : ref.values(tokens, B, P);
  const after = ref.exportTensors();
  ref.dispose();
  return { out, before, after };
}

async function compare(spec: GptSpec, want: Awaited<ReturnType<typeof unsharded>>, layout: Layout) {
  const got = await onMesh(spec, layout);
  expectClose(got.out, want.out, spec.kind === 'policy' ? 'log-probs after four steps' : 'values after four steps');
  const byName = new Map(want.after.map((t) => [t.name, t.data]));
  layout.devices.forEach((_, rank) => {
    const held = new Map(got.held[rank]!.map((t) => [t.name, t.data]));
    for (const s of shardSlices(modelInfo(spec), layout, rank)) {
      const whole = { ...s, axis: null, start: 0, end: s.shape[0]! };
      expectClose(held.get(s.name)!, cut(byName.get(s.name)!, whole, s), `${s.name} on rank ${rank}`);
      // The base, and a policy's head, are frozen: exactly as they were drawn.
      if (!isAdapter(s.name) && !(spec.kind === 'value' && s.name.startsWith('head.')))
        expect(Array.from(held.get(s.name)!), `${s.name} frozen`).toEqual(Array.from(cut(want.before.get(s.name)!, whole, s)));
    }
  });
}

describe('LoRA adapters: parameters', () => {
  it('follow the base: A whole beside a column-parallel matrix and cut beside a row-parallel one, B the other way; GPT-2 q, k and v share one A', () => {
    const base = parameterShapes(baseSpec(gpt2));
    const all = parameterShapes(gpt2);
    expect(all.slice(0, base.length)).toEqual(base);
    const h0 = modelInfo(gpt2).params.filter((p) => p.name.startsWith('h0.') && isAdapter(p.name));
    expect(h0.map((p) => [p.name, p.shape, p.splitAxis])).toEqual([
      ['h0.attn.wqkv.lora_a', [16, 2], null],
      ['h0.attn.wq.lora_b', [2, 16], 1],
      ['h0.attn.wk.lora_b', [2, 16], 1],
      ['h0.attn.wv.lora_b', [2, 16], 1],
      ['h0.attn.wo.lora_a', [16, 2], 0],
      ['h0.attn.wo.lora_b', [2, 16], null],
      ['h0.mlp.w1.lora_a', [16, 2], null],
      ['h0.mlp.w1.lora_b', [2, 64], 1],
      ['h0.mlp.w2.lora_a', [64, 2], 0],
      ['h0.mlp.w2.lora_b', [2, 16], null],
    ]);
    // Per layer at width 16, rank 2: c_attn 16·2 + 2·48, c_proj 2·(16·2 + 2·16), c_fc 16·2 + 2·64, mlp c_proj 64·2 + 2·16.
    expect(adapterCount('gpt2', base, 4, gpt2.lora!)).toBe(4 * (128 + 64 + 160 + 160));
  });

  it("refuses a rank of 0 or above the smaller side, and an unknown target, naming the family's modules", () => {
    expect(specProblem({ ...gpt2, lora: { ...gpt2.lora!, rank: 0 } })).toMatch(/model\.lora\.rank: expected a whole number of at least 1, got 0/);
    expect(specProblem({ ...gpt2, lora: { ...gpt2.lora!, rank: 17 } })).toMatch(/model\.lora\.rank: 17 is above the smaller side of attn\.wq \[16, 16\] \(16\)/);
    expect(specProblem({ ...gpt2, lora: { ...gpt2.lora!, targets: ['q_proj'] } })).toMatch(
      /model\.lora\.targets: 'q_proj' is not a module of a gpt2 model; its linear layers are c_attn, c_proj, c_fc/,
    );
  });
});

describe('LoRA adapters on every layout, against the unsharded model', () => {
  const refs = new Map<GptSpec, Awaited<ReturnType<typeof unsharded>>>();
  const gpt2Value: GptSpec = { ...gpt2, kind: 'value' };
  beforeAll(async () => {
    await initBackend('wasm');
    for (const spec of [gpt2, llama, gpt2Value]) refs.set(spec, await unsharded(spec));
  });

  it("a fresh adapter changes no bit: log-probs with it equal the base model's exactly, on one device and on dp=1 tp=2 pp=2", async () => {
    for (const layout of [
      { devices: [0], dp: 1, tp: 1, pp: 1 },
      { devices: [0, 1, 2, 3], dp: 1, tp: 2, pp: 2 },
    ]) {
      for (const spec of [gpt2, llama]) {
        const m = mesh(layout);
        await m.run('with', (rank) => ({ fn: 'load', role: 'actor', spec, layout, rank, seed: 7, optim }));
        await m.run('base', (rank) => ({ fn: 'load', role: 'actor', spec: baseSpec(spec), layout, rank, seed: 7, optim }));
        const lp = async (model: string) => m.gather<Float32Array>(await m.run(model, () => ({ fn: 'inference', ...batch })), 'logprobs');
        expect(Array.from(await lp('with'))).toEqual(Array.from(await lp('base')));
      }
    }
  });

  it('the unsharded model trains its adapters: B and A move, the base does not', () => {
    const want = refs.get(gpt2)!;
    const after = new Map(want.after.map((t) => [t.name, t.data]));
    const moved = (n: string) => Array.from(after.get(n)!).some((x, i) => x !== want.before.get(n)![i]);
    expect(moved('h0.attn.wqkv.lora_a')).toBe(true);
    expect(moved('h3.mlp.w2.lora_b')).toBe(true);
    expect(moved('h0.attn.wq')).toBe(false);
    expect(moved('head.w')).toBe(false);
  });

  it.each(strategies(4).map((l) => [`gpt2 dp=${l.dp} tp=${l.tp} pp=${l.pp}`, l] as const))(
    '%s: log-probs and every slice after four steps',
    async (_, layout) => compare(gpt2, refs.get(gpt2)!, layout),
    60_000,
  );

  it.each(
    strategies(4)
      .filter((l) => l.tp <= 2)
      .map((l) => [`llama dp=${l.dp} tp=${l.tp} pp=${l.pp}`, l] as const),
  )('%s: log-probs and every slice after four steps', async (_, layout) => compare(llama, refs.get(llama)!, layout), 60_000);

  it.each(
    [
      { devices: [0], dp: 1, tp: 1, pp: 1 },
      { devices: [0, 1, 2, 3], dp: 2, tp: 2, pp: 1 },
      { devices: [0, 1, 2, 3], dp: 1, tp: 2, pp: 2 },
    ].map((l) => [`value model dp=${l.dp} tp=${l.tp} pp=${l.pp}`, l] as const),
  )('%s: its adapters and its head train, the rest is frozen', async (_, layout) => compare(gpt2Value, refs.get(gpt2Value)!, layout), 60_000);
});
