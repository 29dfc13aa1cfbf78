// Adapters in Hugging Face PEFT's form: adapter_config.json and the tensors of
// adapter_model.safetensors under PEFT's key names for the family, both ways; and an adapter merged
// into its base (W + s·A·B), for a full checkpoint. Plain arrays: no TensorFlow.js here.
//
// PEFT keeps a module's adapter as two nn.Linear layers, lora_A [r, in] and lora_B [out, r]
// (ferry's A and B transposed, ferry storing x·W as [in, out]), under the wrapped model's module
// path: base_model.model.<module>.lora_A.weight. GPT-2's c_attn is q, k and v fused, so its one
// lora_B is ferry's three Bs side by side.
import type { NamedTensor } from '../../mesh/wire/index.ts';
import { adaptedParts, adapterMap, LORA_MODULES, type Family, type LoraSpec } from './lora.ts';

export class PeftError extends Error {
  override name = 'PeftError';
}

/** PEFT's prefix: the LoRA model wrapping the transformers model. */
const PREFIX = 'base_model.model.';

/** Each adapted module of layer `l`: its path in the transformers model and the ferry parts (after `h<l>.`) it stands for. */
function modulesOf(family: Family, l: number, lora: LoraSpec): Array<{ path: string; parts: string[] }> {
  const parts = new Set(adaptedParts(family, lora));
  const has = (p: string) => parts.has(p);
  if (family === 'gpt2') {
    const out: Array<{ path: string; parts: string[] }> = [];
    if (has('attn.wq')) out.push({ path: `transformer.h.${l}.attn.c_attn`, parts: ['attn.wq', 'attn.wk', 'attn.wv'] });
    if (has('attn.wo')) out.push({ path: `transformer.h.${l}.attn.c_proj`, parts: ['attn.wo'] });
    if (has('mlp.w1')) out.push({ path: `transformer.h.${l}.mlp.c_fc`, parts: ['mlp.w1'] });
    if (has('mlp.w2')) out.push({ path: `transformer.h.${l}.mlp.c_proj`, parts: ['mlp.w2'] });
    return out;
  }
  const LLAMA: Record<string, string> = {
    'attn.wq': 'self_attn.q_proj',
    'attn.wk': 'self_attn.k_proj',
    'attn.wv': 'self_attn.v_proj',
    'attn.wo': 'self_attn.o_proj',
    'mlp.w1': 'mlp.gate_proj',
    'mlp.w3': 'mlp.up_proj',
    'mlp.w2': 'mlp.down_proj',
  };
  return adaptedParts(family, lora).map((p) => ({ path: `model.layers.${l}.${LLAMA[p]}`, parts: [p] }));
}

/** A row-major [rows, cols] matrix transposed. */
function transposed(x: Float32Array, rows: number, cols: number): Float32Array {
  const out = new Float32Array(x.length);
  for (let r = 0; r < rows; r++) for (let c = 0; c < cols; c++) out[c * rows + r] = x[r * cols + c]!;
  return out;
}

/** Matrices [r, n_i] side by side as one [r, Σn_i]. */
function sideBySide(xs: Float32Array[], r: number): Float32Array {
  const widths = xs.map((x) => x.length / r);
  const total = widths.reduce((a, b) => a + b, 0);
  const out = new Float32Array(r * total);
  for (let i = 0; i < r; i++) {
    let at = i * total;
    xs.forEach((x, k) => {
      out.set(x.subarray(i * widths[k]!, (i + 1) * widths[k]!), at);
      at += widths[k]!;
    });
  }
  return out;
}

/** The inverse of sideBySide: [r, Σn_i] cut into [r, n_i]. */
function cutSides(x: Float32Array, r: number, widths: number[]): Float32Array[] {
  const total = widths.reduce((a, b) => a + b, 0);
  let from = 0;
  return widths.map((w) => {
    const out = new Float32Array(r * w);
    for (let i = 0; i < r; i++) out.set(x.subarray(i * total + from, i * total + from + w), i * w);
    from += w;
    return out;
  });
}

/** adapter_config.json for these adapters, as PEFT writes a LoRA adapter's. */
export function peftConfig(family: Family, lora: LoraSpec, base?: string): Record<string, unknown> {
  return {
    peft_type: 'LORA',
    task_type: 'CAUSAL_LM',
    base_model_name_or_path: base ?? null,
    r: lora.rank,
    lora_alpha: lora.alpha,
    lora_dropout: 0,
    target_modules: [...lora.targets],
    modules_to_save: lora.modulesToSave?.length ? [...lora.modulesToSave] : null,
    bias: 'none',
    // GPT-2's Conv1D stores [in, out]: PEFT says so with fan_in_fan_out.
    fan_in_fan_out: family === 'gpt2',
    init_lora_weights: true,
    inference_mode: true,
    use_rslora: false,
    use_dora: false,
    rank_pattern: {},
    alpha_pattern: {},
  };
}

/**
 * A model's adapters (whole tensors, ferry's names: the model's parameters, of which only the
 * adapters and a saved head are read) as adapter_model.safetensors' tensors, PEFT's keys.
 */
export function peftTensors(family: Family, layers: number, lora: LoraSpec, tensors: readonly NamedTensor[]): NamedTensor[] {
  const byName = new Map(tensors.map((t) => [t.name, t]));
  const get = (name: string) => {
    const t = byName.get(name);
    if (!t) throw new PeftError(`cannot export the adapters: the model has no parameter ${name}`);
    return t;
  };
  const ads = adapterMap(family, layers, lora);
  const out: NamedTensor[] = [];
  for (let l = 0; l < layers; l++) {
    for (const { path, parts } of modulesOf(family, l, lora)) {
      const a = get(ads.get(`h${l}.${parts[0]}`)!.a);
      const bs = parts.map((p) => get(ads.get(`h${l}.${p}`)!.b));
      const [inDim, r] = a.shape as [number, number];
      const outDim = bs.reduce((n, b) => n + b.shape[1]!, 0);
      out.push({ name: `${PREFIX}${path}.lora_A.weight`, shape: [r, inDim], data: transposed(a.data, inDim, r) });
      out.push({
        name: `${PREFIX}${path}.lora_B.weight`,
        shape: [outDim, r],
        data: transposed(
          sideBySide(
            bs.map((b) => b.data),
            r,
          ),
          r,
          outDim,
        ),
      });
    }
  }
  if (lora.modulesToSave?.includes('lm_head')) {
    const head = get('head.w'); // [D, V] → nn.Linear's [V, D]
    out.push({ name: `${PREFIX}lm_head.weight`, shape: [head.shape[1]!, head.shape[0]!], data: transposed(head.data, head.shape[0]!, head.shape[1]!) });
  }
  return out;
}

/** What adapter_config.json says that ferry reads, checked: the adapters' spec. */
export function loraOfPeftConfig(config: Record<string, unknown>, family: Family, file: string): LoraSpec {
  const fail = (key: string, expected: string) => new PeftError(`${file}: ${key}: expected ${expected}, got ${JSON.stringify(config[key])}`);
  if (config.peft_type !== 'LORA') throw fail('peft_type', '"LORA"');
  const r = config.r;
  if (!(typeof r === 'number' && Number.isInteger(r) && r >= 1)) throw fail('r', 'a whole number of at least 1');
  const alpha = config.lora_alpha;
  if (!(typeof alpha === 'number' && alpha > 0)) throw fail('lora_alpha', 'a positive number');
  const targets = typeof config.target_modules === 'string' ? [config.target_modules] : config.target_modules;
  if (!(Array.isArray(targets) && targets.every((t) => typeof t === 'string'))) throw fail('target_modules', 'a list of module names');
  const known = Object.keys(LORA_MODULES[family]);
  const unknown = targets.filter((t) => !known.includes(t));
  if (unknown.length)
    throw new PeftError(`${file}: target_modules: ${unknown.join(', ')} ${unknown.length === 1 ? 'is not a module' : 'are not modules'} of a ${family} model (its linear layers: ${known.join(', ')})`);
  for (const [key, fine] of [
    ['use_dora', false],
    ['use_rslora', false],
  ] as const)
    if (config[key] !== undefined && config[key] !== fine) throw fail(key, String(fine));
  for (const key of ['rank_pattern', 'alpha_pattern'])
    if (config[key] !== undefined && config[key] !== null && Object.keys(config[key] as object).length) throw fail(key, 'none (one rank and alpha for every module)');
  const saved = config.modules_to_save;
  if (saved !== undefined && saved !== null && !(Array.isArray(saved) && saved.every((m) => m === 'lm_head'))) throw fail('modules_to_save', 'none or ["lm_head"]');
  // PEFT keeps target_modules as a set: its order is not its own.
  return { rank: r, alpha, targets: known.filter((t) => targets.includes(t)), ...(Array.isArray(saved) && saved.length ? { modulesToSave: ['lm_head'] } : {}) };
}

/**
 * adapter_model.safetensors' tensors (PEFT's keys) as ferry's adapter parameters (and a saved
 * head), checked against the shapes the base model gives them (`shapes`: ferry's names, the
 * model's whole parameters). `read` reads a key, or undefined where the file lacks it.
 */
export function fromPeftTensors(family: Family, layers: number, lora: LoraSpec, shapes: ReadonlyMap<string, number[]>, read: (key: string) => NamedTensor | undefined, file: string): NamedTensor[] {
  const ads = adapterMap(family, layers, lora);
  const out: NamedTensor[] = [];
  const take = (key: string, shape: number[]): Float32Array => {
    const t = read(`${PREFIX}${key}`);
    if (!t) throw new PeftError(`${file}: no tensor ${PREFIX}${key}: the adapter lacks a module its config targets (or the base model's family differs)`);
    if (t.shape.join('x') !== shape.join('x')) throw new PeftError(`${file}: ${PREFIX}${key}: expected shape [${shape}] (the base model's), got [${t.shape}]`);
    return t.data;
  };
  for (let l = 0; l < layers; l++) {
    for (const { path, parts } of modulesOf(family, l, lora)) {
      const aName = ads.get(`h${l}.${parts[0]}`)!.a;
      const [inDim, r] = shapes.get(aName)!;
      out.push({ name: aName, shape: [inDim!, r!], data: transposed(take(`${path}.lora_A.weight`, [r!, inDim!]), r!, inDim!) });
      const widths = parts.map((p) => shapes.get(ads.get(`h${l}.${p}`)!.b)![1]!);
      const total = widths.reduce((a, b) => a + b, 0);
      const b = transposed(take(`${path}.lora_B.weight`, [total, r!]), total, r!); // [r, Σout]
      cutSides(b, r!, widths).forEach((data, k) => out.push({ name: ads.get(`h${l}.${parts[k]}`)!.b, shape: [r!, widths[k]!], data }));
    }
  }
  if (lora.modulesToSave?.includes('lm_head')) {
    const [D, V] = shapes.get('head.w')!;
    out.push({ name: 'head.w', shape: [D!, V!], data: transposed(take('lm_head.weight', [V!, D!]), V!, D!) });
  }
  return out;
}

/**
 * The base's parameters with the adapters merged in: each adapted W as W + s·A·B (in double
 * precision, rounded once), the adapters themselves left out.
 */
export function mergeAdapters(family: Family, layers: number, lora: LoraSpec, tensors: readonly NamedTensor[]): NamedTensor[] {
  const byName = new Map(tensors.map((t) => [t.name, t]));
  const ads = adapterMap(family, layers, lora);
  return tensors
    .filter((t) => !t.name.endsWith('.lora_a') && !t.name.endsWith('.lora_b'))
    .map((t) => {
      const ad = ads.get(t.name);
      if (!ad) return t;
      const a = byName.get(ad.a)!;
      const b = byName.get(ad.b)!;
      const [I, O] = t.shape as [number, number];
      const r = a.shape[1]!;
      const data = new Float32Array(I * O);
      for (let i = 0; i < I; i++)
        for (let o = 0; o < O; o++) {
          let sum = 0;
          for (let k = 0; k < r; k++) sum += a.data[i * r + k]! * b.data[k * O + o]!;
          data[i * O + o] = t.data[i * O + o]! + ad.scale * sum;
        }
      return { ...t, data };
    });
}
