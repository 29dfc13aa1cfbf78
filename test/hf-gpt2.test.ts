// A Hugging Face GPT-2 checkpoint made here, in transformers' layout, with small known weights:
// ferry imports it and its log-probabilities equal those of a plain loop over GPT-2's formulas,
// written below from the checkpoint's own tensors (fused c_attn, Conv1D [in, out], tied head).
// Then export → import is bit-identical.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { HfError, SafetensorsCheckpoint, encodeSafetensors, exportGpt2, gpt2Config, gptSpecOf, hfTensors, importGpt2, initBackend, parseHfConfig, readHfConfig } from '../engine/model/index.ts';
import { LocalDispatcher, sampleHf } from '../engine/runtime/index.ts';
import { spawnTs } from './helpers.ts';
import { tokenizerJson } from './tokenizer-fixture.ts';
import type { NamedTensor } from '../mesh/wire/index.ts';

const CONFIG = { model_type: 'gpt2', vocab_size: 13, n_positions: 8, n_embd: 8, n_layer: 2, n_head: 2, activation_function: 'gelu_new', layer_norm_epsilon: 1e-5 };
const model = parseHfConfig(CONFIG);

/** Small known weights: a different smooth pattern per tensor; norms' gains near 1. */
function weights(): NamedTensor[] {
  return hfTensors(model).map(({ name, shape }, k) => {
    const n = shape.reduce((a, b) => a * b, 1);
    const gain = /ln_\d\.weight|ln_f\.weight/.test(name);
    return { name, shape, data: Float32Array.from({ length: n }, (_, i) => (gain ? 1 : 0) + 0.3 * Math.sin(1.7 * i + 0.9 * k + 0.3)) };
  });
}

// ---- GPT-2 by plain loops over the checkpoint's tensors ---------------------------------------------

function referenceLogprobs(w: Map<string, Float32Array>, tokens: number[]): number[][] {
  const { width: D, heads: H, layers: L, vocab: V } = model;
  const hd = D / H;
  const W = (n: string) => w.get(n)!;
  const norm = (x: number[], g: Float32Array, b: Float32Array) => {
    const mean = x.reduce((a, c) => a + c, 0) / D;
    const varc = x.reduce((a, c) => a + (c - mean) ** 2, 0) / D;
    return x.map((c, i) => ((c - mean) / Math.sqrt(varc + 1e-5)) * g[i]! + b[i]!);
  };
  /** x [in] · W [in, out] + b: Conv1D. */
  const conv = (x: number[], m: Float32Array, b: Float32Array, out: number) => Array.from({ length: out }, (_, j) => x.reduce((a, c, i) => a + c * m[i * out + j]!, b[j]!));
  const gelu = (x: number) => 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x ** 3)));
  let xs = tokens.map((tok, t) => Array.from({ length: D }, (_, i) => W('wte.weight')[tok * D + i]! + W('wpe.weight')[t * D + i]!));
  for (let l = 0; l < L; l++) {
    const p = `h.${l}`;
    const qkv = xs.map((x) => conv(norm(x, W(`${p}.ln_1.weight`), W(`${p}.ln_1.bias`)), W(`${p}.attn.c_attn.weight`), W(`${p}.attn.c_attn.bias`), 3 * D));
    const attended = xs.map((_, t) => {
      const out = new Array<number>(D).fill(0);
      for (let h = 0; h < H; h++) {
        const q = qkv[t]!.slice(h * hd, (h + 1) * hd);
        const scores = Array.from({ length: t + 1 }, (_, s) => q.reduce((a, c, i) => a + c * qkv[s]![D + h * hd + i]!, 0) / Math.sqrt(hd));
        const top = Math.max(...scores);
        const e = scores.map((s) => Math.exp(s - top));
        const z = e.reduce((a, c) => a + c, 0);
        for (let s = 0; s <= t; s++) for (let i = 0; i < hd; i++) out[h * hd + i]! += (e[s]! / z) * qkv[s]![2 * D + h * hd + i]!;
      }
      return out;
    });
    xs = xs.map((x, t) => {
      const a = conv(attended[t]!, W(`${p}.attn.c_proj.weight`), W(`${p}.attn.c_proj.bias`), D);
      const x1 = x.map((c, i) => c + a[i]!);
      const hidden = conv(norm(x1, W(`${p}.ln_2.weight`), W(`${p}.ln_2.bias`)), W(`${p}.mlp.c_fc.weight`), W(`${p}.mlp.c_fc.bias`), 4 * D).map(gelu);
      const m = conv(hidden, W(`${p}.mlp.c_proj.weight`), W(`${p}.mlp.c_proj.bias`), D);
      return x1.map((c, i) => c + m[i]!);
    });
  }
  return xs.map((x) => {
    const y = norm(x, W('ln_f.weight'), W('ln_f.bias'));
    const logits = Array.from({ length: V }, (_, v) => y.reduce((a, c, i) => a + c * W('wte.weight')[v * D + i]!, 0));
    const top = Math.max(...logits);
    const lse = top + Math.log(logits.reduce((a, c) => a + Math.exp(c - top), 0));
    return logits.map((l) => l - lse);
  });
}

describe('a Hugging Face GPT-2 checkpoint', () => {
  const dir = mkdtempSync(join(tmpdir(), 'ferry-hf-gpt2-'));
  const hf = weights();
  beforeAll(async () => {
    await initBackend('wasm');
    writeFileSync(join(dir, 'config.json'), JSON.stringify(CONFIG));
    // As GPT2LMHeadModel saves it: a transformer. prefix, and a causal-mask buffer per layer.
    const saved = [...hf.map((t) => ({ ...t, name: `transformer.${t.name}` })), { name: 'transformer.h.0.attn.bias', shape: [1, 1, 8, 8], data: new Float32Array(64).fill(1) }];
    writeFileSync(join(dir, 'model.safetensors'), encodeSafetensors(saved));
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it("gives the log-probabilities of a plain loop over GPT-2's formulas, within 1e-5", async () => {
    const m = readHfConfig(dir);
    const ck = SafetensorsCheckpoint.open(dir);
    const tensors = importGpt2(m, ck);
    ck.close();
    const spec = gptSpecOf(m);
    const d = new LocalDispatcher(1);
    const layout = { devices: [0], dp: 1, tp: 1, pp: 1 };
    await d.call(0, 'gpt2', -1, { fn: 'load', role: 'gpt2', spec, layout, rank: 0 });
    await d.restoreShard(0, 'gpt2', -1, { tensors });
    const tokens = [3, 11, 0, 7, 7, 12, 1, 5];
    const P = 2;
    const R = tokens.length - P;
    const out = await d.call(0, 'gpt2', 0, { fn: 'inference', tokens: Int32Array.from(tokens), batch: 1, promptLen: P, responseLen: R });
    if (!('logprobs' in out)) throw new Error('no log-probs');
    const ref = referenceLogprobs(new Map(hf.map((t) => [t.name, t.data])), tokens);
    // Position t predicts token t + 1.
    const want = Array.from({ length: R }, (_, i) => ref[P - 1 + i]![tokens[P + i]!]!);
    for (let i = 0; i < R; i++) expect(Math.abs(out.logprobs[i]! - want[i]!)).toBeLessThanOrEqual(1e-5);
    expect(Math.max(...want.map(Math.abs))).toBeGreaterThan(0.5); // not a degenerate case
  });

  it('exports to the same tensors and config, and import → export → import is bit-identical', () => {
    const m = readHfConfig(dir);
    const ck = SafetensorsCheckpoint.open(dir);
    const ours = importGpt2(m, ck);
    ck.close();
    const out = exportGpt2(m, ours);
    for (const t of out) expect(new Uint32Array(t.data.buffer), t.name).toEqual(new Uint32Array(hf.find((h) => h.name === t.name)!.data.buffer));
    const again = mkdtempSync(join(tmpdir(), 'ferry-hf-gpt2-'));
    writeFileSync(join(again, 'config.json'), JSON.stringify(gpt2Config(m)));
    writeFileSync(join(again, 'model.safetensors'), encodeSafetensors(out));
    const back = SafetensorsCheckpoint.open(again);
    const reimported = importGpt2(readHfConfig(again), back);
    back.close();
    rmSync(again, { recursive: true });
    expect(reimported.map((t) => t.name)).toEqual(ours.map((t) => t.name));
    reimported.forEach((t, i) => expect(new Uint32Array(t.data.buffer)).toEqual(new Uint32Array(ours[i]!.data.buffer)));
  });

  it("refuses a head that is not the embedding, and an MLP width ferry's gpt2 does not have", () => {
    const bad = mkdtempSync(join(tmpdir(), 'ferry-hf-gpt2-'));
    writeFileSync(join(bad, 'model.safetensors'), encodeSafetensors([...hf, { name: 'lm_head.weight', shape: [13, 8], data: new Float32Array(104).fill(0.5) }]));
    const ck = SafetensorsCheckpoint.open(bad);
    expect(() => importGpt2(model, ck)).toThrow(HfError);
    expect(() => importGpt2(model, ck)).toThrow(/lm_head\.weight differs from wte\.weight/);
    ck.close();
    rmSync(bad, { recursive: true });
    expect(() => gptSpecOf(parseHfConfig({ ...CONFIG, n_inner: 16 }))).toThrow(/n_inner 16 is not 4 × n_embd = 32/);
  });
});

describe('npm run sample -- --model HF_DIR', () => {
  // The byte-level tokenizer's 260 ids, so that text prompts reach the model.
  const config = { ...CONFIG, vocab_size: 260, n_positions: 16 };
  const m = parseHfConfig(config);
  const dir = mkdtempSync(join(tmpdir(), 'ferry-hf-sample-'));
  beforeAll(async () => {
    await initBackend('wasm');
    writeFileSync(join(dir, 'config.json'), JSON.stringify(config));
    const tensors = hfTensors(m).map(({ name, shape }, k) => ({ name, shape, data: Float32Array.from({ length: shape.reduce((a, b) => a * b, 1) }, (_, i) => 0.5 * Math.sin(0.37 * i + k)) }));
    writeFileSync(join(dir, 'model.safetensors'), encodeSafetensors(tensors));
    writeFileSync(join(dir, 'tokenizer.json'), JSON.stringify(tokenizerJson()));
    writeFileSync(join(dir, 'tokenizer_config.json'), JSON.stringify({ eos_token: '<|endoftext|>' }));
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('continues a text prompt: greedy tokens (the likeliest at each step) and their text', async () => {
    const s = await sampleHf(dir, { prompt: 'héllo', greedy: true, maxTokens: 6 });
    expect(s.tokens.length).toBeGreaterThan(0);
    expect(s.tokens.length).toBeLessThanOrEqual(6);
    for (const l of s.logprobs) expect(l).toBeGreaterThanOrEqual(-Math.log(260) - 1e-5);
    expect(await sampleHf(dir, { prompt: 'héllo', greedy: true, maxTokens: 6 })).toEqual(s);
    const ids = await sampleHf(dir, { tokens: [104, 195, 169, 257, 111], greedy: true, maxTokens: 6 });
    expect(ids.tokens).toEqual(s.tokens); // 'héllo' is those ids
    expect(typeof s.text).toBe('string');
  });

  it('prints one JSON object from the command line, and refuses a prompt the context cannot hold', async () => {
    const p = spawnTs('engine/cli/sample.ts', ['--model', dir, '--prompt', 'hell', '--max-tokens', '3', '--greedy', '--json']);
    expect(await p.exited).toBe(0);
    const out = JSON.parse(p.output().trim().split('\n').at(-1)!) as { tokens: number[]; logprobs: number[] };
    expect(out.tokens.length).toBeLessThanOrEqual(3);
    expect(out.logprobs).toHaveLength(out.tokens.length);
    await expect(sampleHf(dir, { prompt: 'hello there', maxTokens: 10 })).rejects.toThrow(/a prompt of \d+ tokens and 10 new ones need \d+ positions; the model has 16 \(n_positions\)/);
    await expect(sampleHf(dir, { tokens: [300] })).rejects.toThrow(/prompt token 1: expected an id in 0\.\.259/);
  }, 60_000);
});
