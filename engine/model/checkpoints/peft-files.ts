// A PEFT adapter directory read from disk: adapter_config.json and adapter_model.safetensors, as
// the adapters of a model of a given spec (engine/adapters/peft.ts does the naming and layout).
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { NamedTensor } from '../../../mesh/wire/index.ts';
import { fromPeftTensors, loraOfPeftConfig, PeftError, type LoraSpec } from '../../adapters/index.ts';
import { archOf, parameterShapes, type GptSpec } from '../params.ts';
import { SafetensorsError, SafetensorsFile } from './safetensors.ts';

export const ADAPTER_CONFIG = 'adapter_config.json';
export const ADAPTER_WEIGHTS = 'adapter_model.safetensors';

/** The adapters an adapter directory's config describes, for a model of `family`. */
export function readPeftConfig(dir: string, family: 'gpt2' | 'llama'): LoraSpec {
  const file = join(dir, ADAPTER_CONFIG);
  if (!existsSync(file)) throw new PeftError(`${file}: no such file (a PEFT adapter directory holds ${ADAPTER_CONFIG} and ${ADAPTER_WEIGHTS})`);
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(file, 'utf8'));
  } catch (e) {
    throw new PeftError(`${file}: not JSON: ${(e as Error).message}`);
  }
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) throw new PeftError(`${file}: expected a JSON object, got ${JSON.stringify(raw)?.slice(0, 60)}`);
  return loraOfPeftConfig(raw as Record<string, unknown>, family, file);
}

/**
 * The adapters (and a saved head) of a model of `spec` from an adapter directory, whole tensors,
 * checked against the shapes the spec gives them. `shapesOnly`: read the file's header alone
 * (the tensors come back empty): a check before a run starts.
 */
export function readPeftAdapter(dir: string, spec: GptSpec, o: { shapesOnly?: boolean } = {}): NamedTensor[] {
  if (!spec.lora) throw new PeftError(`${dir}: the model has no adapters to read into`);
  const file = join(dir, ADAPTER_WEIGHTS);
  if (!existsSync(file)) throw new PeftError(`${file}: no such file`);
  let st: SafetensorsFile;
  try {
    st = SafetensorsFile.open(file);
  } catch (e) {
    if (e instanceof SafetensorsError) throw new PeftError(e.message);
    throw e;
  }
  try {
    const shapes = new Map(parameterShapes(spec).map(([n, s]) => [n, s]));
    const read = (key: string) => {
      const e = st.tensors.get(key);
      if (!e) return undefined;
      return { name: key, shape: e.shape, data: o.shapesOnly ? new Float32Array(e.shape.reduce((a, b) => a * b, 1)) : st.read(key) };
    };
    return fromPeftTensors(archOf(spec).family, spec.layers, spec.lora, shapes, read, file);
  } finally {
    st.close();
  }
}
