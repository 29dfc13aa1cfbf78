// ferry's LoRA adapters against PEFT itself: a model of each family with trained-looking adapters
// (B not zero; llama's head trained whole, PEFT's modules_to_save), its base written as a Hugging
// Face checkpoint and its adapters as a PEFT adapter. transformers loads the base, PEFT puts the
// adapter on it: its log-probabilities equal ferry's; the merged checkpoint's too; with the
// adapter disabled, the base's. PEFT's own save of the adapter reads back into ferry's parameters
// bit for bit. Where Python with torch, transformers and peft is missing, the test is skipped and
// says so (pip install torch transformers peft).
import { spawnSync } from 'node:child_process';
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import * as tf from '@tensorflow/tfjs';
import {
  baseSpec,
  encodeSafetensors,
  exportHf,
  hfConfig,
  hfModelOf,
  initBackend,
  initialWeights,
  parameterShapes,
  responseLogprobs,
  Rng,
  SafetensorsFile,
  type GptSpec,
} from '../engine/model/index.ts';
import { fromPeftTensors, loraOfPeftConfig, mergeAdapters, peftConfig, peftTensors } from '../engine/adapters/index.ts';
import type { NamedTensor } from '../mesh/wire/index.ts';
import { ROOT, tempDir } from './helpers.ts';

const PYTHON = spawnSync('python3', ['-c', 'import torch, transformers, peft'], { stdio: 'ignore' }).status === 0;
const SKIPPED = PYTHON ? '' : ' (skipped: no Python with torch, transformers and peft here; pip install torch transformers peft)';

const shape = { kind: 'policy' as const, vocab: 13, context: 8, layers: 2, width: 8, heads: 2 };
const FAMILIES: Array<[string, GptSpec]> = [
  ['gpt2 (c_attn, c_proj, c_fc; fan_in_fan_out)', { ...shape, tied: true, lora: { rank: 2, alpha: 4, targets: ['c_attn', 'c_proj', 'c_fc'] } }],
  [
    'llama (every projection, and lm_head trained whole)',
    {
      ...shape,
      family: 'llama',
      kvHeads: 1,
      ffn: 12,
      normEps: 1e-6,
      ropeTheta: 10000,
      lora: { rank: 3, alpha: 6, targets: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'], modulesToSave: ['lm_head'] },
    },
  ],
];
const TOKENS = [
  [1, 5, 2, 9, 12, 0, 7, 3],
  [4, 4, 11, 6, 2, 8, 10, 1],
];

/** The model's weights as drawn, then its adapters (and llama's head) moved as training would. */
function trained(spec: GptSpec): NamedTensor[] {
  const rng = new Rng(5);
  return initialWeights(spec, 3).map((t) => (t.name.endsWith('.lora_b') || t.name === 'head.w' ? { ...t, data: t.data.map((x) => x + 0.3 * rng.normal()) } : t));
}

function logprobs(spec: GptSpec, tensors: readonly NamedTensor[]): number[][] {
  return tf.tidy(() => {
    const w = Object.fromEntries(tensors.map((t) => [t.name, tf.tensor(t.data, t.shape)]));
    const lp = responseLogprobs(spec, w, tf.tensor2d(TOKENS.flat(), [TOKENS.length, TOKENS[0]!.length], 'int32'), 1);
    return lp.arraySync() as number[][];
  });
}

const worst = (a: number[][], b: number[][]) => Math.max(...a.flatMap((row, i) => row.map((x, j) => Math.abs(x - b[i]![j]!))));

function writeModel(dir: string, spec: GptSpec, tensors: readonly NamedTensor[]) {
  mkdirSync(dir, { recursive: true });
  const hf = hfModelOf(baseSpec(spec));
  writeFileSync(join(dir, 'config.json'), JSON.stringify({ ...hfConfig(hf), torch_dtype: 'float32' }));
  writeFileSync(join(dir, 'model.safetensors'), encodeSafetensors(exportHf(hf, tensors), 'F32', { format: 'pt' }));
}

type Theirs = Record<'adapter' | 'base' | 'merged', number[][]>;

describe('LoRA adapters against PEFT', () => {
  let dir: string;
  /** Each family's model as written, and what PEFT computed of it (one Python process for both). */
  const made = new Map<string, { all: NamedTensor[]; drawn: NamedTensor[]; theirs?: Theirs; error?: string }>();
  const at = (family: string, k: string) => join(dir, `${family}-${k}`);
  beforeAll(async () => {
    await initBackend('wasm');
    dir = tempDir('ferry-peft-');
    if (!PYTHON) return;
    const jobs: Record<string, Record<string, string>> = {};
    for (const [, spec] of FAMILIES) {
      const family = spec.family ?? 'gpt2';
      const all = trained(spec);
      // The base as it was drawn (llama's head before training): what PEFT puts the adapter on.
      const drawn = initialWeights(baseSpec(spec), 3);
      writeModel(at(family, 'base'), spec, drawn);
      mkdirSync(at(family, 'adapter'), { recursive: true });
      writeFileSync(join(at(family, 'adapter'), 'adapter_config.json'), JSON.stringify(peftConfig(family, spec.lora!)));
      writeFileSync(join(at(family, 'adapter'), 'adapter_model.safetensors'), encodeSafetensors(peftTensors(family, spec.layers, spec.lora!, all), 'F32', { format: 'pt' }));
      writeModel(at(family, 'merged'), spec, mergeAdapters(family, spec.layers, spec.lora!, all));
      jobs[family] = { base: at(family, 'base'), adapter: at(family, 'adapter'), merged: at(family, 'merged'), resaved: at(family, 'resaved') };
      made.set(family, { all, drawn });
    }
    const py = spawnSync('python3', [join(ROOT, 'test', 'peft-reference.py'), JSON.stringify(jobs), JSON.stringify(TOKENS)], { encoding: 'utf8' });
    const out = py.status === 0 ? (JSON.parse(py.stdout.trim().split('\n').at(-1)!) as Record<string, Theirs>) : {};
    for (const [family, m] of made) made.set(family, { ...m, ...(out[family] ? { theirs: out[family] } : { error: py.stderr }) });
  }, 120_000);
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it.skipIf(!PYTHON).each(FAMILIES)(`%s: PEFT's log-probs on the base equal ferry's, merged too; PEFT's own save reads back bit for bit${SKIPPED}`, async (name, spec) => {
    const family = spec.family ?? 'gpt2';
    const { all, drawn, theirs, error } = made.get(family)!;
    expect(theirs, `${name}: ${error}`).toBeDefined();
    const base = all.filter((t) => parameterShapes(baseSpec(spec)).some(([n]) => n === t.name));
    const ours = logprobs(spec, all);
    expect(worst(theirs!.adapter, ours)).toBeLessThan(1e-4);
    expect(worst(theirs!.merged, ours)).toBeLessThan(1e-4);
    expect(worst(theirs!.base, logprobs(baseSpec(spec), drawn))).toBeLessThan(1e-4);
    // The adapters matter: without them the log-probs are another model's.
    expect(worst(ours, logprobs(baseSpec(spec), base))).toBeGreaterThan(1e-3);
    // PEFT's own save, read back: ferry's adapters (and head) exactly.
    const config = loraOfPeftConfig(JSON.parse(readFileSync(join(at(family, 'resaved'), 'adapter_config.json'), 'utf8')) as Record<string, unknown>, family, 'adapter_config.json');
    expect(config).toEqual(spec.lora);
    const file = SafetensorsFile.open(join(at(family, 'resaved'), 'adapter_model.safetensors'));
    const shapes = new Map(parameterShapes(spec).map(([n, s]) => [n, s]));
    const back = fromPeftTensors(
      family,
      spec.layers,
      config,
      shapes,
      (key) => (file.tensors.has(key) ? { name: key, shape: file.tensors.get(key)!.shape, data: file.read(key) } : undefined),
      'adapter_model.safetensors',
    );
    const byName = new Map(all.map((t) => [t.name, t.data]));
    expect(back.length).toBe(all.filter((t) => t.name.endsWith('.lora_a') || t.name.endsWith('.lora_b') || (config.modulesToSave && t.name === 'head.w')).length);
    for (const t of back) expect(Array.from(t.data), t.name).toEqual(Array.from(byName.get(t.name)!));
  });
});
