// The LoRA benchmark: GRPO on two tasks, full fine-tuning against LoRA at rank 1 and rank 8 (alpha
// 2·rank, their learning rate `lrScale` times full fine-tuning's: 3 by default, see below), same seeds. Each runs for real over NATS with worker
// processes on a plan that trains on one device and generates on another, so that every iteration
// fills the generation view (what asynchrony's second copy and every reallocation move) and takes
// a snapshot: reward first 5 / last 5, trainable parameters and their share of the weights, bytes
// moved per iteration in the steady state (an iteration's fill and snapshot after the first: what
// does not train moves once), seconds per iteration. Then each runs a few iterations in this
// process on one device (a colocated plan, no warm-up), under tf.profile: the peak bytes of
// tensors the device held.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as tf from '@tensorflow/tfjs';
import type { Metrics } from '../../mesh/wire/index.ts';
import { runId } from '../../mesh/wire/index.ts';
import { baseSpec, parameterShapes, trains, type GptSpec } from '../model/index.ts';
import { median, modelSpec, parseScenario, runSpec, type Scenario, type Summary } from '../runtime/index.ts';
import { launch } from '../cli/launch.ts';
import { runInProcess } from '../supervision/index.ts';

/** The tasks: the quickstart's (sort 4 digits) and count (answers that end, of up to `base` tokens). */
export const LORA_TASKS: Record<string, string> = {
  sort: 'task: { name: sort, digits: 4, base: 10 }',
  count: 'task: { name: count, base: 12 }',
};

export interface LoraVariant {
  name: string;
  rank?: number;
}
export const LORA_VARIANTS: LoraVariant[] = [{ name: 'full' }, { name: 'lora-r1', rank: 1 }, { name: 'lora-r8', rank: 8 }];

function scenarioOf(task: string, v: LoraVariant, o: { width: number; iterations: number; lr: number; lrScale: number; colocated?: boolean }): Scenario {
  // The colocated run measures training's memory: no warm-up (which trains the base, with an
  // optimizer of its own, whatever the variant).
  const warmup = o.colocated ? 'warmup: { steps: 0 }' : 'warmup: { steps: 15, demos: 1024, batch: 32, lr: 3.0e-3 }';
  // LoRA: every linear layer, the head trained whole beside them (PEFT's modules_to_save), alpha
  // 2·rank; its learning rate lrScale times full fine-tuning's. "LoRA Without Regret" found 10×
  // best on large models; on these (width 256) 10× makes rank 8 diverge and 3× matches full
  // fine-tuning at both ranks (docs/lora.md gives the figures).
  const lora = v.rank ? `, lora: { rank: ${v.rank}, alpha: ${2 * v.rank}, modules_to_save: [lm_head] }` : '';
  const plan = o.colocated
    ? 'plan: { actor.train: { mesh: "0:0" }, actor.generate: { mesh: "0:0" }, reference.inference: { mesh: "0:0" }, reward.inference: { mesh: "0:0" } }'
    : 'plan: { actor.train: { mesh: "0:0" }, actor.generate: { mesh: "0:1" }, reference.inference: { mesh: "0:1" }, reward.inference: { mesh: "0:1" } }';
  const text = `name: lora-${task}-${v.name}
seed: 1
backend: wasm
${LORA_TASKS[task]}
model: { layers: 2, width: ${o.width}, heads: 4${lora} }
cluster: { nodes: 1, devices_per_node: 2 }
${plan}
algorithm: { name: grpo, group: 4, kl: loss, kl_estimator: k3 }
${warmup}
rl: { iterations: ${o.iterations}, batch: 16, epochs: 2, minibatches: 2, kl_coef: 0.02, lr: ${v.rank ? o.lrScale * o.lr : o.lr} }
`;
  return parseScenario(text, `bench/lora-${task}-${v.name}.yaml`);
}

/** Trainable parameters of the policy, and their share of the base's weights. */
function trainable(s: Scenario): { trainable: number; weights: number } {
  const spec = modelSpec(runSpec(s), 'actor') as GptSpec;
  const size = (shape: number[]) => shape.reduce((a, b) => a * b, 1);
  const trained = parameterShapes(spec).filter(([n]) => trains(spec, n));
  return { trainable: trained.reduce((n, [, s]) => n + size(s), 0), weights: parameterShapes(baseSpec(spec)).reduce((n, [, s]) => n + size(s), 0) };
}

async function overNats(s: Scenario) {
  const dir = mkdtempSync(join(tmpdir(), 'ferry-lora-'));
  try {
    const r = await launch({ scenario: s, run: runId(s.name!), out: dir, progress: { phase() {}, iteration() {}, stop() {} }, say: () => {} });
    if (r.code !== 0) throw new Error(`${s.name} failed: ${r.summary?.error ?? `exit ${r.code}`}`);
    const metrics = readFileSync(join(dir, 'metrics.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Metrics);
    const summary = JSON.parse(readFileSync(join(dir, 'summary.json'), 'utf8')) as Summary;
    // Steady state: after the first iteration, whose fill and snapshot carry what does not train.
    // The last snapshot's bytes, spread over the iterations between snapshots.
    const every = s.checkpoint.every;
    const snapshotBytes = every > 0 ? (summary.snapshots?.bytes ?? 0) / every : 0;
    const steady = metrics.slice(1);
    return {
      reward_first5: summary.reward_first5,
      reward_last5: summary.reward_last5,
      realloc_bytes_per_iteration: median(steady.map((m) => m.realloc_bytes))!,
      first_realloc_bytes: metrics[0]!.realloc_bytes,
      snapshot_bytes_per_iteration: snapshotBytes,
      snapshot_total_bytes: summary.snapshots?.total_bytes ?? 0,
      seconds_per_iteration: median(steady.map((m) => m.seconds))!,
    };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Peak bytes of tensors while the scenario runs on one device, in this process. */
async function peakTensorBytes(s: Scenario): Promise<number> {
  const spec = runSpec(s);
  let failed: string | undefined;
  // tf.profile's peak counts what the process held before the run: the peak is taken above it.
  const before = tf.memory().numBytes;
  const profile = await tf.profile(async () => {
    await runInProcess(spec, { phase() {}, iteration() {}, finished: (x) => (failed = x.status === 'failed' ? x.error : undefined) }, 'wasm');
  });
  if (failed) throw new Error(`${s.name} (colocated) failed: ${failed}`);
  return profile.peakBytes - before;
}

export async function loraBench(o: { width: number; iterations: number; memoryIterations: number; lr: number; lrScale: number; tasks: string[] }, log: (line: string) => void) {
  const rows: Array<
    Awaited<ReturnType<typeof overNats>> & ReturnType<typeof trainable> & { task: string; variant: string; trainable_share: number; bytes_per_iteration: number; colocated_peak_tensor_mb: number }
  > = [];
  for (const task of o.tasks) {
    for (const v of LORA_VARIANTS) {
      const s = scenarioOf(task, v, o);
      const counts = trainable(s);
      const run = await overNats(s);
      const peak = await peakTensorBytes(scenarioOf(task, v, { ...o, iterations: o.memoryIterations, colocated: true }));
      const row = {
        task,
        variant: v.name,
        ...counts,
        trainable_share: counts.trainable / counts.weights,
        ...run,
        bytes_per_iteration: run.realloc_bytes_per_iteration + run.snapshot_bytes_per_iteration,
        colocated_peak_tensor_mb: peak / 2 ** 20,
      };
      log(
        `  ${task.padEnd(5)} ${v.name.padEnd(7)} reward ${row.reward_first5?.toFixed(3)} -> ${row.reward_last5?.toFixed(3)}, trainable ${row.trainable} (${(100 * row.trainable_share).toFixed(2)}%), ` +
          `bytes/it ${Math.round(row.bytes_per_iteration)} (fills ${Math.round(row.realloc_bytes_per_iteration)}, snapshots ${Math.round(row.snapshot_bytes_per_iteration)}), ${row.seconds_per_iteration.toFixed(3)} s/it, colocated peak ${row.colocated_peak_tensor_mb.toFixed(1)} MB of tensors`,
      );
      rows.push(row);
    }
  }
  const ratios = o.tasks.map((task) => {
    const of = (name: string) => rows.find((r) => r.task === task && r.variant === name)!;
    const full = of('full');
    return {
      task,
      r8_last5_gap: (of('lora-r8').reward_last5 ?? NaN) - (full.reward_last5 ?? NaN),
      r1_bytes_share: of('lora-r1').bytes_per_iteration / full.bytes_per_iteration,
      r8_bytes_share: of('lora-r8').bytes_per_iteration / full.bytes_per_iteration,
      r8_trainable_share: of('lora-r8').trainable_share,
      r8_memory_ratio: of('lora-r8').colocated_peak_tensor_mb / full.colocated_peak_tensor_mb,
      r8_seconds_ratio: of('lora-r8').seconds_per_iteration / full.seconds_per_iteration,
    };
  });
  return { bench: 'lora', width: o.width, iterations: o.iterations, lr: o.lr, lr_scale: o.lrScale, rows, ratios };
}
