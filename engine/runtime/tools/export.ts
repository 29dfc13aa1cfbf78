// A run's policy as a Hugging Face model directory: the last checkpoint's shards put together into
// whole tensors (each rank's slice where the model's layout puts it), then written in the family's
// checkpoint layout — config.json, model.safetensors and, when the run read text, its tokenizer's
// files — so that transformers (and whatever reads its checkpoints) loads it like any other.
import { copyFileSync, existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { modelInfo, encodeSafetensors, exportHf, hfConfig, hfModelOf, HfError, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, type GptSpec } from '../../model/index.ts';
import { paste, shardSlices, sliceShape, type Layout } from '../../../mesh/parallel/index.ts';
import type { Checkpoint, NamedTensor } from '../../../mesh/wire/index.ts';
import { layoutOf, ownerOf } from '../run/run.ts';
import { runPolicy } from './sample.ts';
import { tokenizerDir } from '../scenario/scenario.ts';

export class ExportError extends Error {
  override name = 'ExportError';
}

export interface ExportOptions {
  /** The run's model to export (default: the trained policy). */
  model?: string;
  dtype?: 'f32' | 'bf16';
  out: string;
}

/** Whole tensors from the shards of one model, in the canonical order. */
export function wholeTensors(spec: GptSpec, layout: Layout, shards: readonly Checkpoint[]): NamedTensor[] {
  const info = modelInfo(spec);
  if (shards.length !== layout.devices.length) throw new ExportError(`the checkpoint holds ${shards.length} rank(s); the model's layout has ${layout.devices.length}`);
  const whole = new Map(info.params.map((p) => [p.name, { name: p.name, shape: p.shape, data: new Float32Array(p.shape.reduce((a, b) => a * b, 1)) }]));
  const filled = new Map<string, number>();
  shards.forEach((shard, rank) => {
    const slices = new Map(shardSlices(info, layout, rank).map((s) => [s.name, s]));
    for (const t of shard.tensors) {
      const s = slices.get(t.name);
      const w = whole.get(t.name);
      if (!s || !w) throw new ExportError(`rank ${rank} of the checkpoint holds '${t.name}', which its layout does not give it`);
      if (sliceShape(s).join('x') !== t.shape.join('x')) throw new ExportError(`rank ${rank}: '${t.name}' is [${t.shape}], its layout gives [${sliceShape(s)}]`);
      paste(w.data, { ...s, axis: null, start: 0, end: s.shape[0]! }, s, t.data);
      filled.set(t.name, (filled.get(t.name) ?? 0) + t.data.length);
    }
  });
  return info.params.map((p) => {
    const w = whole.get(p.name)!;
    // Replicated slices repeat on every tensor or data-parallel rank: at least the whole must be there.
    if ((filled.get(p.name) ?? 0) < w.data.length) throw new ExportError(`the checkpoint's shards do not cover '${p.name}'`);
    return w;
  });
}

/** Writes the run's policy to `o.out` as a Hugging Face model directory; returns what it wrote. */
export async function exportRun(dir: string, o: ExportOptions): Promise<{ model: string; files: string[]; bytes: number }> {
  const { r, resume, model, spec } = await runPolicy(dir, o.model, { verb: 'export', flag: '--model', fail: (m) => new ExportError(m) });
  let hf: ReturnType<typeof hfModelOf>;
  try {
    hf = hfModelOf(spec);
  } catch (e) {
    if (e instanceof HfError) throw new ExportError(`${model}: ${e.message}`);
    throw e;
  }
  const tensors = exportHf(hf, wholeTensors(spec, resume.layouts?.[model] ?? layoutOf(r, ownerOf(r, model)), resume.checkpoint[model] ?? []));
  const dtype = o.dtype ?? 'f32';
  mkdirSync(o.out, { recursive: true });
  const config = { ...hfConfig(hf), torch_dtype: dtype === 'f32' ? 'float32' : 'bfloat16' };
  const safetensors = encodeSafetensors(tensors, dtype === 'f32' ? 'F32' : 'BF16', { format: 'pt' });
  writeFileSync(join(o.out, 'config.json'), `${JSON.stringify(config, null, 2)}\n`);
  writeFileSync(join(o.out, 'model.safetensors'), safetensors);
  const files = ['config.json', 'model.safetensors'];
  // The run's tokenizer, when it read text: the dataset's, else the checkpoint it started from.
  const tokenizer = tokenizerDir(r.scenario);
  for (const name of [TOKENIZER_FILE, TOKENIZER_CONFIG_FILE]) {
    if (tokenizer === undefined || !existsSync(join(tokenizer, name))) continue;
    copyFileSync(join(tokenizer, name), join(o.out, name));
    files.push(name);
  }
  return { model, files, bytes: safetensors.length };
}
