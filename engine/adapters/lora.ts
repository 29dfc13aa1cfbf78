// LoRA adapters as parameters: which of a model's matrices carry one, under which names and
// shapes, and how tensor parallelism cuts them. Pure data (no TensorFlow.js): the model layer
// computes with them (engine/model/blocks.ts), everything that moves, stores or plans parameters
// sees them as the ordinary parameters they are, appended after the base's.
//
// A matrix W [in, out] (ferry stores x·W) with an adapter computes x·W + s·(x·A)·B, A [in, r],
// B [r, out], s = alpha / r. B starts at zero, so a fresh adapter changes nothing, bit for bit.
// A column-parallel W (cut by columns) keeps A whole on every tensor rank and cuts B as W; a
// row-parallel W (cut by rows) cuts A by rows and keeps B whole: the adapter's product then lands
// where W's does, and the replicated half's gradient is a partial sum over the tensor ranks.

/** A model's adapters, as a scenario asks for them (`model.lora`) and a run's spec carries them. */
export interface LoraSpec {
  rank: number;
  alpha: number;
  /** Module names in the family's own (Hugging Face) naming: gpt2 c_attn, c_proj, c_fc; llama q_proj … down_proj. */
  targets: string[];
  /**
   * Whole modules that train beside the adapters (PEFT's modules_to_save): `lm_head`, a policy's
   * untied head. A value model's head, new to it, always trains.
   */
  modulesToSave?: string[];
}

/** The modules that may train whole beside the adapters, by their Hugging Face names. */
export const SAVABLE_MODULES = ['lm_head'];

export type Family = 'gpt2' | 'llama';

/**
 * The family's adaptable modules, by their Hugging Face names, and the base matrices of one layer
 * each stands for (ferry's names, after `h<l>.`). GPT-2's c_attn is q, k and v fused (one A, its B
 * the three side by side); its c_proj names both the attention's output and the MLP's second matrix.
 */
export const LORA_MODULES: Record<Family, Record<string, string[]>> = {
  gpt2: { c_attn: ['attn.wq', 'attn.wk', 'attn.wv'], c_proj: ['attn.wo', 'mlp.w2'], c_fc: ['mlp.w1'] },
  llama: {
    q_proj: ['attn.wq'],
    k_proj: ['attn.wk'],
    v_proj: ['attn.wv'],
    o_proj: ['attn.wo'],
    gate_proj: ['mlp.w1'],
    up_proj: ['mlp.w3'],
    down_proj: ['mlp.w2'],
  },
};

/** Every linear layer of the family: what `targets` defaults to. */
export const defaultTargets = (family: Family): string[] => Object.keys(LORA_MODULES[family]);

/** The base matrices tensor parallelism cuts by rows (the others an adapter may sit on, by columns). */
const ROW_PARALLEL = new Set(['attn.wo', 'mlp.w2']);

/** One base matrix's adapter: the parameter names of its A (shared by GPT-2's fused q, k, v) and its B. */
export interface AdapterOf {
  a: string;
  b: string;
  scale: number;
}

/** The adapter's A of a base matrix `part` (after `h<l>.`): GPT-2's q, k and v share c_attn's. */
function aPart(family: Family, part: string): string {
  return family === 'gpt2' && /^attn\.w[qkv]$/.test(part) ? 'attn.wqkv' : part;
}

export const isAdapter = (name: string): boolean => name.endsWith('.lora_a') || name.endsWith('.lora_b');

/** The base matrices (names after `h<l>.`) that carry an adapter, in the layer's canonical order. */
export function adaptedParts(family: Family, lora: LoraSpec): string[] {
  const parts = new Set(lora.targets.flatMap((t) => LORA_MODULES[family][t] ?? []));
  const order = family === 'gpt2' ? ['attn.wq', 'attn.wk', 'attn.wv', 'attn.wo', 'mlp.w1', 'mlp.w2'] : ['attn.wq', 'attn.wk', 'attn.wv', 'attn.wo', 'mlp.w1', 'mlp.w3', 'mlp.w2'];
  return order.filter((p) => parts.has(p));
}

/** Each adapted base parameter's adapter (full names, `h<l>.<part>` → its A and B). */
export function adapterMap(family: Family, layers: number, lora: LoraSpec): Map<string, AdapterOf> {
  const out = new Map<string, AdapterOf>();
  const scale = lora.alpha / lora.rank;
  for (let l = 0; l < layers; l++) for (const part of adaptedParts(family, lora)) out.set(`h${l}.${part}`, { a: `h${l}.${aPart(family, part)}.lora_a`, b: `h${l}.${part}.lora_b`, scale });
  return out;
}

/**
 * The adapters' parameters, in canonical order (each layer's, A before its Bs), from the base's
 * shapes: name, shape and the axis tensor parallelism cuts (null: whole on every rank).
 */
export function adapterShapes(
  family: Family,
  base: ReadonlyArray<readonly [string, number[]]>,
  layers: number,
  lora: LoraSpec,
): Array<{ name: string; shape: number[]; layer: number; splitAxis: number | null }> {
  const shapes = new Map(base.map(([n, s]) => [n, s]));
  const out: Array<{ name: string; shape: number[]; layer: number; splitAxis: number | null }> = [];
  const r = lora.rank;
  for (let l = 0; l < layers; l++) {
    const seen = new Set<string>();
    for (const part of adaptedParts(family, lora)) {
      const [inDim, outDim] = shapes.get(`h${l}.${part}`)!;
      const row = ROW_PARALLEL.has(part);
      const a = `h${l}.${aPart(family, part)}.lora_a`;
      if (!seen.has(a)) {
        seen.add(a);
        out.push({ name: a, shape: [inDim!, r], layer: l, splitAxis: row ? 0 : null });
      }
      out.push({ name: `h${l}.${part}.lora_b`, shape: [r, outDim!], layer: l, splitAxis: row ? null : 1 });
    }
  }
  return out;
}

/**
 * Why `lora` cannot sit on a model of this family and shape, or undefined: `where` names the key
 * (model.lora in a scenario file, say).
 */
export function loraProblem(lora: LoraSpec, family: Family, base: ReadonlyArray<readonly [string, number[]]>, where: string): string | undefined {
  const known = LORA_MODULES[family];
  const unknown = lora.targets.filter((t) => !(t in known));
  if (unknown.length)
    return `${where}.targets: ${unknown.map((t) => `'${t}'`).join(', ')} ${unknown.length === 1 ? 'is not a module' : 'are not modules'} of a ${family} model; its linear layers are ${Object.keys(known).join(', ')}`;
  if (!lora.targets.length) return `${where}.targets: expected at least one of ${Object.keys(known).join(', ')}, got none`;
  if (!(Number.isInteger(lora.rank) && lora.rank >= 1)) return `${where}.rank: expected a whole number of at least 1, got ${lora.rank}`;
  const shapes = new Map(base.map(([n, s]) => [n, s]));
  for (const part of adaptedParts(family, lora)) {
    const [i, o] = shapes.get(`h0.${part}`) ?? [];
    if (i === undefined || o === undefined) continue;
    const side = Math.min(i, o);
    if (lora.rank > side) return `${where}.rank: ${lora.rank} is above the smaller side of ${part} [${i}, ${o}] (${side}): an adapter of that rank is a full matrix, at more cost`;
  }
  if (!(lora.alpha > 0)) return `${where}.alpha: expected a positive number, got ${lora.alpha}`;
  const unsaved = (lora.modulesToSave ?? []).filter((m) => !SAVABLE_MODULES.includes(m));
  if (unsaved.length) return `${where}.modules_to_save: ${unsaved.map((m) => `'${m}'`).join(', ')}: expected ${SAVABLE_MODULES.join(', ')} (the head of a policy whose head is not its embedding)`;
  if (lora.modulesToSave?.includes('lm_head') && !shapes.has('head.w'))
    return `${where}.modules_to_save: 'lm_head' is this model's token embedding (a tied head): it cannot train whole while the base is frozen`;
  return undefined;
}

/** Parameters the adapters add to a model of the base's shapes. */
export function adapterCount(family: Family, base: ReadonlyArray<readonly [string, number[]]>, layers: number, lora: LoraSpec): number {
  return adapterShapes(family, base, layers, lora).reduce((n, p) => n + p.shape.reduce((a, b) => a * b, 1), 0);
}
