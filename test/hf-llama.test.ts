// Hugging Face checkpoints of the llama family made here, in transformers' layout (nn.Linear
// weights [out, in]), with small known weights: a LLaMA with grouped-query attention and its own
// head, and a Qwen2 with q/k/v biases and a tied head. ferry imports each and its log-probabilities
// equal those of a plain loop over the family's formulas (RMSNorm, rotary positions in the
// rotate-half layout, grouped-query attention, SwiGLU), written below from the checkpoint's own
// tensors. Then export → import is bit-identical, and a trained-then-exported model reloads.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  HfError,
  SafetensorsCheckpoint,
  encodeSafetensors,
  exportHf,
  gptSpecOf,
  hfConfig,
  hfModelOf,
  hfTensors,
  importHf,
  initBackend,
  parseHfConfig,
  readHfConfig,
  type HfModel,
} from '../engine/model/index.ts';
import { LocalDispatcher } from '../engine/runtime/index.ts';
import type { NamedTensor } from '../mesh/wire/index.ts';

const LLAMA = {
  model_type: 'llama',
  vocab_size: 11,
  max_position_embeddings: 16,
  hidden_size: 8,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  intermediate_size: 12,
  rms_norm_eps: 1e-6,
  rope_theta: 100,
  tie_word_embeddings: false,
  hidden_act: 'silu',
};
const QWEN2 = { ...LLAMA, model_type: 'qwen2', tie_word_embeddings: true, num_key_value_heads: 1, rope_theta: 10000 };

/** Small known weights: a different smooth pattern per tensor; norms' gains near 1. */
function weights(m: HfModel): NamedTensor[] {
  return hfTensors(m).map(({ name, shape }, k) => {
    const n = shape.reduce((a, b) => a * b, 1);
    const gain = /norm\.weight$|layernorm\.weight$/.test(name);
    return { name, shape, data: Float32Array.from({ length: n }, (_, i) => (gain ? 1 : 0) + 0.4 * Math.sin(1.3 * i + 0.7 * k + 0.2)) };
  });
}

// ---- the llama family by plain loops over the checkpoint's tensors -----------------------------------

function referenceLogprobs(m: HfModel, w: Map<string, Float32Array>, tokens: number[]): number[][] {
  const { width: D, heads: H, kvHeads: KV, layers: L, vocab: V, ffn: F, normEps: eps } = m;
  const hd = D / H;
  const theta = m.ropeTheta!;
  const W = (n: string) => w.get(n)!;
  const rms = (x: number[], g: Float32Array) => {
    const r = 1 / Math.sqrt(x.reduce((a, c) => a + c * c, 0) / x.length + eps);
    return x.map((c, i) => c * r * g[i]!);
  };
  /** nn.Linear: y_j = Σ_i x_i·W[j, i] (+ b_j), W stored [out, in]. */
  const lin = (x: number[], mat: Float32Array, out: number, b?: Float32Array) => Array.from({ length: out }, (_, j) => x.reduce((a, c, i) => a + c * mat[j * x.length + i]!, b ? b[j]! : 0));
  /** Head vectors turned by position t: pair (i, i + hd/2) by t / θ^(2i/hd). */
  const rotate = (v: number[], t: number) => {
    const out = v.slice();
    for (let h = 0; h < v.length / hd; h++)
      for (let i = 0; i < hd / 2; i++) {
        const a = t / theta ** ((2 * i) / hd);
        const [x1, x2] = [v[h * hd + i]!, v[h * hd + hd / 2 + i]!];
        out[h * hd + i] = x1 * Math.cos(a) - x2 * Math.sin(a);
        out[h * hd + hd / 2 + i] = x2 * Math.cos(a) + x1 * Math.sin(a);
      }
    return out;
  };
  const silu = (x: number) => x / (1 + Math.exp(-x));
  let xs = tokens.map((tok) => Array.from({ length: D }, (_, i) => W('model.embed_tokens.weight')[tok * D + i]!));
  for (let l = 0; l < L; l++) {
    const p = `model.layers.${l}`;
    const bias = (n: string) => w.get(`${p}.self_attn.${n}_proj.bias`);
    const hs = xs.map((x) => rms(x, W(`${p}.input_layernorm.weight`)));
    const q = hs.map((h, t) => rotate(lin(h, W(`${p}.self_attn.q_proj.weight`), D, bias('q')), t));
    const k = hs.map((h, t) => rotate(lin(h, W(`${p}.self_attn.k_proj.weight`), KV * hd, bias('k')), t));
    const v = hs.map((h) => lin(h, W(`${p}.self_attn.v_proj.weight`), KV * hd, bias('v')));
    xs = xs.map((x, t) => {
      const att = new Array<number>(D).fill(0);
      for (let h = 0; h < H; h++) {
        const kv = Math.floor(h / (H / KV)); // the key/value head of query head h
        const scores = Array.from({ length: t + 1 }, (_, s) => {
          let dot = 0;
          for (let i = 0; i < hd; i++) dot += q[t]![h * hd + i]! * k[s]![kv * hd + i]!;
          return dot / Math.sqrt(hd);
        });
        const top = Math.max(...scores);
        const e = scores.map((c) => Math.exp(c - top));
        const z = e.reduce((a, c) => a + c, 0);
        for (let s = 0; s <= t; s++) for (let i = 0; i < hd; i++) att[h * hd + i]! += (e[s]! / z) * v[s]![kv * hd + i]!;
      }
      const o = lin(att, W(`${p}.self_attn.o_proj.weight`), D);
      const x1 = x.map((c, i) => c + o[i]!);
      const n = rms(x1, W(`${p}.post_attention_layernorm.weight`));
      const gate = lin(n, W(`${p}.mlp.gate_proj.weight`), F);
      const up = lin(n, W(`${p}.mlp.up_proj.weight`), F);
      const down = lin(
        gate.map((g, i) => silu(g) * up[i]!),
        W(`${p}.mlp.down_proj.weight`),
        D,
      );
      return x1.map((c, i) => c + down[i]!);
    });
  }
  const head = m.tied ? W('model.embed_tokens.weight') : W('lm_head.weight'); // [V, D] either way
  return xs.map((x) => {
    const logits = lin(rms(x, W('model.norm.weight')), head, V);
    const top = Math.max(...logits);
    const lse = top + Math.log(logits.reduce((a, c) => a + Math.exp(c - top), 0));
    return logits.map((c) => c - lse);
  });
}

/** ferry's log-probabilities of `tokens` after `P` prompt tokens, from the checkpoint in `dir`. */
async function ferryLogprobs(dir: string, tokens: number[], P: number): Promise<Float32Array> {
  const m = readHfConfig(dir);
  const ck = SafetensorsCheckpoint.open(dir);
  const tensors = importHf(m, ck);
  ck.close();
  const d = new LocalDispatcher(1);
  const layout = { devices: [0], dp: 1, tp: 1, pp: 1 };
  await d.call(0, 'm', -1, { fn: 'load', role: 'm', spec: gptSpecOf(m), layout, rank: 0 });
  await d.restoreShard(0, 'm', -1, { tensors });
  const out = await d.call(0, 'm', 0, { fn: 'inference', tokens: Int32Array.from(tokens), batch: 1, promptLen: P, responseLen: tokens.length - P });
  if (!('logprobs' in out)) throw new Error('no log-probs');
  return out.logprobs;
}

describe.each([
  ['LLaMA: 4 query heads over 2 key/value heads, a head of its own', LLAMA],
  ['Qwen2: q/k/v biases, one key/value head, a tied head', QWEN2],
])('a Hugging Face checkpoint of the llama family — %s', (_, config) => {
  const m = parseHfConfig(config);
  const dir = mkdtempSync(join(tmpdir(), 'ferry-hf-llama-'));
  const hf = weights(m);
  beforeAll(async () => {
    await initBackend('wasm');
    writeFileSync(join(dir, 'config.json'), JSON.stringify(config));
    writeFileSync(join(dir, 'model.safetensors'), encodeSafetensors(hf));
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it("gives the log-probabilities of a plain loop over the family's formulas, within 1e-5", async () => {
    const tokens = [3, 10, 0, 7, 7, 9, 1, 5, 2, 4];
    const P = 2;
    const got = await ferryLogprobs(dir, tokens, P);
    const ref = referenceLogprobs(m, new Map(hf.map((t) => [t.name, t.data])), tokens);
    // Position t predicts token t + 1.
    const want = Array.from({ length: tokens.length - P }, (_, i) => ref[P - 1 + i]![tokens[P + i]!]!);
    for (let i = 0; i < want.length; i++) expect(Math.abs(got[i]! - want[i]!), `token ${P + i}`).toBeLessThanOrEqual(1e-5);
    expect(Math.max(...want.map(Math.abs))).toBeGreaterThan(0.5); // not a degenerate case
  });

  it('exports to the same tensors and config, and import → export → import is bit-identical', () => {
    const ck = SafetensorsCheckpoint.open(dir);
    const ours = importHf(m, ck);
    ck.close();
    const out = exportHf(m, ours);
    expect(out.map((t) => t.name)).toEqual(hf.map((t) => t.name));
    for (const t of out) expect(new Uint32Array(t.data.buffer), t.name).toEqual(new Uint32Array(hf.find((h) => h.name === t.name)!.data.buffer));
    // The spec ferry runs maps back to the same model and config.
    const again = hfModelOf(gptSpecOf(m));
    expect(hfConfig(again)).toMatchObject({ ...config, rope_theta: config.rope_theta });
    const dir2 = mkdtempSync(join(tmpdir(), 'ferry-hf-llama-'));
    writeFileSync(join(dir2, 'config.json'), JSON.stringify(hfConfig(again)));
    writeFileSync(join(dir2, 'model.safetensors'), encodeSafetensors(out));
    const back = SafetensorsCheckpoint.open(dir2);
    const reimported = importHf(readHfConfig(dir2), back);
    back.close();
    rmSync(dir2, { recursive: true });
    expect(reimported.map((t) => t.name)).toEqual(ours.map((t) => t.name));
    reimported.forEach((t, i) => expect(new Uint32Array(t.data.buffer), t.name).toEqual(new Uint32Array(ours[i]!.data.buffer)));
  });
});

describe('refusals of llama-family checkpoints', () => {
  it('a tied head saved with other values, biases LLaMA puts on o_proj or the MLP, an odd head size', () => {
    const m = parseHfConfig(QWEN2);
    const dir = mkdtempSync(join(tmpdir(), 'ferry-hf-llama-'));
    writeFileSync(join(dir, 'model.safetensors'), encodeSafetensors([...weights(m), { name: 'lm_head.weight', shape: [11, 8], data: new Float32Array(88).fill(0.5) }]));
    const ck = SafetensorsCheckpoint.open(dir);
    expect(() => importHf(m, ck)).toThrow(HfError);
    expect(() => importHf(m, ck)).toThrow(/lm_head\.weight differs from model\.embed_tokens\.weight, and config\.json ties them/);
    ck.close();
    rmSync(dir, { recursive: true });
    expect(() => parseHfConfig({ ...LLAMA, attention_bias: true })).toThrow(/attention_bias true is not supported/);
    expect(() => parseHfConfig({ ...LLAMA, mlp_bias: true })).toThrow(/mlp_bias true is not supported/);
    expect(() => gptSpecOf(parseHfConfig({ ...LLAMA, hidden_size: 12, num_attention_heads: 4, num_key_value_heads: 4 }))).toThrow(/head size 3 is odd/);
  });

  it('exports only what has a causal-LM checkpoint layout: not a value model, not an untied gpt2', () => {
    expect(() => hfModelOf({ kind: 'value', vocab: 11, context: 8, layers: 1, width: 8, heads: 2 })).toThrow(/a value model has no Hugging Face causal-LM layout/);
    expect(() => hfModelOf({ kind: 'policy', vocab: 11, context: 8, layers: 1, width: 8, heads: 2 })).toThrow(/GPT-2 ties its head to the token embedding/);
  });
});
