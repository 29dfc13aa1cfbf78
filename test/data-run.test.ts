// Bring your own model and data, end to end, with worker processes over a real NATS server: the
// policy starts from a Hugging Face llama-family checkpoint (each tensor-parallel rank reading its
// own slices of it), prompts come from a JSONL file through the checkpoint's tokenizer, the reward
// device runs the math verifier, and the trained policy comes back out with npm run export —
// loadable as a checkpoint again, bit for bit the run's weights — and answers a text prompt.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { launch } from '../engine/cli/launch.ts';
import { SafetensorsCheckpoint, encodeSafetensors, hfTensors, importHf, parseHfConfig, readHfConfig } from '../engine/model/index.ts';
import { arithTokenizerFiles } from '../engine/runtime/data/arith.ts';
import { evaluateRun, exportRun, readResume, sampleRun, wholeTensors, layoutOf, loadScenario, modelSpec, ownerOf, runSpec } from '../engine/runtime/index.ts';
import type { GptSpec } from '../engine/model/index.ts';
import { ROOT, spawnTs, tempDir } from './helpers.ts';

const quiet = { phase() {}, iteration() {}, stop() {} };
const CONFIG = {
  model_type: 'llama',
  vocab_size: 104,
  max_position_embeddings: 128,
  hidden_size: 32,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  intermediate_size: 48,
  rms_norm_eps: 1e-5,
  rope_theta: 10000,
  tie_word_embeddings: false,
};

/** A llama-family model directory with small known weights and the arithmetic tokenizer. */
function checkpoint(dir: string): Map<string, Float32Array> {
  writeFileSync(join(dir, 'config.json'), JSON.stringify(CONFIG));
  const tensors = hfTensors(parseHfConfig(CONFIG)).map(({ name, shape }, k) => ({
    name,
    shape,
    data: Float32Array.from({ length: shape.reduce((a, b) => a * b, 1) }, (_, i) => (/norm/.test(name) ? 1 : 0) + 0.05 * Math.sin(0.7 * i + k)),
  }));
  writeFileSync(join(dir, 'model.safetensors'), encodeSafetensors(tensors));
  for (const [name, text] of Object.entries(arithTokenizerFiles())) writeFileSync(join(dir, name), text);
  return new Map(tensors.map((t) => [t.name, t.data]));
}

describe('a run from a Hugging Face checkpoint on a JSONL dataset, a recovery, and npm run export', () => {
  it('loads the checkpoint on every rank, trains on the dataset with the verifier, recovers from a kill bit for bit, and exports what it trained', async () => {
    const dir = tempDir();
    const model = join(dir, 'model');
    mkdirSync(model);
    const hf = checkpoint(model);
    const file = join(dir, 'data.yaml');
    writeFileSync(
      file,
      `name: data
seed: 3
data: { train: ${join(ROOT, 'examples/arith/train.jsonl')}, prompt_field: question, answer_field: answer, demo_field: solution, prompt_tokens: 96 }
task: { max_new_tokens: 24 }
model: { from: model }
cluster: { nodes: 1, devices_per_node: 3 }
plan:
  actor.generate: { mesh: "0:0-1", tp: 2 }
  actor.train: { mesh: "0:0-1", tp: 2 }
  reference.inference: { mesh: "0:2" }
  reward.inference: { mesh: "0:2" }
warmup: { steps: 0 }
algorithm: { name: grpo, group: 2 }
rl: { iterations: 2, batch: 4, epochs: 1, minibatches: 1 }
`,
    );
    const out = join(dir, 'run');
    const r = await launch({ scenario: loadScenario(file), run: `data${Date.now()}`, out, progress: quiet, say: () => {} });
    expect(r.code, readFileSync(join(out, 'logs', 'supervisor.log'), 'utf8').slice(-2000)).toBe(0);
    const metrics = readFileSync(join(out, 'metrics.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(metrics).toHaveLength(2);
    // The verifier's score is an accuracy: a share of 8 rows.
    for (const m of metrics) expect(Number.isInteger(m.rule_score * 8)).toBe(true);

    // The reference never trains: it holds the checkpoint's weights, put together from its slices (nn.Linear transposed).
    const spec = runSpec(loadScenario(join(out, 'scenario.json')));
    const ck = readResume(out).checkpoint;
    const ref = wholeTensors(modelSpec(spec, 'reference') as GptSpec, layoutOf(spec, ownerOf(spec, 'reference')), ck.reference!);
    const embed = ref.find((t) => t.name === 'wte')!;
    expect(new Uint32Array(embed.data.buffer)).toEqual(new Uint32Array(hf.get('model.embed_tokens.weight')!.buffer));
    const wk = ref.find((t) => t.name === 'h1.attn.wk')!; // [32, 16]: k_proj [16, 32] transposed
    expect(wk.data[3 * 16 + 5]).toBe(hf.get('model.layers.1.self_attn.k_proj.weight')![5 * 32 + 3]);

    // Export: config, weights and tokenizer; import → the run's trained actor, bit for bit.
    const exported = join(dir, 'exported');
    const p = spawnTs('engine/cli/export.ts', [out, '--out', exported]);
    expect(await p.exited, p.output()).toBe(0);
    expect(p.output()).toMatch(/exported actor to .*: config\.json, model\.safetensors, tokenizer\.json, tokenizer_config\.json/);
    const m = readHfConfig(exported);
    expect(m).toMatchObject({ family: 'llama', modelType: 'llama', vocab: 104, kvHeads: 2, tied: false });
    const back = SafetensorsCheckpoint.open(exported);
    const reimported = importHf(m, back);
    back.close();
    const trained = wholeTensors(modelSpec(spec, 'actor') as GptSpec, layoutOf(spec, ownerOf(spec, 'actor')), ck.actor!);
    expect(reimported.map((t) => t.name)).toEqual(trained.map((t) => t.name));
    reimported.forEach((t, i) => expect(new Uint32Array(t.data.buffer), t.name).toEqual(new Uint32Array(trained[i]!.data.buffer)));
    expect(reimported.some((t, i) => t.data.some((x, j) => x !== ref[i]!.data[j]))).toBe(true); // it did train
    // bf16 halves the weights' bytes.
    const half = await exportRun(out, { out: join(dir, 'half'), dtype: 'bf16' });
    expect(half.bytes).toBeLessThan(0.55 * readFileSync(join(exported, 'model.safetensors')).length);
    expect(existsSync(join(dir, 'half', 'tokenizer.json'))).toBe(true);

    // A text prompt, laid out as the run's prompts are.
    const s = await sampleRun(out, { prompt: 'Ann has 3 coins and gets 4 more. How many coins does Ann have now?', greedy: true });
    expect(typeof s.text).toBe('string');
    expect(s.tokens.length).toBeGreaterThan(0);
    // Scored on rows it did not train on, with its own tokenizer and verifier: the same figure twice.
    const test = join(ROOT, 'examples/arith/test.jsonl');
    const scored = await evaluateRun(out, { data: test, max: 24 });
    expect(scored).toMatchObject({ model: 'actor', rows: 24, greedy: true });
    expect(scored.accuracy).toBe(scored.correct / 24);
    const cli = spawnTs('engine/cli/eval.ts', [out, '--data', test, '--max', '24', '--json']);
    expect(await cli.exited, cli.output()).toBe(0);
    expect(JSON.parse(cli.output().trim().split('\n').at(-1)!)).toEqual(scored);
    await expect(evaluateRun(out, { data: join(dir, 'data.yaml') })).rejects.toThrow(/--data: .*data\.yaml:1: expected a JSON object on each line/);

    // Killed in mid-training, the run recovers to the same weights, bit for bit.
    writeFileSync(file, `${readFileSync(file, 'utf8')}chaos: { kills: [{ actor: actor, call: train, iteration: 1 }] }\n`);
    const killed = await launch({ scenario: loadScenario(file), run: `datakill${Date.now()}`, out: join(dir, 'killed'), progress: quiet, say: () => {} });
    expect(killed.code).toBe(0);
    expect(killed.summary!.recoveries.length).toBeGreaterThan(0);
    expect(killed.summary!.digests).toEqual(r.summary!.digests);
    await expect(exportRun(out, { out: join(dir, 'x'), model: 'reward' })).rejects.toThrow(/--model: expected a policy of the run \(actor, reference\), got "reward"/);
  }, 240_000);
});
