// LoRA end to end over NATS with worker processes: an asynchronous run (rl.lag 1: the rollout
// devices' second copy filled beside generation) with a 3D plan, killed mid-iteration — a
// training rank, a rollout rank, the supervisor — ends with the digests of its clean twin, nothing
// lost or trained twice; the views' fills move the adapters alone once their devices keep the
// base, snapshots write the base once; and the run exports as a PEFT adapter and as a merged model.
import { cpSync, existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { runChaos } from '../engine/cli/chaos-run.ts';
import { launch } from '../engine/cli/launch.ts';
import { runId } from '../mesh/wire/index.ts';
import { LocalDispatcher, baseOwnerOf, exportRun, keptModels, layoutOf, ownerOf, parseScenario, readResume, runSpec, modelSpec, wholeTensors, type Summary } from '../engine/runtime/index.ts';
import { parameterShapes, trains, SafetensorsFile, type GptSpec } from '../engine/model/index.ts';
import type { Metrics } from '../mesh/wire/index.ts';
import { FOUR_DEVICES } from '../engine/runtime/run/four-devices.fixture.ts';
import { tempDir } from './helpers.ts';

const SCENARIO = `name: lora-chaos${FOUR_DEVICES.replace('model: { layers: 2, width: 32, heads: 4 }', 'model: { family: llama, layers: 2, width: 16, heads: 2, lora: { rank: 2, alpha: 4, modules_to_save: [lm_head] } }')}warmup: { steps: 2, demos: 32, batch: 8 }
rl: { iterations: 4, batch: 8, lag: 1, lr: 3.0e-3 }
timeouts: { heartbeat_seconds: 3 }
chaos:
  kills:
    - { actor: actor, call: train, iteration: 1 }
    - { actor: actor, call: generate, iteration: 2 }
    - { actor: supervisor, call: inference, iteration: 3 }
`;

const jsonl = <T>(file: string): T[] =>
  readFileSync(file, 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as T);

describe('LoRA over NATS', () => {
  it("asynchronous, with kills: the clean twin's digests, nothing lost; adapters alone move into views, the base is written once; exports as PEFT and merged", async () => {
    const dir = tempDir();
    const scenario = parseScenario(SCENARIO, 'lora-chaos.yaml');
    const report = await runChaos(scenario, dir);
    expect(report.chaos.status, report.chaos.error).toBe('succeeded');
    expect(report).toMatchObject({ digests_equal: true, rollouts_lost: 0, rollouts_duplicated: 0 });
    expect(report.kills).toBeGreaterThanOrEqual(3);

    // The clean run's fills of actor.generate's view: the whole model once, then what trains.
    const spec = modelSpec(runSpec(scenario), 'actor') as GptSpec;
    const size = (name: string) =>
      parameterShapes(spec)
        .find(([n]) => n === name)![1]
        .reduce((a, b) => a * b, 1) * 4;
    const trainable = parameterShapes(spec)
      .filter(([n]) => trains(spec, n))
      .reduce((n, [name]) => n + size(name), 0);
    const all = parameterShapes(spec).reduce((n, [name]) => n + size(name), 0);
    const clean = join(dir, 'clean');
    const metrics = jsonl<Metrics>(join(clean, 'metrics.jsonl'));
    // actor.generate's view is tp = 2: each rank receives its slices; the critic's inference view
    // (dp = 2) receives the critic whole on each of its two devices.
    expect(metrics[0]!.realloc_bytes).toBeGreaterThan(all);
    const later = metrics.slice(2).map((m) => m.realloc_bytes);
    expect(Math.max(...later)).toBeLessThan(metrics[0]!.realloc_bytes / 4);
    expect(trainable / all).toBeLessThan(0.25);

    // Snapshots: the frozen base is an object of its own, written once per rank.
    const summary = JSON.parse(readFileSync(join(clean, 'summary.json'), 'utf8')) as Summary;
    expect(summary.snapshots!.count).toBeGreaterThanOrEqual(4);
    expect(summary.snapshots!.total_bytes).toBeLessThan(2 * summary.snapshots!.count * summary.snapshots!.bytes);

    // The run's adapters as a PEFT adapter, and merged into a Hugging Face model.
    const adapter = await exportRun(clean, { out: join(dir, 'adapter'), adapter: true });
    expect(adapter.files).toEqual(['adapter_config.json', 'adapter_model.safetensors']);
    const config = JSON.parse(readFileSync(join(dir, 'adapter', 'adapter_config.json'), 'utf8')) as Record<string, unknown>;
    expect(config).toMatchObject({
      peft_type: 'LORA',
      r: 2,
      lora_alpha: 4,
      modules_to_save: ['lm_head'],
      target_modules: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'],
    });
    const keys = [...SafetensorsFile.open(join(dir, 'adapter', 'adapter_model.safetensors')).tensors.keys()];
    expect(keys).toContain('base_model.model.model.layers.1.mlp.down_proj.lora_B.weight');
    expect(keys).toContain('base_model.model.lm_head.weight');
    const merged = await exportRun(clean, { out: join(dir, 'merged') });
    expect(merged.files).toContain('model.safetensors');
    expect(existsSync(join(dir, 'merged', 'config.json'))).toBe(true);
    await expect(exportRun(clean, { out: join(dir, 'x'), adapter: true, model: 'reference' })).rejects.toThrow(/--adapter: reference has no LoRA adapters/);

    // And back: a run that starts from the base (the reference, exported) and the PEFT adapter
    // holds, on each rank, exactly the trained policy's weights.
    await exportRun(clean, { out: join(dir, 'base'), model: 'reference' });
    const again = parseScenario(
      `${SCENARIO.replace(/model: \{[^\n]*\n/, `model: { from: ${join(dir, 'base')}, adapter: ${join(dir, 'adapter')} }\n`).replace(/chaos:[\s\S]*$/, '')}`,
      'from-adapter.yaml',
    );
    const r = runSpec(again);
    expect(modelSpec(r, 'actor')).toMatchObject({ lora: { rank: 2, alpha: 4, modulesToSave: ['lm_head'] } });
    const resume = readResume(clean);
    const trained = new Map(
      wholeTensors(spec, resume.layouts?.actor ?? layoutOf(runSpec(scenario), ownerOf(runSpec(scenario), 'actor')), resume.checkpoint.actor!, 'actor').map((t) => [t.name, t.data]),
    );
    const d = new LocalDispatcher(1);
    try {
      const one = { devices: [0], dp: 1, tp: 1, pp: 1 };
      await d.call(0, 'actor', -1, { fn: 'load', role: 'actor', spec: modelSpec(r, 'actor'), layout: one, rank: 0, seed: 3, from: join(dir, 'base'), adapter: join(dir, 'adapter') });
      const held = (await d.call(0, 'actor', -1, { fn: 'weights' })).tensors;
      expect(held.map((t) => t.name)).toEqual([...trained.keys()]);
      for (const t of held) expect(Array.from(t.data), t.name).toEqual(Array.from(trained.get(t.name)!));
    } finally {
      await d.close();
    }
    // model.lora that says otherwise than the adapter is refused, naming both.
    expect(() =>
      parseScenario(
        `${SCENARIO.replace(/model: \{[^\n]*\n/, `model: { from: ${join(dir, 'base')}, adapter: ${join(dir, 'adapter')}, lora: { rank: 4 } }\n`).replace(/chaos:[\s\S]*$/, '')}`,
        'bad.yaml',
      ),
    ).toThrow(/model\.lora\.rank: 4, but .*adapter_config\.json says 2/);
    expect(() =>
      parseScenario(
        `${SCENARIO.replace(/model: \{[^\n]*\n/, `model: { layers: 2, width: 16, heads: 2, family: llama, adapter: ${join(dir, 'adapter')} }\n`).replace(/chaos:[\s\S]*$/, '')}`,
        'bad.yaml',
      ),
    ).toThrow(/model\.adapter: .*: a PEFT adapter sits on a base model; give that base as model\.from/);
  }, 240_000);

  it("the reference is the policy's base where it shares its layout: not loaded, filled or kept, and the run equals its twin whose reference is a copy, through a kill", async () => {
    const text = (reference: string) => `name: lora-base
seed: 2
task: { name: sort, digits: 4, base: 10 }
model: { layers: 2, width: 16, heads: 2, tied: true, lora: { rank: 2, alpha: 4 } }
cluster: { nodes: 1, devices_per_node: 2 }
algorithm: { name: grpo, group: 4, kl: loss, kl_estimator: k3 }
plan: { actor.train: { mesh: "0:0" }, actor.generate: { mesh: "0:0" }, reference.inference: { mesh: "${reference}" }, reward.inference: { mesh: "0:1" } }
warmup: { steps: 2, demos: 32, batch: 8 }
rl: { iterations: 3, batch: 8, kl_coef: 0.05, lr: 3.0e-3 }
timeouts: { heartbeat_seconds: 3 }
`;
    const shared = parseScenario(`${text('0:0')}chaos: { kills: [{ actor: actor, call: train, iteration: 1 }] }\n`, 'shared.yaml');
    const r = runSpec(shared);
    expect(baseOwnerOf(r, 'reference')).toBe('actor');
    expect(keptModels(r)).toEqual(['actor']);
    const copy = parseScenario(text('0:1'), 'copy.yaml');
    expect(baseOwnerOf(runSpec(copy), 'reference')).toBeUndefined();
    const dir = tempDir();
    const report = await runChaos(shared, join(dir, 'shared'));
    expect(report.chaos.status, report.chaos.error).toBe('succeeded');
    expect(report).toMatchObject({ digests_equal: true, rollouts_lost: 0, rollouts_duplicated: 0 });
    const twin = await launch({ scenario: copy, run: runId('lora-base-copy'), out: join(dir, 'copy'), progress: { phase() {}, iteration() {}, stop() {} }, say: () => {} });
    expect(twin.code).toBe(0);
    // The reference as the policy's adapters-off shards computes what its copy computes, bit for bit.
    const fields = (m: Metrics) => ({ reward: m.reward_mean, kl: m.kl, loss: m.actor_loss });
    const a = jsonl<Metrics>(join(dir, 'shared', 'clean', 'metrics.jsonl')).map(fields);
    const b = jsonl<Metrics>(join(dir, 'copy', 'metrics.jsonl')).map(fields);
    expect(a).toEqual(b);
    expect(a[0]!.kl).toBe(0);
    expect(a.at(-1)!.kl).not.toBe(0);
    const sharedSummary = JSON.parse(readFileSync(join(dir, 'shared', 'clean', 'summary.json'), 'utf8')) as Summary;
    const copySummary = JSON.parse(readFileSync(join(dir, 'copy', 'summary.json'), 'utf8')) as Summary;
    expect(sharedSummary.digests).toEqual(copySummary.digests);
    // Its checkpoint holds no reference of its own; exporting the reference exports the policy's base.
    expect(Object.keys(readResume(join(dir, 'shared', 'clean')).checkpoint)).toEqual(['actor']);
    await exportRun(join(dir, 'shared', 'clean'), { out: join(dir, 'ref'), model: 'reference' });
    await exportRun(join(dir, 'copy'), { out: join(dir, 'ref-copy'), model: 'reference' });
    expect(readFileSync(join(dir, 'ref', 'model.safetensors')).equals(readFileSync(join(dir, 'ref-copy', 'model.safetensors')))).toBe(true);

    // Resumed on a plan that parts them, the shared run fills a reference of its own from the
    // policy's base and goes on as the copy's run goes on: the same digests one iteration later.
    const further = parseScenario(text('0:1').replace('iterations: 3', 'iterations: 4'), 'further.yaml');
    const ends: unknown[] = [];
    for (const from of [join(dir, 'shared', 'clean'), join(dir, 'copy')]) {
      const out = `${from}-further`;
      cpSync(from, out, { recursive: true });
      const resumed = await launch({ scenario: further, run: runId(`further${ends.length}`), out, resume: true, progress: { phase() {}, iteration() {}, stop() {} }, say: () => {} });
      expect(resumed.code, readFileSync(join(out, 'logs', 'supervisor.log'), 'utf8')).toBe(0);
      expect(resumed.summary!.iterations).toBe(4);
      ends.push(resumed.summary!.digests);
    }
    expect(ends[0]).toEqual(ends[1]);
  }, 240_000);
});
