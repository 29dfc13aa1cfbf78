// The checkpoint benchmark: a SmolLM-135M-shaped llama checkpoint (30 layers, width 576, 9 query
// heads over 3 key/value heads, a vocabulary of 49152, tied: 134.5M parameters), with synthetic
// weights, written in F32 and BF16 and read back as ferry's parameters; then one rank loads it from
// the directory (as a run's `model.from` does) and decodes a few tokens. Sizes and seconds.
import { mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SafetensorsCheckpoint, encodeSafetensors, gptSpecOf, hfTensors, importHf, initBackend, parseHfConfig } from '../model/index.ts';
import { LocalDispatcher } from '../runtime/index.ts';

export const SMOLLM_135M = {
  model_type: 'llama',
  vocab_size: 49152,
  max_position_embeddings: 2048,
  hidden_size: 576,
  num_hidden_layers: 30,
  num_attention_heads: 9,
  num_key_value_heads: 3,
  intermediate_size: 1536,
  rms_norm_eps: 1e-5,
  rope_theta: 10000,
  tie_word_embeddings: true,
};

export async function checkpointBench(log: (line: string) => void) {
  const m = parseHfConfig(SMOLLM_135M);
  const dir = mkdtempSync(join(tmpdir(), 'ferry-bench-ckpt-'));
  const seconds = (t: number) => (performance.now() - t) / 1000;
  try {
    writeFileSync(join(dir, 'config.json'), JSON.stringify(SMOLLM_135M));
    const tensors = hfTensors(m).map(({ name, shape }, k) => ({
      name,
      shape,
      data: Float32Array.from({ length: shape.reduce((a, b) => a * b, 1) }, (_, i) => (/norm/.test(name) ? 1 : 0.02 * Math.sin(i * 0.37 + k))),
    }));
    const parameters = tensors.reduce((n, t) => n + t.data.length, 0);
    const files: Record<string, { bytes: number; write_seconds: number; read_seconds: number }> = {};
    for (const dtype of ['F32', 'BF16'] as const) {
      let t = performance.now();
      writeFileSync(join(dir, 'model.safetensors'), encodeSafetensors(tensors, dtype));
      const write = seconds(t);
      t = performance.now();
      const ck = SafetensorsCheckpoint.open(dir);
      importHf(m, ck);
      ck.close();
      files[dtype] = { bytes: statSync(join(dir, 'model.safetensors')).size, write_seconds: write, read_seconds: seconds(t) };
      log(`${dtype}: ${(files[dtype].bytes / 1e6).toFixed(0)} MB, written in ${write.toFixed(2)} s, read and imported in ${files[dtype].read_seconds.toFixed(2)} s`);
    }
    const backend = await initBackend('auto');
    const d = new LocalDispatcher(1);
    const layout = { devices: [0], dp: 1, tp: 1, pp: 1 };
    let t = performance.now();
    await d.call(0, 'policy', -1, { fn: 'load', role: 'policy', spec: gptSpecOf(m), layout, rank: 0, seed: 1, from: dir });
    const load = seconds(t);
    log(`load from the directory (BF16) on one rank, ${backend}: ${load.toFixed(2)} s`);
    const [P, R] = [16, 8];
    t = performance.now();
    await d.call(0, 'policy', 0, {
      fn: 'generate',
      prompts: Int32Array.from({ length: P }, (_, i) => 100 + i),
      batch: 1,
      promptLen: P,
      responseLen: R,
      seeds: new Uint32Array(1),
      temperature: 1,
      greedy: true,
    });
    const generate = seconds(t);
    log(`${R} greedy tokens after ${P}: ${generate.toFixed(2)} s`);
    await d.close();
    return { model: 'smollm-135m-shaped', parameters, backend, files, load_seconds: load, generate_seconds: generate, generated: R };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
