// A Hugging Face model directory as ferry reads it: `config.json` names the architecture, and the
// checkpoint's tensors must be exactly the ones that architecture has, in its shapes. Two families:
// `gpt2` (learned positions, LayerNorm, GELU MLP, fused QKV as Conv1D [in, out], tied head) and
// `llama` (LLaMA, Qwen2, SmolLM, Mistral-style: RMSNorm, rotary positions, SwiGLU MLP, grouped-query
// attention, nn.Linear [out, in], a head tied or not; Qwen2's q/k/v biases). Anything else —
// another architecture, an activation or a rotary scaling ferry does not implement, a missing or
// extra tensor, a shape that disagrees with the config — is refused with the file and tensor named.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { SafetensorsCheckpoint } from './safetensors.ts';

export class HfError extends Error {
  override name = 'HfError';
}

export const FAMILIES = ['gpt2', 'llama'] as const;
export type Family = (typeof FAMILIES)[number];

export interface HfModel {
  family: Family;
  /** The config's model_type, as written (gpt2, llama, qwen2, mistral). */
  modelType: string;
  vocab: number;
  /** Positions the model was trained for: max_position_embeddings, or GPT-2's n_positions. */
  context: number;
  layers: number;
  width: number;
  heads: number;
  kvHeads: number;
  /** The MLP's hidden width. */
  ffn: number;
  normEps: number;
  /** The head is the token embedding (transposed). */
  tied: boolean;
  /** llama: rotary base (rope_theta). */
  ropeTheta?: number;
  /** llama: biases on q, k and v (Qwen2). */
  qkvBias?: boolean;
}

const LLAMA_TYPES = ['llama', 'qwen2', 'mistral'];

/** The model a config.json describes; refuses what ferry cannot run. */
export function parseHfConfig(raw: unknown, where = 'config.json'): HfModel {
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) throw new HfError(`${where}: expected a JSON object`);
  const c = raw as Record<string, unknown>;
  const type = c.model_type;
  const int = (key: string, fallback?: number): number => {
    const v = c[key] ?? fallback;
    if (!(typeof v === 'number' && Number.isInteger(v) && v > 0)) throw new HfError(`${where}: expected ${key} to be a whole number > 0, got ${JSON.stringify(c[key])}`);
    return v;
  };
  const num = (key: string, fallback: number): number => {
    const v = c[key] ?? fallback;
    if (!(typeof v === 'number' && Number.isFinite(v) && v > 0)) throw new HfError(`${where}: expected ${key} to be a number > 0, got ${JSON.stringify(c[key])}`);
    return v;
  };
  const divides = (m: HfModel) => {
    if (m.width % m.heads !== 0) throw new HfError(`${where}: the width ${m.width} does not divide into ${m.heads} heads`);
    if (m.heads % m.kvHeads !== 0) throw new HfError(`${where}: ${m.heads} query heads do not divide into ${m.kvHeads} key/value heads`);
    return m;
  };
  if (type === 'gpt2') {
    const act = c.activation_function ?? 'gelu_new';
    if (act !== 'gelu_new' && act !== 'gelu_pytorch_tanh') throw new HfError(`${where}: activation_function ${JSON.stringify(act)} is not GPT-2's tanh GELU, which ferry's gpt2 family has`);
    if (c.tie_word_embeddings === false) throw new HfError(`${where}: ferry's gpt2 family ties the head to the token embedding; tie_word_embeddings is false`);
    const width = int('n_embd');
    const heads = int('n_head');
    return divides({
      family: 'gpt2',
      modelType: 'gpt2',
      vocab: int('vocab_size'),
      context: int('n_positions'),
      layers: int('n_layer'),
      width,
      heads,
      kvHeads: heads,
      ffn: int('n_inner', 4 * width),
      normEps: num('layer_norm_epsilon', 1e-5),
      tied: true,
    });
  }
  if (typeof type === 'string' && LLAMA_TYPES.includes(type)) {
    if ((c.hidden_act ?? 'silu') !== 'silu') throw new HfError(`${where}: hidden_act ${JSON.stringify(c.hidden_act)} is not SiLU, which ferry's llama family gates its MLP with`);
    if (c.rope_scaling !== undefined && c.rope_scaling !== null) throw new HfError(`${where}: rope_scaling ${JSON.stringify(c.rope_scaling)} is not supported: ferry's rotary positions are unscaled`);
    const window = c.sliding_window;
    if (c.use_sliding_window === true || (type === 'mistral' && typeof window === 'number' && window < int('max_position_embeddings')))
      throw new HfError(`${where}: sliding-window attention (sliding_window ${JSON.stringify(window)}) is not supported: ferry's attention sees the whole context`);
    const heads = int('num_attention_heads');
    const width = int('hidden_size');
    const headDim = c.head_dim ?? width / heads;
    if (headDim !== width / heads)
      throw new HfError(`${where}: head_dim ${JSON.stringify(c.head_dim)} differs from hidden_size / num_attention_heads = ${width / heads}; ferry's heads split the width`);
    const m: HfModel = {
      family: 'llama',
      modelType: type,
      vocab: int('vocab_size'),
      context: int('max_position_embeddings'),
      layers: int('num_hidden_layers'),
      width,
      heads,
      kvHeads: int('num_key_value_heads', heads),
      ffn: int('intermediate_size'),
      normEps: num('rms_norm_eps', 1e-6),
      tied: c.tie_word_embeddings === true,
      ropeTheta: num('rope_theta', 10000),
      qkvBias: type === 'qwen2' || c.attention_bias === true,
    };
    return divides(m);
  }
  throw new HfError(`${where}: model_type ${JSON.stringify(type)} is not one ferry runs; expected gpt2, or one of the llama family (${LLAMA_TYPES.join(', ')})`);
}

export function readHfConfig(dir: string): HfModel {
  const file = join(dir, 'config.json');
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(file, 'utf8'));
  } catch (e) {
    throw new HfError(`${file}: ${(e as Error).message}`);
  }
  return parseHfConfig(raw, file);
}

/** Every tensor of the family's checkpoint layout, by its Hugging Face name, in its shape. */
export function hfTensors(m: HfModel): Array<{ name: string; shape: number[] }> {
  const { vocab: V, width: D, ffn: F, layers: L } = m;
  const out: Array<{ name: string; shape: number[] }> = [];
  const t = (name: string, shape: number[]) => out.push({ name, shape });
  if (m.family === 'gpt2') {
    t('wte.weight', [V, D]);
    t('wpe.weight', [m.context, D]);
    for (let l = 0; l < L; l++) {
      const h = `h.${l}`;
      t(`${h}.ln_1.weight`, [D]);
      t(`${h}.ln_1.bias`, [D]);
      t(`${h}.attn.c_attn.weight`, [D, 3 * D]);
      t(`${h}.attn.c_attn.bias`, [3 * D]);
      t(`${h}.attn.c_proj.weight`, [D, D]);
      t(`${h}.attn.c_proj.bias`, [D]);
      t(`${h}.ln_2.weight`, [D]);
      t(`${h}.ln_2.bias`, [D]);
      t(`${h}.mlp.c_fc.weight`, [D, F]);
      t(`${h}.mlp.c_fc.bias`, [F]);
      t(`${h}.mlp.c_proj.weight`, [F, D]);
      t(`${h}.mlp.c_proj.bias`, [D]);
    }
    t('ln_f.weight', [D]);
    t('ln_f.bias', [D]);
    return out;
  }
  const kv = (D / m.heads) * m.kvHeads;
  t('model.embed_tokens.weight', [V, D]);
  for (let l = 0; l < L; l++) {
    const p = `model.layers.${l}`;
    t(`${p}.input_layernorm.weight`, [D]);
    t(`${p}.self_attn.q_proj.weight`, [D, D]);
    t(`${p}.self_attn.k_proj.weight`, [kv, D]);
    t(`${p}.self_attn.v_proj.weight`, [kv, D]);
    if (m.qkvBias) {
      t(`${p}.self_attn.q_proj.bias`, [D]);
      t(`${p}.self_attn.k_proj.bias`, [kv]);
      t(`${p}.self_attn.v_proj.bias`, [kv]);
    }
    t(`${p}.self_attn.o_proj.weight`, [D, D]);
    t(`${p}.post_attention_layernorm.weight`, [D]);
    t(`${p}.mlp.gate_proj.weight`, [F, D]);
    t(`${p}.mlp.up_proj.weight`, [F, D]);
    t(`${p}.mlp.down_proj.weight`, [D, F]);
  }
  t('model.norm.weight', [D]);
  if (!m.tied) t('lm_head.weight', [V, D]);
  return out;
}

/**
 * Names a checkpoint may carry beyond the weights, which readers ignore: GPT-2's causal-mask
 * buffers (attn.bias, attn.masked_bias), old LLaMA checkpoints' rotary inv_freq, and a tied head
 * saved anyway (lm_head.weight, checked equal to the embedding when read).
 */
function ignorable(m: HfModel, name: string): boolean {
  if (m.family === 'gpt2') return /^h\.\d+\.attn\.(bias|masked_bias)$/.test(name) || name === 'lm_head.weight';
  return /\.rotary_emb\.inv_freq$/.test(name) || (m.tied && name === 'lm_head.weight');
}

/**
 * How the checkpoint names its tensors: GPT-2 checkpoints come with and without a `transformer.`
 * prefix (GPT2LMHeadModel and GPT2Model save them differently).
 */
export function hfPrefix(m: HfModel, names: readonly string[]): string {
  return m.family === 'gpt2' && names.some((n) => n.startsWith('transformer.')) ? 'transformer.' : '';
}

/** Checks that the checkpoint holds exactly the family's tensors, in the config's shapes. */
export function checkHfCheckpoint(m: HfModel, ck: SafetensorsCheckpoint): void {
  const names = ck.names();
  const prefix = hfPrefix(m, names);
  const expected = hfTensors(m);
  const want = new Set(expected.map((t) => t.name));
  for (const t of expected) {
    const e = ck.entry(prefix + t.name);
    if (!e) throw new HfError(`${ck.dir}: the checkpoint has no tensor ${prefix + t.name}, which a ${m.modelType} model of this config.json has`);
    if (e.shape.length !== t.shape.length || e.shape.some((d, i) => d !== t.shape[i]))
      throw new HfError(`${ck.fileOf(prefix + t.name)}: tensor ${prefix + t.name} has shape [${e.shape.join(', ')}]; config.json gives [${t.shape.join(', ')}]`);
  }
  for (const n of names) {
    const bare = n.startsWith(prefix) ? n.slice(prefix.length) : n;
    if (!want.has(bare) && !ignorable(m, bare)) throw new HfError(`${ck.fileOf(n)}: tensor ${n} is not part of a ${m.modelType} model of this config.json`);
  }
}
