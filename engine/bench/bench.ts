// npm run bench -- NAME [--json] [options]
// Benchmarks print figures measured in one run, and ratios between them; nothing here asserts
// a time. Benchmarks:
//   iteration  the quickstart's tokens per second, over NATS with worker processes, and the ratio
//              of that run's seconds per iteration to the same computation in one process
//   realloc    a model of at least 64 MiB moved between two layouts across worker processes,
//              against raw NATS publishes of the same bytes between the same processes
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { UsageError, args, runMain } from '../../actors/host.ts';
import { runInProcess } from '../supervision/index.ts';
import type { Metrics } from '../../mesh/wire/index.ts';
import { DIGEST_ALGORITHMS, runId } from '../../mesh/wire/index.ts';
import { initBackend } from '../model/index.ts';
import { median, type Summary } from '../runtime/index.ts';
import { runSpec } from '../runtime/index.ts';
import { loadScenarioFile, type Scenario } from '../runtime/index.ts';
import type { Layout } from '../../mesh/parallel/index.ts';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import type { DeviceProfile } from '../runtime/index.ts';
import { LOCAL_PROFILE, loadLocalProfile } from '../runtime/index.ts';
import { ESTIMATOR_TASKS, estimatorBench, PLANS, searchBench } from './bench-estimator.ts';
import { LORA_TASKS, loraBench } from './bench-lora.ts';
import { reallocBench } from './bench-realloc.ts';
import { computeBench } from './bench-compute.ts';
import { generateBench } from './bench-generate.ts';
import { envBench } from './bench-env.ts';
import { asyncBench } from './bench-async.ts';
import { continuousBench } from './bench-continuous.ts';
import { checkpointBench } from './bench-checkpoint.ts';
import { snapshotBench } from './bench-snapshot.ts';
import { snapshotWrites } from './bench-snapshot-writes.ts';
import { searchQualityBench } from './bench-search-quality.ts';
import { runChaos } from '../cli/chaos-run.ts';
import { profileLocal } from '../cli/profile.ts';
import { launch } from '../cli/launch.ts';

const USAGE = `usage: npm run bench -- NAME [--json] [options]
  iteration [--scenario FILE] [--iterations N]   tokens/s over NATS, and the ratio to one process
  realloc [--width W] [--layers L] [--repeats R]  reallocation MB/s against raw NATS, bytes, memory
  estimator [--iterations N] [--profile] [--task sort|count] [--repeats N]
                                                planner estimates against measured runs of 6 local plans, each the median of N runs (3)
  lora [--iterations N] [--width W] [--task sort|count] [--lr-scale X]
                                                GRPO, full fine-tuning against LoRA rank 1 and 8 (lr ×X, 3): reward first 5 -> last 5, trainable
                                                share, bytes per iteration (fills and snapshots), s/iteration, colocated peak tensor memory
  search [--iterations N] [--budget S]          measured: the best named placement against the search's plan
  search-quality [--budget S] [--reference S] [--seeds N] [--scenario FILE]
                                                estimated: searches of 10 s (5 seeds) against one of 120 s, per cluster scenario
  chaos [--kills N] [--seed S] [--iterations N] [--scenario FILE]
                                                the soak: N random kills (10% hangs) of every actor kind,
                                                against the clean run (default 50 kills, scenarios/chaos.yaml)
  compute [--repeats N]                         GFLOP/s of a plain matrix product (the reference), and of a 4-layer, width-256
                                                model's forward pass and training step on one device and on tp=2, as shares of it
  algorithms [--iterations N]                   every algorithm's scenario (quickstart for ppo, scenarios/algorithms/
                                                for the others) over NATS: s/iteration, tokens/s, reward first 5 -> last 5
  generate [--budget N]                         a 4-layer, width-256 model samples 16 responses of 16, 64, 256 and N tokens (1024), with
                                                the KV cache, and without it up to 256: tokens/s, speedup, growth of the time per token
  env [--repeats N]                             32 episodes of 4 turns (actions of 12 tokens) against an environment in its own process answering after
                                                0, 20 and 100 ms, in groups of 8, in lock-step and in 8 and 32 slots, then calls of 128 episodes at
                                                100 ms: episodes/s and the device's idle share
  async [--iterations N] [--delay-ms D]        scenarios/async.yaml lock-step and with rl.lag 1, each on the planner's plan for it, over
                                                NATS, with a reward actor that takes D ms per request (100): s/iteration (median), the
                                                speedup against the planner's estimate, reward first 5 -> last 5, the staleness
  continuous [--iterations N] [--delay-ms D] [--slots S]
                                                scenarios/continuous.yaml (count in base 32: responses of 1 to 33 tokens) lock-step,
                                                with rl.lag 1, generated continuously (rl.slots, lag 1), and continuously within η 1
                                                with in-flight weight updates (rl.inflight), over NATS, with a reward actor of D ms a
                                                request (100): s/iteration, tokens/s, the rollout device's idle share, reward first 5 ->
                                                last 5, staleness (in flight, the tokens' too), and the speedups
  checkpoint                                    a SmolLM-135M-shaped llama checkpoint written in F32 and BF16, read back,
                                                loaded on one rank from its directory, and 8 tokens decoded: sizes and seconds
  snapshot [--iterations N] [--sync S]          a snapshot after every iteration, the actor pipelined over 1, 2 and 4 devices (two layers
                                                a stage) at widths 64 and 128: seconds and bytes per snapshot, and how they grow with
                                                devices and with the bytes a device holds`;

/** The scenario of each built-in algorithm: the quickstart for PPO, scenarios/algorithms/<name>.yaml for the others. */
export const ALGORITHM_SCENARIOS: Record<string, string> = {
  ppo: 'scenarios/quickstart.yaml',
  ...Object.fromEntries(['grpo', 'rloo', 'remax', 'reinforce_pp', 'dpo', 'gspo', 'cispo', 'decoupled'].map((a) => [a, `scenarios/algorithms/${a}.yaml`])),
};

const quiet = { phase() {}, iteration() {}, stop() {} };

function rate(history: readonly Metrics[]) {
  const seconds = history.reduce((a, m) => a + m.seconds, 0);
  const tokens = history.reduce((a, m) => a + m.tokens, 0);
  return { tokens_per_second: tokens / seconds, seconds_per_iteration: median(history.map((m) => m.seconds))! };
}

async function iterationBench(scenario: Scenario) {
  const dir = mkdtempSync(join(tmpdir(), 'ferry-bench-'));
  try {
    const t0 = performance.now();
    const bus = await launch({ scenario, run: runId(`bench-${scenario.name}`), out: dir, progress: quiet, say: () => {}, workers: undefined });
    const busWall = (performance.now() - t0) / 1000;
    if (bus.code !== 0 || !bus.summary) throw new Error(`the run over NATS failed: ${bus.summary?.error ?? `exit ${bus.code}`} (logs in ${dir})`);
    const busHistory = readFileSync(join(dir, 'metrics.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Metrics);

    const backend = await initBackend(scenario.backend);
    const local: Metrics[] = [];
    let localSummary: Summary | undefined;
    const t1 = performance.now();
    await runInProcess(runSpec(scenario), { phase() {}, iteration: (m) => local.push(m), finished: (s) => (localSummary = s) }, backend);
    const localWall = (performance.now() - t1) / 1000;

    const b = rate(busHistory);
    const l = rate(local);
    return {
      bench: 'iteration',
      scenario: scenario.name,
      iterations: busHistory.length,
      backend: bus.summary.backend,
      tokens_per_second: b.tokens_per_second,
      tokens_per_second_in_process: l.tokens_per_second,
      seconds_per_iteration: b.seconds_per_iteration,
      seconds_per_iteration_in_process: l.seconds_per_iteration,
      /** > 1: the bus and processes cost more than they gain from running models side by side. */
      overhead_ratio: b.seconds_per_iteration / l.seconds_per_iteration,
      wall_seconds: busWall,
      wall_seconds_in_process: localWall,
      /** Per call over NATS: round trip minus the device's own time (encoding, the bus, queueing). */
      bus_ms_per_call: bus.summary.transport ? ((bus.summary.transport.round_trip_seconds - bus.summary.transport.device_seconds) / bus.summary.transport.calls) * 1000 : null,
      bus_share_of_call_time: bus.summary.transport ? 1 - bus.summary.transport.device_seconds / bus.summary.transport.round_trip_seconds : null,
      digests_equal: JSON.stringify(bus.summary.digests) === JSON.stringify(localSummary?.digests),
      reward_first5: bus.summary.reward_first5,
      reward_last5: bus.summary.reward_last5,
    };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

runMain(async () => {
  if (process.argv[2] === 'search-quality') return searchQualityBench(); // it parses its own options
  const { values, positionals } = args(USAGE, {
    json: { type: 'boolean', default: false },
    scenario: { type: 'string' },
    kills: { type: 'string', default: '50' },
    seed: { type: 'string', default: '1' },
    iterations: { type: 'string' },
    width: { type: 'string', default: '512' },
    profile: { type: 'boolean', default: false },
    budget: { type: 'string' },
    layers: { type: 'string', default: '6' },
    repeats: { type: 'string', default: '3' },
    task: { type: 'string', default: 'sort' },
    'delay-ms': { type: 'string', default: '100' },
    sync: { type: 'string' },
    'lr-scale': { type: 'string' },
    slots: { type: 'string' },
  });
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  const name = positionals[0];
  if (name === 'realloc') return realloc(values);
  if (name === 'estimator') return estimator(values);
  if (name === 'lora') return lora(values);
  if (name === 'search') return searchPlans(values);
  if (name === 'chaos') return chaosSoak(values);
  if (name === 'algorithms') return algorithmsBench(values);
  if (name === 'compute') return compute(values);
  if (name === 'generate') return generate({ ...values, budget: values.budget ?? '1024' });
  if (name === 'env') {
    const log = values.json ? () => {} : (line: string) => console.log(line);
    const backend = await initBackend('auto');
    log(`bench env on ${backend}: a 4-layer, width-256 model plays 32 episodes of 4 turns of 12 tokens; medians of ${values.repeats} calls`);
    const rows = await envBench({ latencies: [0, 20, 100], episodes: 32, groups: [8, 32], slots: [8, 32], more: 128, repeats: whole('repeats', values.repeats, 1), log });
    if (values.json) console.log(JSON.stringify({ backend, rows }));
    return 0;
  }
  if (name === 'async') {
    const log = values.json ? () => {} : (line: string) => console.log(line);
    const r = await asyncBench({
      ...(values.scenario ? { file: values.scenario } : {}),
      ...(values.iterations !== undefined ? { iterations: whole('iterations', values.iterations, 3) } : {}),
      rewardDelayMs: whole('delay-ms', values['delay-ms'], 0),
      log,
    });
    if (values.json) console.log(JSON.stringify(r));
    return 0;
  }
  if (name === 'continuous') {
    const log = values.json ? () => {} : (line: string) => console.log(line);
    const r = await continuousBench({
      ...(values.scenario ? { file: values.scenario } : {}),
      ...(values.slots !== undefined ? { slots: whole('slots', values.slots, 1) } : {}),
      ...(values.iterations !== undefined ? { iterations: whole('iterations', values.iterations, 3) } : {}),
      rewardDelayMs: whole('delay-ms', values['delay-ms'], 0),
      log,
    });
    if (values.json) console.log(JSON.stringify(r));
    return 0;
  }
  if (name === 'snapshot') {
    const log = values.json ? () => {} : (line: string) => console.log(line);
    log('bench snapshot: GRPO, actor and reference pipelined over 1, 2 and 4 devices (two layers a stage), widths 64 and 128, a snapshot after every iteration');
    const r = await snapshotBench({
      ...(values.iterations !== undefined ? { iterations: whole('iterations', values.iterations, 2) } : {}),
      ...(values.sync !== undefined ? { sync: values.sync } : {}),
      log,
    });
    if (!values.json) {
      log(
        `4 devices against 1: ${r.bytes_ratio_devices?.toFixed(2)}× the bytes a snapshot, ${r.bytes_per_device_ratio_devices?.toFixed(2)}× the bytes a device, ${r.seconds_ratio_devices?.toFixed(2)}× the seconds (each device writes its own part)`,
      );
      log(`width 128 against 64: ${r.bytes_ratio_size?.toFixed(2)}× the bytes a device holds, ${r.seconds_ratio_size?.toFixed(2)}× the seconds`);
      log(`through the supervisor's process: at most ${r.bytes_via_supervisor_max} bytes a snapshot (its manifest)`);
      log(
        `the devices' writes together: ${r.write_rate_ratio_devices?.toFixed(2)}× the rate with 4 devices as with 1 (1 would be a single writer's rate shared; 4 devices writing in parallel at full speed would be 4)`,
      );
    }
    log('the writes alone (no training between), width 128, 5 rounds each:');
    const w = await snapshotWrites({ devices: [1, 2, 4], width: 128, rounds: 5, log });
    if (values.json) console.log(JSON.stringify({ ...r, writes: w }));
    else
      log(
        `4 devices against 1: ${w.seconds_ratio.toFixed(2)}× the seconds = ${w.cpu_ratio.toFixed(2)}× the CPU ÷ ${w.busy_ratio.toFixed(2)}× the cores busy (${w.rows.at(-1)!.cores_busy.toFixed(2)} of ${w.cores}): flat needs the cores busy to grow as the CPU does`,
      );
    return 0;
  }
  if (name === 'checkpoint') {
    const r = await checkpointBench(values.json ? () => {} : (line) => console.log(line));
    if (values.json) console.log(JSON.stringify(r));
    return 0;
  }
  if (name !== 'iteration')
    throw new UsageError(
      `unknown benchmark ${JSON.stringify(name ?? '')}; expected: iteration, realloc, estimator, lora, search, search-quality, chaos, algorithms, compute, generate, env, async, continuous, checkpoint, snapshot\n${USAGE}`,
    );
  let scenario = await loadScenarioFile(values.scenario ?? 'scenarios/quickstart.yaml');
  if (values.iterations !== undefined) {
    const n = Number(values.iterations);
    if (!(Number.isInteger(n) && n > 0)) throw new UsageError(`--iterations: expected a whole number > 0, got ${values.iterations}`);
    scenario = { ...scenario, rl: { ...scenario.rl, iterations: n } };
  }
  if (!values.json) console.log(`bench iteration: ${scenario.name}, ${scenario.rl.iterations} iterations, over NATS and then in one process…`);
  const r = await iterationBench(scenario);
  if (values.json) {
    console.log(JSON.stringify(r));
  } else {
    const f = (x: number, d = 2) => x.toFixed(d);
    console.log(`backend                      ${r.backend}`);
    console.log(`tokens/s  (NATS, processes)  ${f(r.tokens_per_second, 0)}`);
    console.log(`tokens/s  (one process)      ${f(r.tokens_per_second_in_process, 0)}`);
    console.log(`s/iteration, median          ${f(r.seconds_per_iteration, 3)} vs ${f(r.seconds_per_iteration_in_process, 3)}`);
    console.log(`overhead ratio (NATS / one process, s/iteration)  ${f(r.overhead_ratio, 3)}`);
    if (r.bus_ms_per_call !== null) {
      console.log(`bus time per call, mean      ${f(r.bus_ms_per_call, 2)} ms (${f(100 * r.bus_share_of_call_time!, 1)}% of call round trips)`);
    }
    console.log(`wall seconds                 ${f(r.wall_seconds, 1)} vs ${f(r.wall_seconds_in_process, 1)}`);
    console.log(`final digests equal          ${r.digests_equal}`);
  }
  return r.digests_equal ? 0 : 1;
});

/**
 * Every algorithm's scenario, one after another, over NATS with worker processes: seconds per
 * iteration (median), generated tokens per second, and the reward of the first and last five
 * iterations (for DPO, the share of pairs ordered as the rule orders them).
 */
async function algorithmsBench(values: { json?: boolean; iterations?: string }): Promise<number> {
  const log = values.json ? () => {} : (line: string) => console.log(line);
  const out: Record<string, { seconds_per_iteration: number; tokens_per_s: number; reward_first5: number | null; reward_last5: number | null }> = {};
  let failed = 0;
  for (const [name, file] of Object.entries(ALGORITHM_SCENARIOS)) {
    let scenario = await loadScenarioFile(file);
    if (values.iterations !== undefined) scenario = { ...scenario, rl: { ...scenario.rl, iterations: whole('iterations', values.iterations, 1) } };
    const dir = mkdtempSync(join(tmpdir(), `ferry-bench-${name}-`));
    try {
      const run = await launch({ scenario, run: runId(`bench-${name}`), out: dir, progress: quiet, say: () => {}, workers: undefined });
      if (run.code !== 0 || !run.summary) {
        failed += 1;
        log(`${name}: failed: ${run.summary?.error ?? `exit ${run.code}`} (logs in ${dir})`);
        continue;
      }
      const history = readFileSync(join(dir, 'metrics.jsonl'), 'utf8')
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l) as Metrics);
      const r = rate(history);
      out[name] = { seconds_per_iteration: r.seconds_per_iteration, tokens_per_s: r.tokens_per_second, reward_first5: run.summary.reward_first5, reward_last5: run.summary.reward_last5 };
      log(
        `${name.padEnd(14)} ${r.seconds_per_iteration.toFixed(3)} s/iteration  ${r.tokens_per_second.toFixed(0).padStart(6)} tokens/s  reward ${run.summary.reward_first5?.toFixed(3)} -> ${run.summary.reward_last5?.toFixed(3)}`,
      );
      rmSync(dir, { recursive: true, force: true });
    } catch (e) {
      failed += 1;
      log(`${name}: ${(e as Error).message} (logs in ${dir})`);
    }
  }
  if (values.json) console.log(JSON.stringify({ algorithms: out }));
  return failed ? 1 : 0;
}

/** The compute benchmark (bench-compute.ts) on the backend the scenarios would use. */
async function compute(values: { json?: boolean; repeats?: string }): Promise<number> {
  const log = values.json ? () => {} : (line: string) => console.log(line);
  const backend = await initBackend('auto');
  log(`bench compute on ${backend}: a plain matrix product, then the model's forward pass and training step`);
  const r = await computeBench({ layers: 4, width: 256, heads: 4, vocab: 256, batch: 16, tokens: 128, repeats: whole('repeats', values.repeats, 1), log });
  if (values.json) console.log(JSON.stringify(r));
  return 0;
}

/** Lengths past this are generated with the cache alone: without it a response costs its length squared. */
const UNCACHED_UP_TO = 256;

/** The generation benchmark (bench-generate.ts) on the backend the scenarios would use. */
async function generate(values: { json?: boolean; budget: string }): Promise<number> {
  const log = values.json ? () => {} : (line: string) => console.log(line);
  const budget = whole('budget', values.budget, 16);
  const backend = await initBackend('auto');
  log(`bench generate on ${backend}: 16 responses per length, with the KV cache and (up to ${UNCACHED_UP_TO} tokens) by running the prefix again for every token`);
  const lengths = [...new Set([16, 64, 256, budget].filter((n) => n <= budget))].sort((a, b) => a - b);
  const r = await generateBench({ layers: 4, width: 256, heads: 4, vocab: 256, batch: 16, promptLen: 16, lengths, uncachedUpTo: UNCACHED_UP_TO, log });
  if (values.json) console.log(JSON.stringify(r));
  else {
    const f = (x: number) => x.toFixed(1);
    log(
      `speedup of the cache: ${Object.entries(r.speedup)
        .map(([k, v]) => `${k} tokens ${f(v)}×`)
        .join(', ')}`,
    );
    log(`growth (time per token at ${Math.max(...lengths)} over at ${Math.min(...lengths)}, with the cache): ${r.growth.toFixed(2)}`);
  }
  return 0;
}

/** The chaos soak: many random kills over a run that reallocates every iteration. */
async function chaosSoak(values: { json?: boolean; kills?: string; seed?: string; iterations?: string; scenario?: string }): Promise<number> {
  const log = values.json ? () => {} : (line: string) => console.log(line);
  const kills = whole('kills', values.kills, 1);
  const seed = whole('seed', values.seed, 0);
  const base = await loadScenarioFile(values.scenario ?? 'scenarios/chaos.yaml');
  const iterations = values.iterations === undefined ? 20 : whole('iterations', values.iterations, 1);
  // Kills come faster here than any real failure would: the intensity must not end the soak.
  const supervision = { ...base.supervision, intensity: Math.max(base.supervision.intensity, 2 * kills) };
  const scenario: Scenario = { ...base, supervision, rl: { ...base.rl, iterations }, chaos: { kills: [], joins: [], random: { kills, seed, hang: 0.1 } } };
  const out = mkdtempSync(join(tmpdir(), 'ferry-soak-'));
  log(`bench chaos: ${scenario.name}, ${iterations} iterations, ${kills} random kills (seed ${seed}), clean and under fire; runs in ${out}`);
  const r = await runChaos(scenario, out, values.json ? () => {} : (line) => (line.startsWith('  chaos:') ? undefined : log(line)));
  if (values.json) {
    console.log(JSON.stringify(r));
  } else {
    const s = (x: number | null) => (x === null ? 'n/a' : `${x.toFixed(2)} s`);
    log(`kills ${r.kills} (${r.hangs} hangs); by actor ${JSON.stringify(r.kills_by_actor)}; by call ${JSON.stringify(r.kills_by_call)}`);
    log(`recovered ${r.recovered} of ${r.kills}; ${r.recoveries} recoveries; ${r.restarts} process restarts`);
    log(`recovery time median ${s(r.recovery_seconds_median)}, max ${s(r.recovery_seconds_max)}`);
    log(`digests equal ${r.digests_equal}; rollouts lost ${r.rollouts_lost}, duplicated ${r.rollouts_duplicated}`);
    log(`wall: clean ${r.clean.wall_seconds.toFixed(1)} s, under fire ${r.chaos.wall_seconds.toFixed(1)} s (ratio ${(r.chaos.wall_seconds / r.clean.wall_seconds).toFixed(2)})`);
  }
  const ok = r.digests_equal && r.rollouts_lost === 0 && r.rollouts_duplicated === 0;
  if (ok) rmSync(out, { recursive: true, force: true });
  return ok ? 0 : 1;
}

function whole(flag: string, value: string | undefined, min: number): number {
  const n = Number(value);
  if (!(Number.isInteger(n) && n >= min)) throw new UsageError(`--${flag}: expected a whole number >= ${min}, got ${value}`);
  return n;
}

async function realloc(values: { json?: boolean; width?: string; layers?: string; repeats?: string }): Promise<number> {
  const width = whole('width', values.width, 8);
  const layers = whole('layers', values.layers, 2);
  if (width % 16 !== 0) throw new UsageError(`--width: expected a multiple of 16 (8 heads, split over tp=2), got ${width}`);
  const log = values.json ? () => {} : (line: string) => console.log(line);
  const from: Layout = { devices: [0, 1], dp: 1, tp: 2, pp: 1 };
  const to: Layout = { devices: [2, 3], dp: 1, tp: 1, pp: 2 };
  log(`bench realloc: tp=2 on devices 0-1 -> pp=2 on devices 2-3`);
  const r = await reallocBench({ width, layers, repeats: whole('repeats', values.repeats, 1), from, to, log });
  if (values.json) {
    console.log(JSON.stringify(r));
  } else {
    const f = (x: number, d = 1) => x.toFixed(d);
    console.log(`reallocation        ${f(r.realloc_mb_s)} MB/s (median of ${r.repeats})`);
    console.log(`raw NATS pub/sub    ${f(r.raw_mb_s)} MB/s, same bytes, same processes`);
    console.log(`ratio               ${f(r.ratio, 2)}`);
    console.log(`bytes / minimum     ${f(r.bytes_ratio, 2)}  (${f(r.minimum_mb)} MB received; ${f(r.published_mb)} MB published)`);
    console.log(
      `where the devices' time went, go to done: ${Object.entries(r.time_shares)
        .map(([k, v]) => `${k} ${f(100 * v, 0)}%`)
        .join(', ')}`,
    );
    const c = r.cpu_per_mb;
    console.log(
      `CPU per MB moved    realloc: server ${f(c.realloc.server_ms_per_mb)} ms + workers ${f(c.realloc.workers_ms_per_mb)} ms, ${f(c.realloc.cores_busy, 2)} of ${c.cores} cores busy; raw: server ${f(c.raw.server_ms_per_mb)} ms + workers ${f(c.raw.workers_ms_per_mb)} ms, ${f(c.raw.cores_busy, 2)} cores busy`,
    );
    for (const a of [r.digests.algorithm, ...DIGEST_ALGORITHMS.filter((x) => x !== r.digests.algorithm)]) {
      const d = r.digests[a];
      console.log(
        `${(a === r.digests.algorithm ? 'digest (used)' : 'digest (before)').padEnd(20)}${d.name} at ${f(d.mb_s, 0)} MB/s (${f(d.ms_per_mb_each_side, 2)} ms per MB), on each side of every byte: with the cores busy, at most a ratio of ${f(d.ratio_ceiling, 2)} even if nothing else cost more than raw NATS`,
      );
    }
    for (const w of r.workers) {
      console.log(
        `worker ${w.device}: peak ${f(w.peak_mb)} MB RSS during the moves; idle ${f(w.idle_mb)} MB, loaded ${f(w.loaded_mb)} MB, so the moves took ${f(w.moving_mb)} MB more (old shard ${f(w.old_shard_mb)} MB, new shard ${f(w.new_shard_mb)} MB); by its own count it held at most ${f(w.held_mb)} MB more (chunks in flight: at most ${f(w.in_flight_bound_mb)} MB)`,
      );
    }
  }
  return r.bytes_ratio === 1 ? 0 : 1;
}

/** The local profile: fitted now if there is none yet (or --profile asks for a new one). */
async function localProfile(refit: boolean, log: (line: string) => void): Promise<DeviceProfile> {
  if (!refit && existsSync(LOCAL_PROFILE)) return loadLocalProfile();
  log('fitting the local profile (npm run profile) …');
  const profile = await profileLocal(log);
  mkdirSync(dirname(LOCAL_PROFILE), { recursive: true });
  writeFileSync(LOCAL_PROFILE, `${JSON.stringify(profile, null, 2)}\n`);
  return profile;
}

async function searchPlans(values: { json?: boolean; iterations?: string; profile?: boolean; budget?: string }): Promise<number> {
  const log = values.json ? () => {} : (line: string) => console.log(line);
  const profile = await localProfile(values.profile ?? false, log);
  const iterations = values.iterations === undefined ? 8 : whole('iterations', values.iterations, 3);
  const budget = Number(values.budget ?? '10');
  if (!(budget > 0)) throw new UsageError(`--budget: expected seconds > 0, got ${values.budget}`);
  log(`bench search: the planner's best named placement and its search's plan, ${iterations} iterations each`);
  const r = await searchBench(profile, iterations, budget, log);
  if (values.json) console.log(JSON.stringify(r));
  else console.log(`measured speed-up of the searched plan over the best named one: ${r.speedup_measured.toFixed(2)}×`);
  return 0;
}

async function lora(values: { json?: boolean; iterations?: string; width?: string; task?: string; 'lr-scale'?: string }): Promise<number> {
  const log = values.json ? () => {} : (line: string) => console.log(line);
  await initBackend('wasm');
  const iterations = values.iterations === undefined ? 30 : whole('iterations', values.iterations, 6);
  // --width and --task have other benchmarks' defaults: this one's are width 256 and both tasks.
  const given = (flag: string) => process.argv.some((a) => a === `--${flag}` || a.startsWith(`--${flag}=`));
  const width = given('width') ? whole('width', values.width, 16) : 256;
  const tasks = given('task') ? [values.task!] : Object.keys(LORA_TASKS);
  for (const t of tasks) if (!(t in LORA_TASKS)) throw new UsageError(`--task: expected one of ${Object.keys(LORA_TASKS).join(', ')}, got ${JSON.stringify(t)}`);
  const lrScale = Number(values['lr-scale'] ?? '3');
  if (!(lrScale > 0)) throw new UsageError(`--lr-scale: expected a positive number, got ${values['lr-scale']}`);
  log(
    `bench lora: GRPO on ${tasks.join(' and ')}, width ${width}, ${iterations} iterations: full fine-tuning (lr 1e-3), LoRA rank 1 and rank 8 (lr ×${lrScale}), over NATS; then 4 iterations each on one device in this process`,
  );
  const r = await loraBench({ width, iterations, memoryIterations: 4, lr: 1e-3, lrScale, tasks }, log);
  for (const x of r.ratios)
    log(
      `${x.task}: rank 8's last-5 reward ${x.r8_last5_gap >= 0 ? '+' : ''}${x.r8_last5_gap.toFixed(3)} against full fine-tuning's; bytes per iteration, rank 1 ${(100 * x.r1_bytes_share).toFixed(2)}% and rank 8 ${(100 * x.r8_bytes_share).toFixed(2)}% of full fine-tuning's (rank 8's trainable share ${(100 * x.r8_trainable_share).toFixed(2)}%); colocated peak tensors ${x.r8_memory_ratio.toFixed(2)}×; seconds per iteration ${x.r8_seconds_ratio.toFixed(2)}×`,
    );
  if (values.json) console.log(JSON.stringify(r));
  return 0;
}

async function estimator(values: { json?: boolean; iterations?: string; profile?: boolean; task?: string; repeats?: string }): Promise<number> {
  const log = values.json ? () => {} : (line: string) => console.log(line);
  const profile = await localProfile(values.profile ?? false, log);
  const iterations = values.iterations === undefined ? 8 : whole('iterations', values.iterations, 3);
  const task = values.task ?? 'sort';
  if (!(task in ESTIMATOR_TASKS)) throw new UsageError(`--task: expected one of ${Object.keys(ESTIMATOR_TASKS).join(', ')}, got ${JSON.stringify(task)}`);
  const repeats = whole('repeats', values.repeats ?? '3', 1);
  log(`bench estimator: ${Object.keys(PLANS).length} plans of the ${task} task, ${iterations} iterations each${repeats > 1 ? `, ${repeats} times` : ''}, over NATS with worker processes`);
  const r = await estimatorBench(profile, iterations, log, task, repeats);
  if (values.json) console.log(JSON.stringify(r));
  else console.log(`median relative error ${(100 * r.median_relative_error!).toFixed(1)}%, worst ${(100 * r.max_relative_error).toFixed(1)}%`);
  return 0;
}
