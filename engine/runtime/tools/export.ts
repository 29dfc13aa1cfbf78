// A run's policy as a Hugging Face model directory: the last checkpoint's shards put together into
// whole tensors (each rank's slice where the model's layout puts it), then written in the family's
// checkpoint layout — config.json, model.safetensors and, when the run read text, its tokenizer's
// files — so that transformers (and whatever reads its checkpoints) loads it like any other.
import { copyFileSync, existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { archOf, baseSpec, encodeSafetensors, exportHf, hfConfig, hfModelOf, HfError, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE } from '../../model/index.ts';
import { mergeAdapters, peftConfig, peftTensors } from '../../adapters/index.ts';
import { wholeTensors } from '../store/reshard.ts';
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
  /**
   * A run with LoRA adapters: write the adapters alone as a PEFT adapter (adapter_config.json,
   * adapter_model.safetensors) instead of the model with them merged in (the default).
   */
  adapter?: boolean;
}

/**
 * Writes the run's policy to `o.out` as a Hugging Face model directory (with LoRA adapters: merged
 * into the base, W + s·B·A), or its adapters alone as a PEFT adapter; returns what it wrote.
 */
export async function exportRun(dir: string, o: ExportOptions): Promise<{ model: string; files: string[]; bytes: number }> {
  const { r, resume, model, spec } = await runPolicy(dir, o.model, { verb: 'export', flag: '--model', fail: (m) => new ExportError(m) });
  let hf: ReturnType<typeof hfModelOf>;
  try {
    hf = hfModelOf(baseSpec(spec));
  } catch (e) {
    if (e instanceof HfError) throw new ExportError(`${model}: ${e.message}`);
    throw e;
  }
  const whole = wholeTensors(spec, resume.layouts?.[model] ?? layoutOf(r, ownerOf(r, model)), resume.checkpoint[model] ?? [], model);
  const family = archOf(spec).family;
  const dtype = o.dtype ?? 'f32';
  if (o.adapter) {
    if (!spec.lora) throw new ExportError(`--adapter: ${model} has no LoRA adapters (the scenario has no model.lora); export the model without --adapter`);
    mkdirSync(o.out, { recursive: true });
    const safetensors = encodeSafetensors(peftTensors(family, spec.layers, spec.lora, whole), dtype === 'f32' ? 'F32' : 'BF16', { format: 'pt' });
    writeFileSync(join(o.out, 'adapter_config.json'), `${JSON.stringify(peftConfig(family, spec.lora, r.scenario.model.from), null, 2)}\n`);
    writeFileSync(join(o.out, 'adapter_model.safetensors'), safetensors);
    return { model, files: ['adapter_config.json', 'adapter_model.safetensors'], bytes: safetensors.length };
  }
  const tensors = exportHf(hf, spec.lora ? mergeAdapters(family, spec.layers, spec.lora, whole) : whole);
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
