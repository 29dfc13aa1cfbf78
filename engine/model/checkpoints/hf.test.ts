// Hugging Face model directories: configs of both families, the tensors each must hold, and every
// refusal (architecture, activation, rotary scaling, missing, extra and misshapen tensors).
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { HfError, checkHfCheckpoint, hfTensors, parseHfConfig, readHfConfig, type HfModel } from './hf.ts';
import { SafetensorsCheckpoint, encodeSafetensors } from './safetensors.ts';

const GPT2 = { model_type: 'gpt2', vocab_size: 11, n_positions: 16, n_embd: 8, n_layer: 2, n_head: 2, activation_function: 'gelu_new', layer_norm_epsilon: 1e-5 };
const QWEN2 = {
  model_type: 'qwen2',
  vocab_size: 13,
  max_position_embeddings: 32,
  hidden_size: 8,
  num_hidden_layers: 1,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  intermediate_size: 12,
  rms_norm_eps: 1e-6,
  rope_theta: 1000000,
  tie_word_embeddings: true,
  hidden_act: 'silu',
};
const LLAMA = { ...QWEN2, model_type: 'llama', tie_word_embeddings: false, rope_theta: 10000 };

describe('parseHfConfig', () => {
  it('reads GPT-2: learned positions, a tied head, a 4× MLP unless n_inner says otherwise', () => {
    expect(parseHfConfig(GPT2)).toEqual({ family: 'gpt2', modelType: 'gpt2', vocab: 11, context: 16, layers: 2, width: 8, heads: 2, kvHeads: 2, ffn: 32, normEps: 1e-5, tied: true });
    expect(parseHfConfig({ ...GPT2, n_inner: 20 }).ffn).toBe(20);
  });

  it('reads the llama family: grouped-query heads, the rotary base, a tied head or not, Qwen2 biases', () => {
    const q = parseHfConfig(QWEN2);
    expect(q).toMatchObject({ family: 'llama', modelType: 'qwen2', heads: 4, kvHeads: 2, ffn: 12, ropeTheta: 1e6, tied: true, qkvBias: true, normEps: 1e-6 });
    expect(parseHfConfig(LLAMA)).toMatchObject({ family: 'llama', tied: false, qkvBias: false, ropeTheta: 10000 });
    expect(parseHfConfig({ ...LLAMA, num_key_value_heads: undefined }).kvHeads).toBe(4);
  });

  it('refuses what ferry does not run, naming the key and the value', () => {
    const refuse = (c: unknown, pattern: RegExp) => expect(() => parseHfConfig(c, 'm/config.json')).toThrow(pattern);
    refuse({ ...GPT2, model_type: 'bert' }, /m\/config\.json: model_type "bert" is not one ferry runs; expected gpt2, or one of the llama family/);
    refuse({ ...GPT2, activation_function: 'relu' }, /activation_function "relu" is not GPT-2's tanh GELU/);
    refuse({ ...GPT2, tie_word_embeddings: false }, /ties the head to the token embedding/);
    refuse({ ...LLAMA, hidden_act: 'gelu' }, /hidden_act "gelu" is not SiLU/);
    refuse({ ...LLAMA, rope_scaling: { type: 'linear', factor: 2 } }, /rope_scaling .* is not supported/);
    refuse({ ...LLAMA, model_type: 'mistral', sliding_window: 8 }, /sliding-window attention \(sliding_window 8\) is not supported/);
    refuse({ ...LLAMA, num_key_value_heads: 3 }, /4 query heads do not divide into 3 key\/value heads/);
    refuse({ ...LLAMA, head_dim: 4 }, /head_dim 4 differs from hidden_size \/ num_attention_heads = 2/);
    refuse({ ...GPT2, n_embd: 7 }, /the width 7 does not divide into 2 heads/);
    refuse({ ...GPT2, n_layer: 0 }, /expected n_layer to be a whole number > 0, got 0/);
    refuse([1], /expected a JSON object/);
  });
});

describe('checkHfCheckpoint', () => {
  let dir = '';
  afterEach(() => rmSync(dir, { recursive: true, force: true }));
  /** A checkpoint directory with the family's tensors (filled with their index), edited by `edit`. */
  function checkpoint(m: HfModel, edit: (ts: Array<{ name: string; shape: number[] }>) => Array<{ name: string; shape: number[] }> = (x) => x) {
    dir = mkdtempSync(join(tmpdir(), 'ferry-hf-'));
    const tensors = edit(hfTensors(m)).map((t, i) => ({ ...t, data: new Float32Array(t.shape.reduce((a, b) => a * b, 1)).fill(i) }));
    writeFileSync(join(dir, 'model.safetensors'), encodeSafetensors(tensors));
    return SafetensorsCheckpoint.open(dir);
  }

  it('accepts the exact tensors of each family, with the layouts of transformers (Conv1D [in, out], Linear [out, in])', () => {
    const gpt2 = parseHfConfig(GPT2);
    const names = hfTensors(gpt2);
    expect(names.find((t) => t.name === 'h.1.attn.c_attn.weight')!.shape).toEqual([8, 24]);
    expect(names.find((t) => t.name === 'h.0.mlp.c_proj.weight')!.shape).toEqual([32, 8]);
    expect(names).toHaveLength(2 + 2 * 12 + 2);
    const llama = parseHfConfig(LLAMA);
    const l = hfTensors(llama);
    expect(l.find((t) => t.name === 'model.layers.0.self_attn.k_proj.weight')!.shape).toEqual([4, 8]); // 2 kv heads of 2
    expect(l.find((t) => t.name === 'model.layers.0.mlp.down_proj.weight')!.shape).toEqual([8, 12]);
    expect(l.at(-1)).toEqual({ name: 'lm_head.weight', shape: [13, 8] });
    expect(hfTensors(parseHfConfig(QWEN2)).map((t) => t.name)).toContain('model.layers.0.self_attn.k_proj.bias');
    for (const m of [gpt2, llama, parseHfConfig(QWEN2)]) {
      const ck = checkpoint(m);
      expect(() => checkHfCheckpoint(m, ck)).not.toThrow();
      ck.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("accepts GPT2LMHeadModel's transformer. prefix and the buffers old checkpoints carry", () => {
    const m = parseHfConfig(GPT2);
    const ck = checkpoint(m, (ts) => [
      ...ts.map((t) => ({ ...t, name: `transformer.${t.name}` })),
      { name: 'transformer.h.0.attn.bias', shape: [1, 1, 16, 16] },
      { name: 'lm_head.weight', shape: [11, 8] },
    ]);
    expect(() => checkHfCheckpoint(m, ck)).not.toThrow();
    ck.close();
  });

  it('refuses a missing tensor, an extra one and a misshapen one, naming the file and the tensor', () => {
    const m = parseHfConfig(LLAMA);
    let ck = checkpoint(m, (ts) => ts.filter((t) => t.name !== 'model.layers.0.mlp.up_proj.weight'));
    expect(() => checkHfCheckpoint(m, ck)).toThrow(HfError);
    expect(() => checkHfCheckpoint(m, ck)).toThrow(/has no tensor model\.layers\.0\.mlp\.up_proj\.weight, which a llama model of this config\.json has/);
    ck.close();
    rmSync(dir, { recursive: true, force: true });
    ck = checkpoint(m, (ts) => [...ts, { name: 'model.layers.1.input_layernorm.weight', shape: [8] }]);
    expect(() => checkHfCheckpoint(m, ck)).toThrow(/model\.safetensors: tensor model\.layers\.1\.input_layernorm\.weight is not part of a llama model of this config\.json/);
    ck.close();
    rmSync(dir, { recursive: true, force: true });
    ck = checkpoint(m, (ts) => ts.map((t) => (t.name === 'model.layers.0.self_attn.v_proj.weight' ? { ...t, shape: [8, 8] } : t)));
    expect(() => checkHfCheckpoint(m, ck)).toThrow(/model\.safetensors: tensor model\.layers\.0\.self_attn\.v_proj\.weight has shape \[8, 8\]; config\.json gives \[4, 8\]/);
    ck.close();
  });

  it('reads config.json from a directory, naming it when it is not JSON', () => {
    dir = mkdtempSync(join(tmpdir(), 'ferry-hf-'));
    writeFileSync(join(dir, 'config.json'), JSON.stringify(QWEN2));
    expect(readHfConfig(dir).modelType).toBe('qwen2');
    writeFileSync(join(dir, 'config.json'), '{');
    expect(() => readHfConfig(dir)).toThrow(/config\.json: /);
  });
});
