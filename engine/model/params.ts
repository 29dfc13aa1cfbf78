// The parameter list of ferry's GPT models: names and shapes in canonical order. Kept apart from
// model.ts so that processes that plan or route parameters need not load TensorFlow.js.

import type { ModelInfo, ParamInfo } from '../../mesh/parallel/index.ts';

export interface GptSpec {
  kind: 'policy' | 'value';
  vocab: number;
  context: number;
  layers: number;
  width: number;
  heads: number;
  /**
   * A policy whose head is its token embedding, transposed (GPT-2's, tied, with no bias): the
   * logits of a row y are y·wteᵀ. Its embedding must sit on the last pipeline stage too, so a tied
   * model runs with pp = 1.
   */
  tied?: boolean;
}

/** Every parameter's name and shape, in the canonical order. */
export function parameterShapes(spec: GptSpec): Array<[string, number[]]> {
  const { vocab: V, context: C, width: D, layers: L } = spec;
  const out: Array<[string, number[]]> = [
    ['wte', [V, D]],
    ['wpe', [C, D]],
  ];
  for (let l = 0; l < L; l++) {
    const h = `h${l}`;
    out.push(
      [`${h}.ln1.g`, [D]],
      [`${h}.ln1.b`, [D]],
      [`${h}.attn.wq`, [D, D]],
      [`${h}.attn.bq`, [D]],
      [`${h}.attn.wk`, [D, D]],
      [`${h}.attn.bk`, [D]],
      [`${h}.attn.wv`, [D, D]],
      [`${h}.attn.bv`, [D]],
      [`${h}.attn.wo`, [D, D]],
      [`${h}.attn.bo`, [D]],
      [`${h}.ln2.g`, [D]],
      [`${h}.ln2.b`, [D]],
      [`${h}.mlp.w1`, [D, 4 * D]],
      [`${h}.mlp.b1`, [4 * D]],
      [`${h}.mlp.w2`, [4 * D, D]],
      [`${h}.mlp.b2`, [D]],
    );
  }
  const out_ = spec.kind === 'policy' ? V : 1;
  out.push(['lnf.g', [D]], ['lnf.b', [D]]);
  if (!isTied(spec)) out.push(['head.w', [D, out_]], ['head.b', [out_]]);
  return out;
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
 * parallelism cuts, Megatron-style — QKV and the first MLP matrix by columns (with their biases),
 * the attention output and the second MLP matrix by rows; norms, the output biases, embeddings
 * and the head are replicated.
 */
export function modelInfo(spec: GptSpec): ModelInfo {
  const params: ParamInfo[] = parameterShapes(spec).map(([name, shape]) => {
    const m = /^h(\d+)\.(.*)$/.exec(name);
    if (!m) return { name, shape, layer: name === 'wte' || name === 'wpe' ? 'embed' : 'head', splitAxis: null };
    const part = m[2]!;
    const splitAxis = /^attn\.w[qkv]$|^mlp\.w1$/.test(part) ? 1 : /^attn\.b[qkv]$|^mlp\.b1$|^attn\.wo$|^mlp\.w2$/.test(part) ? 0 : null;
    return { name, shape, layer: Number(m[1]), splitAxis };
  });
  return { layers: spec.layers, params };
}
