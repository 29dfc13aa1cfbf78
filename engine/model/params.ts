// The parameter list of ferry's GPT models: names and shapes in canonical order. Kept apart from
// model.ts so that processes that plan or route parameters need not load TensorFlow.js.

import type { ModelInfo, ParamInfo } from '../../mesh/parallel/index.ts';
import { adapterShapes, isAdapter, loraProblem, type LoraSpec } from '../adapters/index.ts';

export interface GptSpec {
  kind: 'policy' | 'value';
  vocab: number;
  context: number;
  layers: number;
  width: number;
  heads: number;
  /**
   * A policy whose head is its token embedding, transposed (GPT-2's, tied, with no bias): the
   * logits of a row y are y·wteᵀ. On a pipeline the first stage owns the embedding and the last
   * stage reads a copy of it (see GptRank).
   */
  tied?: boolean;
  /**
   * The architecture: `gpt2` (the default: learned positions, layer norms, GELU MLP, biases) or
   * `llama` (rotary positions, RMSNorm, SwiGLU MLP, grouped-query attention, no biases but
   * optionally Qwen2's on q, k and v). The fields below are llama's.
   */
  family?: 'gpt2' | 'llama';
  /** Key/value heads (grouped-query attention when fewer than `heads`); default `heads`. */
  kvHeads?: number;
  /** The MLP's hidden width; default 4 × width. */
  ffn?: number;
  /** The rotary positions' base (rope_theta); default 10000. */
  ropeTheta?: number;
  /** The norms' epsilon; default 1e-5 (gpt2's, which it must be) or 1e-6 (llama). */
  normEps?: number;
  /** Biases on the q, k and v projections (Qwen2's). */
  qkvBias?: boolean;
  /**
   * The padding token of left-padded prompts: a row's leading run of it is masked out of
   * attention (and not counted in its positions), so a padded prompt reads as the prompt alone.
   */
  pad?: number;
  /**
   * LoRA adapters on the named linear layers (engine/adapters): the base is frozen and only the
   * adapters (and a value model's head) train. Their parameters follow the base's.
   */
  lora?: LoraSpec;
}

/** A spec with every field filled in: what the runtime computes with. */
export interface Arch {
  family: 'gpt2' | 'llama';
  kvHeads: number;
  ffn: number;
  ropeTheta: number;
  normEps: number;
  qkvBias: boolean;
  /** Head size: width / heads. */
  headSize: number;
}

export function archOf(spec: GptSpec): Arch {
  const family = spec.family ?? 'gpt2';
  return {
    family,
    kvHeads: spec.kvHeads ?? spec.heads,
    ffn: spec.ffn ?? 4 * spec.width,
    ropeTheta: spec.ropeTheta ?? 10000,
    normEps: spec.normEps ?? (family === 'gpt2' ? 1e-5 : 1e-6),
    qkvBias: family === 'gpt2' || spec.qkvBias === true,
    headSize: spec.width / spec.heads,
  };
}

/** Why a spec cannot be built, or undefined. */
export function specProblem(spec: GptSpec): string | undefined {
  const a = archOf(spec);
  if (spec.width % spec.heads !== 0) return `the width ${spec.width} does not divide into ${spec.heads} heads`;
  if (spec.heads % a.kvHeads !== 0) return `${spec.heads} query heads do not divide into ${a.kvHeads} key/value heads`;
  if (a.family === 'llama' && a.headSize % 2 !== 0) return `rotary positions turn pairs of a head's elements; the head size ${a.headSize} is odd`;
  if (a.family === 'gpt2' && spec.kvHeads !== undefined && spec.kvHeads !== spec.heads)
    return `the gpt2 family has no grouped-query attention: kvHeads ${spec.kvHeads} differs from heads ${spec.heads}`;
  if (spec.lora) return loraProblem(spec.lora, a.family, parameterShapes(baseSpec(spec)), 'model.lora');
  return undefined;
}

/**
 * Every parameter's name and shape, in the canonical order. Both families name a layer's weights
 * alike where they play the same part (wq, wk, wv, wo; mlp.w1 the first MLP matrix, for llama its
 * gate, w3 llama's up projection, w2 the second); matrices are [in, out].
 */
export function parameterShapes(spec: GptSpec): Array<[string, number[]]> {
  const { vocab: V, context: C, width: D, layers: L } = spec;
  const a = archOf(spec);
  const F = a.ffn;
  const KV = a.kvHeads * a.headSize;
  const gpt2 = a.family === 'gpt2';
  const out: Array<[string, number[]]> = [['wte', [V, D]]];
  if (gpt2) out.push(['wpe', [C, D]]);
  for (let l = 0; l < L; l++) {
    const h = `h${l}`;
    const p = (name: string, shape: number[]) => out.push([`${h}.${name}`, shape]);
    p('ln1.g', [D]);
    if (gpt2) p('ln1.b', [D]);
    p('attn.wq', [D, D]);
    if (a.qkvBias) p('attn.bq', [D]);
    p('attn.wk', [D, KV]);
    if (a.qkvBias) p('attn.bk', [KV]);
    p('attn.wv', [D, KV]);
    if (a.qkvBias) p('attn.bv', [KV]);
    p('attn.wo', [D, D]);
    if (gpt2) p('attn.bo', [D]);
    p('ln2.g', [D]);
    if (gpt2) p('ln2.b', [D]);
    p('mlp.w1', [D, F]);
    if (gpt2) p('mlp.b1', [F]);
    else p('mlp.w3', [D, F]);
    p('mlp.w2', [F, D]);
    if (gpt2) p('mlp.b2', [D]);
  }
  const out_ = spec.kind === 'policy' ? V : 1;
  out.push(['lnf.g', [D]]);
  if (gpt2) out.push(['lnf.b', [D]]);
  if (!isTied(spec)) out.push(['head.w', [D, out_]]);
  if (!isTied(spec) && gpt2) out.push(['head.b', [out_]]);
  // After the base, so that the base's parameters keep their places (and their seeded streams).
  if (spec.lora) for (const p of adapterShapes(a.family, out, L, spec.lora)) out.push([p.name, p.shape]);
  return out;
}

/** The base model's parameters alone: the spec without its adapters. */
export function baseSpec(spec: GptSpec): GptSpec {
  if (!spec.lora) return spec;
  const { lora: _, ...base } = spec;
  return base;
}

/**
 * Whether a parameter trains: with adapters, the adapters, a value model's head (new to it) and a
 * policy's head where `modulesToSave` names lm_head; without, every parameter.
 */
export function trains(spec: GptSpec, name: string): boolean {
  return !spec.lora || isAdapter(name) || (isHead(name) && (spec.kind === 'value' || spec.lora.modulesToSave?.includes('lm_head') === true));
}

export function parameterCount(spec: GptSpec): number {
  return parameterShapes(spec).reduce((n, [, s]) => n + s.reduce((a, b) => a * b, 1), 0);
}

/** Whether the model's head is its token embedding (a tied policy). */
export function isTied(spec: GptSpec): boolean {
  return spec.kind === 'policy' && spec.tied === true;
}

/** The head is what differs between a policy and a value model; the body is shared. */
export function isHead(name: string): boolean {
  return name.startsWith('head.');
}

/**
 * The model as the mesh layer sees it: each parameter's layer and the axis that tensor
 * parallelism cuts, Megatron-style — QKV and the first MLP matrices by columns (with their
 * biases; k and v by key/value heads, so that a rank's query heads find their keys beside them),
 * the attention output and the second MLP matrix by rows; norms, the output biases, embeddings
 * and the head are replicated.
 */
export function modelInfo(spec: GptSpec): ModelInfo {
  const adapters = new Map(spec.lora ? adapterShapes(archOf(spec).family, parameterShapes(baseSpec(spec)), spec.layers, spec.lora).map((p) => [p.name, p]) : []);
  const params: ParamInfo[] = parameterShapes(spec).map(([name, shape]) => {
    const adapter = adapters.get(name);
    if (adapter) return { name, shape, layer: adapter.layer, splitAxis: adapter.splitAxis };
    const m = /^h(\d+)\.(.*)$/.exec(name);
    if (!m) return { name, shape, layer: name === 'wte' || name === 'wpe' ? 'embed' : 'head', splitAxis: null };
    const part = m[2]!;
    const splitAxis = /^attn\.w[qkv]$|^mlp\.w[13]$/.test(part) ? 1 : /^attn\.b[qkv]$|^mlp\.b1$|^attn\.wo$|^mlp\.w2$/.test(part) ? 0 : null;
    return { name, shape, layer: Number(m[1]), splitAxis };
  });
  return { layers: spec.layers, params };
}
