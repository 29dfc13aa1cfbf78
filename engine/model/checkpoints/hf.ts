// A Hugging Face model directory as ferry reads it: `config.json` names the architecture, and the
// checkpoint's tensors must be exactly the ones that architecture has, in its shapes. Two families:
// `gpt2` (learned positions, LayerNorm, GELU MLP, fused QKV as Conv1D [in, out], tied head) and
// `llama` (LLaMA, Qwen2, SmolLM, Mistral-style: RMSNorm, rotary positions, SwiGLU MLP, grouped-query
// attention, nn.Linear [out, in], a head tied or not; Qwen2's q/k/v biases). Anything else —
// another architecture, an activation or a rotary scaling ferry does not implement, a missing or
// extra tensor, a shape that disagrees with the config — is refused with the file and tensor named.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { NamedTensor } from '../../../mesh/wire/index.ts';
import { archOf, baseSpec, isHead, isTied, parameterShapes, type GptSpec } from '../params.ts';
import { SafetensorsCheckpoint } from './safetensors.ts';

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
    if (c.scale_attn_weights === false || c.scale_attn_by_inverse_layer_idx === true)
      throw new HfError(
        `${where}: ferry's attention scales by 1/√(head size) alone; scale_attn_weights ${JSON.stringify(c.scale_attn_weights)}, scale_attn_by_inverse_layer_idx ${JSON.stringify(c.scale_attn_by_inverse_layer_idx)}`,
      );
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
      qkvBias: type === 'qwen2',
    };
    // LLaMA's attention_bias puts biases on o_proj too, and mlp_bias on the MLP: neither is in ferry's llama.
    for (const key of ['attention_bias', 'mlp_bias']) {
      if (type !== 'qwen2' && c[key] === true) throw new HfError(`${where}: ${key} true is not supported: ferry's llama family has no biases but Qwen2's on q, k and v`);
    }
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

// ---- both families in ferry's runtime ----------------------------------------------------------------

/** ferry's layer norm epsilon, which a GPT-2 checkpoint must have to run as it was trained. */
const GPT2_EPS = 1e-5;

/** ferry's spec for a model of either family; refuses what ferry's runtime cannot run exactly. */
export function gptSpecOf(m: HfModel, where = 'config.json'): GptSpec {
  const shape = { kind: 'policy' as const, vocab: m.vocab, context: m.context, layers: m.layers, width: m.width, heads: m.heads };
  if (m.family === 'llama') {
    if ((m.width / m.heads) % 2 !== 0) throw new HfError(`${where}: the head size ${m.width / m.heads} is odd; rotary positions turn pairs of elements`);
    return { ...shape, tied: m.tied, family: 'llama', kvHeads: m.kvHeads, ffn: m.ffn, ropeTheta: m.ropeTheta ?? 10000, normEps: m.normEps, ...(m.qkvBias ? { qkvBias: true } : {}) };
  }
  if (m.ffn !== 4 * m.width) throw new HfError(`${where}: n_inner ${m.ffn} is not 4 × n_embd = ${4 * m.width}, the MLP width of ferry's gpt2 family`);
  if (m.normEps !== GPT2_EPS) throw new HfError(`${where}: layer_norm_epsilon ${m.normEps} is not ${GPT2_EPS}, ferry's`);
  return { ...shape, tied: true };
}

/**
 * The Hugging Face model a ferry spec is, for export: gpt2 (which ties its head: an untied ferry
 * gpt2 has no such checkpoint), or llama (qwen2 when it has q/k/v biases). A value model has none.
 */
export function hfModelOf(spec: GptSpec): HfModel {
  if (spec.kind !== 'policy') throw new HfError(`a ${spec.kind} model has no Hugging Face causal-LM layout; export a policy`);
  const a = archOf(spec);
  const shape = { vocab: spec.vocab, context: spec.context, layers: spec.layers, width: spec.width, heads: spec.heads, kvHeads: a.kvHeads, ffn: a.ffn, normEps: a.normEps };
  if (a.family === 'llama') return { ...shape, family: 'llama', modelType: a.qkvBias ? 'qwen2' : 'llama', tied: isTied(spec), ropeTheta: a.ropeTheta, qkvBias: a.qkvBias };
  if (!isTied(spec))
    throw new HfError('a gpt2 model with a head of its own has no GPT-2 checkpoint layout (GPT-2 ties its head to the token embedding); train it with model.tied: true, or start it from a checkpoint');
  return { ...shape, family: 'gpt2', modelType: 'gpt2', tied: true };
}

/** A checked checkpoint of either family as ferry's parameters, in ferry's order (those in `names` only, when given). */
export function importHf(m: HfModel, ck: SafetensorsCheckpoint, names?: ReadonlySet<string>): NamedTensor[] {
  return m.family === 'gpt2' ? importGpt2(m, ck, names) : importLlama(m, ck, names);
}

/**
 * The weights of the model directory `dir` that a model of `spec` (a policy of the checkpoint's
 * shape, or a value model of its body) holds among `names`: what a shard loads when its model
 * starts from a checkpoint. A value model's head is not in the checkpoint, and stays as seeded.
 */
export function readHfWeights(dir: string, spec: GptSpec, names: readonly string[]): NamedTensor[] {
  const m = readHfConfig(dir);
  const want = gptSpecOf(m, join(dir, 'config.json'));
  // The base's body: adapters (engine/adapters) are not in a Hugging Face checkpoint.
  const body = (x: GptSpec) => parameterShapes({ ...baseSpec(x), kind: 'policy', tied: false }).filter(([n]) => !isHead(n));
  if (JSON.stringify(body(want)) !== JSON.stringify(body(spec))) throw new HfError(`${dir}: the checkpoint's shape differs from the model's (${JSON.stringify(spec)})`);
  const held = new Set(names.filter((n) => spec.kind === 'policy' || !isHead(n)));
  const ck = SafetensorsCheckpoint.open(dir);
  try {
    return importHf(m, ck, held);
  } finally {
    ck.close();
  }
}

/** ferry's parameters as the family's checkpoint tensors. */
export function exportHf(m: HfModel, tensors: readonly NamedTensor[]): NamedTensor[] {
  return m.family === 'gpt2' ? exportGpt2(m, tensors) : exportLlama(m, tensors);
}

/** config.json for the model, as transformers writes it. */
export function hfConfig(m: HfModel): Record<string, unknown> {
  return m.family === 'gpt2' ? gpt2Config(m) : llamaConfig(m);
}

/** A ferry parameter by name, for export. */
function getter(tensors: readonly NamedTensor[]): (name: string) => Float32Array {
  const byName = new Map(tensors.map((t) => [t.name, t]));
  return (name) => {
    const t = byName.get(name);
    if (!t) throw new HfError(`cannot export: the model has no parameter ${name}`);
    return t.data;
  };
}

/** A row-major [rows, cols] matrix transposed: nn.Linear's [out, in] ↔ ferry's [in, out]. */
function transposed(x: Float32Array, rows: number, cols: number): Float32Array {
  const out = new Float32Array(x.length);
  for (let r = 0; r < rows; r++) for (let c = 0; c < cols; c++) out[c * rows + r] = x[r * cols + c]!;
  return out;
}

/** HF name of each ferry parameter of a llama-family layer, and whether it is an nn.Linear weight (stored [out, in]). */
const LLAMA_LAYER: Record<string, [string, boolean]> = {
  'ln1.g': ['input_layernorm.weight', false],
  'attn.wq': ['self_attn.q_proj.weight', true],
  'attn.bq': ['self_attn.q_proj.bias', false],
  'attn.wk': ['self_attn.k_proj.weight', true],
  'attn.bk': ['self_attn.k_proj.bias', false],
  'attn.wv': ['self_attn.v_proj.weight', true],
  'attn.bv': ['self_attn.v_proj.bias', false],
  'attn.wo': ['self_attn.o_proj.weight', true],
  'ln2.g': ['post_attention_layernorm.weight', false],
  'mlp.w1': ['mlp.gate_proj.weight', true],
  'mlp.w3': ['mlp.up_proj.weight', true],
  'mlp.w2': ['mlp.down_proj.weight', true],
};
const LLAMA_TOP: Record<string, [string, boolean]> = { wte: ['model.embed_tokens.weight', false], 'lnf.g': ['model.norm.weight', false], 'head.w': ['lm_head.weight', true] };

/** The HF name of a ferry llama parameter, and whether it is stored transposed. */
function llamaName(name: string): [string, boolean] {
  const top = LLAMA_TOP[name];
  if (top) return top;
  const [, l, part] = /^h(\d+)\.(.*)$/.exec(name)!;
  const [hf, linear] = LLAMA_LAYER[part!]!;
  return [`model.layers.${l}.${hf}`, linear];
}

/**
 * A checked llama-family checkpoint as ferry's parameters, in ferry's order: nn.Linear weights
 * transposed to [in, out]. A tied head saved anyway must equal the embedding.
 */
export function importLlama(m: HfModel, ck: SafetensorsCheckpoint, names?: ReadonlySet<string>): NamedTensor[] {
  checkHfCheckpoint(m, ck);
  const wanted = parameterShapes(gptSpecOf(m)).filter(([name]) => !names || names.has(name));
  const out = wanted.map(([name, shape]) => {
    const [hf, linear] = llamaName(name);
    const data = ck.read(hf);
    return { name, shape, data: linear ? transposed(data, shape[1]!, shape[0]!) : data };
  });
  // The rank that takes the embedding checks a head saved beside it; the others need not read either.
  if (m.tied && ck.entry('lm_head.weight') && (!names || names.has('wte'))) {
    const [head, wte] = [ck.read('lm_head.weight'), out.find((t) => t.name === 'wte')!.data];
    if (head.length !== wte.length || head.some((x, i) => x !== wte[i]))
      throw new HfError(`${ck.fileOf('lm_head.weight')}: lm_head.weight differs from model.embed_tokens.weight, and config.json ties them (tie_word_embeddings)`);
  }
  return out;
}

/** ferry's parameters of a llama-family model as the family's checkpoint tensors (LlamaForCausalLM's names). */
export function exportLlama(m: HfModel, tensors: readonly NamedTensor[]): NamedTensor[] {
  const get = getter(tensors);
  const ours = new Map(parameterShapes(gptSpecOf(m)).map(([name, shape]) => [llamaName(name)[0], { name, shape }]));
  return hfTensors(m).map(({ name, shape }) => {
    const p = ours.get(name)!;
    const linear = llamaName(p.name)[1];
    return { name, shape, data: linear ? transposed(get(p.name), p.shape[0]!, p.shape[1]!) : get(p.name) };
  });
}

/** config.json for a llama-family model, as transformers writes LlamaForCausalLM's (Qwen2ForCausalLM's with q/k/v biases). */
export function llamaConfig(m: HfModel): Record<string, unknown> {
  const qwen = m.modelType === 'qwen2';
  return {
    architectures: [qwen ? 'Qwen2ForCausalLM' : 'LlamaForCausalLM'],
    model_type: qwen ? 'qwen2' : 'llama',
    vocab_size: m.vocab,
    max_position_embeddings: m.context,
    hidden_size: m.width,
    intermediate_size: m.ffn,
    num_hidden_layers: m.layers,
    num_attention_heads: m.heads,
    num_key_value_heads: m.kvHeads,
    hidden_act: 'silu',
    rms_norm_eps: m.normEps,
    rope_theta: m.ropeTheta ?? 10000,
    tie_word_embeddings: m.tied,
    ...(qwen ? { use_sliding_window: false } : { attention_bias: false, mlp_bias: false }),
    torch_dtype: 'float32',
  };
}

/** Columns [from, from + n) of a row-major [rows, cols] matrix. */
function columns(x: Float32Array, rows: number, cols: number, from: number, n: number): Float32Array {
  const out = new Float32Array(rows * n);
  for (let r = 0; r < rows; r++) out.set(x.subarray(r * cols + from, r * cols + from + n), r * n);
  return out;
}

/** HF name of each ferry parameter of a gpt2-family layer, except the fused QKV. */
const GPT2_LAYER: Record<string, string> = {
  'ln1.g': 'ln_1.weight',
  'ln1.b': 'ln_1.bias',
  'attn.wo': 'attn.c_proj.weight',
  'attn.bo': 'attn.c_proj.bias',
  'ln2.g': 'ln_2.weight',
  'ln2.b': 'ln_2.bias',
  'mlp.w1': 'mlp.c_fc.weight',
  'mlp.b1': 'mlp.c_fc.bias',
  'mlp.w2': 'mlp.c_proj.weight',
  'mlp.b2': 'mlp.c_proj.bias',
};
const GPT2_TOP: Record<string, string> = { wte: 'wte.weight', wpe: 'wpe.weight', 'lnf.g': 'ln_f.weight', 'lnf.b': 'ln_f.bias' };

/**
 * A checked gpt2-family checkpoint as ferry's parameters, in ferry's order: the fused c_attn
 * split into wq, wk and wv (column blocks of the Conv1D [in, out] weight, which is ferry's layout).
 * A head saved beside the embedding must equal it: ferry's gpt2 ties them.
 */
export function importGpt2(m: HfModel, ck: SafetensorsCheckpoint, names?: ReadonlySet<string>): NamedTensor[] {
  checkHfCheckpoint(m, ck);
  const spec = gptSpecOf(m);
  const prefix = hfPrefix(m, ck.names());
  const read = (name: string) => ck.read(prefix + name);
  const D = m.width;
  const qkv = new Map<number, { w: Float32Array; b: Float32Array }>();
  const fused = (l: number) => {
    let f = qkv.get(l);
    if (!f) qkv.set(l, (f = { w: read(`h.${l}.attn.c_attn.weight`), b: read(`h.${l}.attn.c_attn.bias`) }));
    return f;
  };
  const out = parameterShapes(spec)
    .filter(([name]) => !names || names.has(name))
    .map(([name, shape]) => {
      const top = GPT2_TOP[name];
      if (top) return { name, shape, data: read(top) };
      const [, l, part] = /^h(\d+)\.(.*)$/.exec(name)!;
      const layer = Number(l);
      const qkvPart = /^attn\.([wb])([qkv])$/.exec(part!);
      if (qkvPart) {
        const block = 'qkv'.indexOf(qkvPart[2]!);
        const f = fused(layer);
        return { name, shape, data: qkvPart[1] === 'w' ? columns(f.w, D, 3 * D, block * D, D) : f.b.slice(block * D, (block + 1) * D) };
      }
      return { name, shape, data: read(`h.${layer}.${GPT2_LAYER[part!]!}`) };
    });
  // GPT2LMHeadModel saves its head (when it does) beside the transformer., not under it; the rank
  // that takes the embedding checks it, the others need not read either.
  const head = ck.entry('lm_head.weight') && (!names || names.has('wte')) ? ck.read('lm_head.weight') : undefined;
  if (head) {
    const wte = out.find((t) => t.name === 'wte')!.data;
    if (head.length !== wte.length || head.some((x, i) => x !== wte[i]))
      throw new HfError(`${ck.fileOf('lm_head.weight')}: lm_head.weight differs from wte.weight; ferry's gpt2 family ties the head to the embedding`);
  }
  return out;
}

/** ferry's parameters of a gpt2-family model as the family's checkpoint tensors (GPT2LMHeadModel's names, no prefix). */
export function exportGpt2(m: HfModel, tensors: readonly NamedTensor[]): NamedTensor[] {
  gptSpecOf(m); // refuses what the family cannot hold
  const get = getter(tensors);
  const D = m.width;
  return hfTensors(m).map(({ name, shape }) => {
    const top = Object.entries(GPT2_TOP).find(([, hf]) => hf === name);
    if (top) return { name, shape, data: get(top[0]) };
    const [, l, part] = /^h\.(\d+)\.(.*)$/.exec(name)!;
    if (part === 'attn.c_attn.weight') {
      const [q, k, v] = ['wq', 'wk', 'wv'].map((w) => get(`h${l}.attn.${w}`));
      const data = new Float32Array(D * 3 * D);
      for (let r = 0; r < D; r++) [q, k, v].forEach((x, i) => data.set(x!.subarray(r * D, (r + 1) * D), r * 3 * D + i * D));
      return { name, shape, data };
    }
    if (part === 'attn.c_attn.bias') {
      const data = new Float32Array(3 * D);
      ['bq', 'bk', 'bv'].forEach((b, i) => data.set(get(`h${l}.attn.${b}`), i * D));
      return { name, shape, data };
    }
    const ours = Object.entries(GPT2_LAYER).find(([, hf]) => hf === part)![0];
    return { name, shape, data: get(`h${l}.${ours}`) };
  });
}

/** config.json for a gpt2-family model, as transformers writes GPT2LMHeadModel's. */
export function gpt2Config(m: HfModel): Record<string, unknown> {
  return {
    architectures: ['GPT2LMHeadModel'],
    model_type: 'gpt2',
    vocab_size: m.vocab,
    n_positions: m.context,
    n_embd: m.width,
    n_layer: m.layers,
    n_head: m.heads,
    n_inner: null,
    activation_function: 'gelu_new',
    layer_norm_epsilon: m.normEps,
    tie_word_embeddings: true,
    torch_dtype: 'float32',
  };
}
