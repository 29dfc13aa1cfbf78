// npm run bench -- continuous: a long-tail task (scenarios/continuous.yaml: count in base 32, so
// responses of 1 to 33 tokens) beside a reward actor that takes a fixed time per request
// (examples/reward-actor/ascending.mjs --delay-ms), over NATS with worker processes, the same 2
// devices and plan for every run, one run after the other: lock-step, rl.lag 1, and continuous
// generation (rl.slots, at lag 1), and continuous generation free-running within one update with
// in-flight weight updates (rl.staleness 1, rl.inflight). Prints, per run: seconds per iteration (the wall time per
// update, from the end of the second update to the end of the last: the first two left out, set-up and the first ahead
// generation; and the median of the iterations' own seconds, which a pipelined run's overlap makes shorter than its
// period), generated tokens per second, each call's device time per iteration (what bounds the period), the rollout
// device's idle share (1 − the time it spent in calls over the measured iterations' time, from
// the run's timeline) and the training device's, reward first 5 / last 5, the rollouts' staleness (mean, max) and, in
// flight, the tokens' (mean, max) and the switches, and how many of the machine's cores were busy
// over the measured iterations (all processes: workers, supervisor, nats-server, reward actor; from
// /proc/stat): where a run keeps them all busy, no schedule of the same work goes faster here.
// Then each run's speedup over lock-step and over lag 1, and the most any of them could be: the
// asynchronous runs' periods down to the least work an iteration their training device did.
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Metrics } from '../../mesh/wire/index.ts';
import { runId, startNatsServer } from '../../mesh/wire/index.ts';
import { Evaluator, candidateOf, loadLocalProfile, loadScenarioFile, localProfileFile, problemOf, switchCount, type Scenario } from '../runtime/index.ts';
import { launch } from '../cli/launch.ts';

export interface ContinuousRow {
  run: string;
  lag: number;
  slots: number;
  /** The period: wall seconds per update over the measured iterations (the run's throughput, whatever overlaps what). */
  seconds_per_iteration: number;
  /** The median of the iterations' own seconds (the supervisor's time in each; a pipelined run's differ from its period). */
  median_iteration_seconds: number;
  tokens_per_second: number;
  rollout_idle: number;
  /** The same of the devices that train (and infer for training: the proximal policy's pass). */
  train_idle: number;
  /** The training devices' work an iteration (their calls' device seconds): no schedule of the rollout side makes a period shorter. */
  train_seconds_per_iteration: number;
  reward_first5: number | null;
  reward_last5: number | null;
  staleness_mean: number;
  staleness_max: number;
  /** In flight: the response tokens' staleness (the mean of the iterations' means, the most), and the generations that switched version. */
  token_staleness_mean?: number;
  token_staleness_max?: number;
  switches?: number;
  /** The machine's cores busy on average over the measured iterations (NaN without /proc/stat). */
  cores_busy: number;
  /** Each call's device milliseconds per iteration, `device:model.fn`, the most first. */
  device_ms_per_iteration: Record<string, number>;
  /** The planner's estimate of the period on this plan with this machine's profile (in flight: within η at its steady state, with its switch's pause). */
  estimated_seconds_per_iteration: number;
}

/** The machine's busy and total CPU time so far (jiffies, all cores), or undefined without /proc/stat. */
function machineCpu(): { busy: number; total: number } | undefined {
  if (!existsSync('/proc/stat')) return undefined;
  const fields = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1).map(Number);
  const total = fields.reduce((a, b) => a + b, 0);
  // idle and iowait are the 4th and 5th.
  return { busy: total - fields[3]! - (fields[4] ?? 0), total };
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');

export async function continuousBench(o: { file?: string; iterations?: number; slots?: number; rewardDelayMs: number; log: (line: string) => void }) {
  const loaded = await loadScenarioFile(o.file ?? 'scenarios/continuous.yaml');
  const slots = o.slots ?? (loaded.rl.slots || 16);
  const actor = { name: 'ascending', weight: 0.5, timeout_seconds: 30, retries: 2, wait_seconds: 30, seconds: o.rewardDelayMs / 1000 };
  const base: Scenario = { ...loaded, reward: { ...loaded.reward, weight: 0.5, actors: [actor] }, rl: { ...loaded.rl, iterations: o.iterations ?? loaded.rl.iterations } };
  const rollout = new Set(Object.entries(base.plan ?? {}).flatMap(([call, p]) => (call.endsWith('.generate') ? devicesOf(p.mesh) : [])));
  const training = new Set(Object.entries(base.plan ?? {}).flatMap(([call, p]) => (call.endsWith('.train') ? devicesOf(p.mesh) : [])));
  const server = await startNatsServer();
  const reward = spawn(process.execPath, [join(ROOT, 'examples/reward-actor/ascending.mjs'), '--nats', server.url, '--delay-ms', String(o.rewardDelayMs)], { stdio: 'ignore' });
  const profileFile = localProfileFile();
  const local = profileFile ? loadLocalProfile(profileFile) : undefined;
  const rows: ContinuousRow[] = [];
  // The machine's CPU, sampled as the runs go, to read it over each run's measured window.
  const samples: Array<{ at: number; busy: number; total: number }> = [];
  const sample = () => {
    const c = machineCpu();
    if (c) samples.push({ at: Date.now(), ...c });
  };
  const sampler = setInterval(sample, 50);
  try {
    rows.push(await once('lock-step', 0, 0));
    rows.push(await once('lag 1', 1, 0));
    rows.push(await once(`continuous (${slots} slots, lag 1)`, 1, slots));
    rows.push(await once(`continuous in flight (${slots} slots, η 1)`, 0, slots, true));
  } finally {
    clearInterval(sampler);
    reward.kill('SIGTERM');
    await server.stop();
  }
  const [sync, lagged, continuous, inflight] = rows as [ContinuousRow, ContinuousRow, ContinuousRow, ContinuousRow];
  const over = (a: ContinuousRow, b: ContinuousRow) => b.seconds_per_iteration / a.seconds_per_iteration;
  const out = {
    rows,
    reward_delay_ms: o.rewardDelayMs,
    speedup_lag1_over_lockstep: over(lagged, sync),
    speedup_continuous_over_lockstep: over(continuous, sync),
    speedup_continuous_over_lag1: over(continuous, lagged),
    speedup_inflight_over_lockstep: over(inflight, sync),
    speedup_inflight_over_lag1: over(inflight, lagged),
    /**
     * The most any asynchronous run here could be over lock-step and over lag 1: their periods
     * down to the least training work an iteration any of them measured.
     */
    bound_over_lockstep: 0,
    bound_over_lag1: 0,
    /** The planner's speedups of continuous generation (lag 1) over lock-step and over lag 1, and how far each is from the measured one. */
    estimated_speedup_continuous_over_lockstep: sync.estimated_seconds_per_iteration / continuous.estimated_seconds_per_iteration,
    estimated_speedup_continuous_over_lag1: lagged.estimated_seconds_per_iteration / continuous.estimated_seconds_per_iteration,
    estimate_error_over_lockstep: 0,
    estimate_error_over_lag1: 0,
    profile: profileFile ?? null,
  };
  const least = Math.min(lagged.train_seconds_per_iteration, continuous.train_seconds_per_iteration, inflight.train_seconds_per_iteration);
  out.bound_over_lockstep = sync.seconds_per_iteration / least;
  out.bound_over_lag1 = lagged.seconds_per_iteration / least;
  out.estimate_error_over_lockstep = Math.abs(out.estimated_speedup_continuous_over_lockstep - out.speedup_continuous_over_lockstep) / out.speedup_continuous_over_lockstep;
  out.estimate_error_over_lag1 = Math.abs(out.estimated_speedup_continuous_over_lag1 - out.speedup_continuous_over_lag1) / out.speedup_continuous_over_lag1;
  o.log(
    `speedups (s/iteration): lag 1 ${out.speedup_lag1_over_lockstep.toFixed(2)}× lock-step; continuous ${out.speedup_continuous_over_lockstep.toFixed(2)}× lock-step, ${out.speedup_continuous_over_lag1.toFixed(2)}× lag 1; in flight ${out.speedup_inflight_over_lockstep.toFixed(2)}× lock-step, ${out.speedup_inflight_over_lag1.toFixed(2)}× lag 1`,
  );
  o.log(
    `the training device's work an iteration, at least ${(1000 * least).toFixed(0)} ms: no schedule of the rollout side makes a run here more than ${out.bound_over_lockstep.toFixed(2)}× lock-step or ${out.bound_over_lag1.toFixed(2)}× lag 1`,
  );
  o.log(
    `the planner's (${profileFile ?? 'no profile'}): continuous ${out.estimated_speedup_continuous_over_lockstep.toFixed(2)}× lock-step (${(100 * out.estimate_error_over_lockstep).toFixed(1)}% off), ${out.estimated_speedup_continuous_over_lag1.toFixed(2)}× lag 1 (${(100 * out.estimate_error_over_lag1).toFixed(1)}% off)`,
  );
  return out;

  async function once(name: string, lag: number, slots: number, inflight = false): Promise<ContinuousRow> {
    const scenario: Scenario = { ...base, name: `${base.name}-${lag}-${slots}${inflight ? '-inflight' : ''}`, rl: { ...base.rl, lag, slots, staleness: inflight ? 1 : 0, inflight } };
    // The planner prices a free-running run at its steady state within η (lag η's period), in flight with its switch's pause.
    const estimated = new Evaluator(problemOf(scenario, local)).evaluate(candidateOf(scenario)).iterationSeconds;
    const dir = mkdtempSync(join(tmpdir(), `ferry-bench-continuous-`));
    const run = await launch({
      scenario,
      run: runId(`bench-cont-${lag}-${slots}`),
      out: dir,
      natsUrl: server.url,
      progress: { phase() {}, iteration() {}, stop() {} },
      say: () => {},
      workers: undefined,
    });
    if (run.code !== 0 || !run.summary) throw new Error(`the run '${name}' failed: ${run.summary?.error ?? `exit ${run.code}`} (logs in ${dir})`);
    const history = readFileSync(join(dir, 'metrics.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Metrics);
    const measured = history.slice(2);
    // The rollout device's calls in the measured iterations, from the run's timeline.
    const spans = readFileSync(join(dir, 'timeline.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { type: string; model?: string; fn?: string; device?: number; iteration?: number; sent?: number; replied?: number; device_ms?: number });
    // The period: wall time from the end of the last update before the measured iterations to the end of the last, per update.
    const updateEnd = (i: number) => Math.max(...spans.filter((s) => s.type === 'call' && s.fn === 'train' && s.iteration === i).map((s) => s.replied!));
    const period = (updateEnd(history.length - 1) - updateEnd(1)) / 1000 / (history.length - 2);
    if (history.length < 3) throw new Error(`the run '${name}': ${history.length} iterations; the period is read from the third on (logs in ${dir})`);
    if (!(Number.isFinite(period) && period > 0))
      throw new Error(`the run '${name}': its timeline has no train call for iteration 1 or ${history.length - 1}, so no period can be read (logs in ${dir})`);
    const calls = spans.filter((s) => s.type === 'call' && rollout.has(s.device!) && s.iteration! >= 2 && s.iteration! < history.length);
    const from = Math.min(...calls.map((s) => s.sent!));
    const to = Math.max(...calls.map((s) => s.replied!));
    const busy = calls.reduce((a, s) => a + s.device_ms!, 0) / rollout.size;
    const trainBusy = spans.filter((s) => s.type === 'call' && training.has(s.device!) && s.iteration! >= 2 && s.iteration! < history.length).reduce((a, s) => a + s.device_ms!, 0) / training.size;
    // Each call's device time per measured iteration, by device, model and function (a second view of a model, `~1`, as the first).
    const perCall: Record<string, number> = {};
    for (const c of spans.filter((s) => s.type === 'call' && s.iteration! >= 2 && s.iteration! < history.length)) {
      const key = `${c.device}:${c.model!.replace(/~\d+$/, '')}.${c.fn}`;
      perCall[key] = (perCall[key] ?? 0) + c.device_ms! / measured.length;
    }
    const staleness = history.map((m) => (typeof m.staleness === 'number' ? m.staleness : 0));
    const at = (t: number) => samples.reduce((best, x) => (Math.abs(x.at - t) < Math.abs(best.at - t) ? x : best), samples[0] ?? { at: t, busy: 0, total: 0 });
    const [c0, c1] = [at(from), at(to)];
    const coresBusy = c1.total > c0.total ? ((c1.busy - c0.busy) / (c1.total - c0.total)) * cpus().length : Number.NaN;
    const row: ContinuousRow = {
      run: name,
      lag,
      slots,
      seconds_per_iteration: period,
      median_iteration_seconds: median(measured.map((m) => m.seconds)),
      tokens_per_second: measured.reduce((a, m) => a + m.tokens, 0) / (period * measured.length),
      rollout_idle: Math.max(0, 1 - busy / Math.max(1, to - from)),
      train_idle: Math.max(0, 1 - trainBusy / Math.max(1, to - from)),
      train_seconds_per_iteration: trainBusy / 1000 / measured.length,
      reward_first5: run.summary.reward_first5,
      reward_last5: run.summary.reward_last5,
      staleness_mean: staleness.reduce((a, b) => a + b, 0) / staleness.length,
      staleness_max: Math.max(...staleness),
      cores_busy: coresBusy,
      device_ms_per_iteration: Object.fromEntries(Object.entries(perCall).sort((a, b) => b[1] - a[1])),
      estimated_seconds_per_iteration: estimated,
      ...(inflight
        ? {
            token_staleness_mean: run.summary.staleness?.tokens?.mean ?? 0,
            token_staleness_max: run.summary.staleness?.tokens?.max ?? 0,
            switches: switchCount(run.summary.staleness),
          }
        : {}),
    };
    o.log(
      `${name}: ${row.seconds_per_iteration.toFixed(3)} s/iteration (wall per update; estimated ${row.estimated_seconds_per_iteration.toFixed(3)}; the iterations' median ${row.median_iteration_seconds.toFixed(3)}), ${row.tokens_per_second.toFixed(0)} generated tokens/s, rollout device idle ${(100 * row.rollout_idle).toFixed(1)}%, training device idle ${(100 * row.train_idle).toFixed(1)}%, ${row.cores_busy.toFixed(2)} of ${cpus().length} cores busy, reward ${row.reward_first5?.toFixed(3)} -> ${row.reward_last5?.toFixed(3)}, staleness mean ${row.staleness_mean.toFixed(2)} max ${row.staleness_max}${inflight ? `, tokens' staleness mean ${row.token_staleness_mean!.toFixed(2)} max ${row.token_staleness_max}, ${row.switches} generations switched version in flight` : ''}`,
    );
    o.log(
      `  device ms per iteration: ${Object.entries(row.device_ms_per_iteration)
        .filter(([, ms]) => ms >= 1)
        .map(([k, ms]) => `${k} ${ms.toFixed(0)}`)
        .join(', ')}`,
    );
    rmSync(dir, { recursive: true, force: true });
    return row;
  }
}

/** The devices of a mesh written as "node:first[-last]" (one node). */
function devicesOf(mesh: string): number[] {
  const [, range] = mesh.split(':');
  const [lo, hi] = range!.split('-').map(Number);
  return Array.from({ length: (hi ?? lo!) - lo! + 1 }, (_, i) => lo! + i);
}
