// npm run bench -- async: lock-step against rl.lag 1, each on the plan the planner chooses for it
// on this machine's profile (searched at that lag: its own split of the devices into a rollout and
// a train pool, or shared ones), one after the other in one run, over NATS with worker processes,
// beside a reward actor that takes a fixed time per request (examples/reward-actor/ascending.mjs
// --delay-ms; the scenario tells the planner that time: reward.actors[].seconds), so that scoring
// is not free. Prints seconds per iteration (median, the first two left out: set-up and the first
// ahead generation), the measured speedup of lag 1 over lag 0 against the planner's estimated
// one, reward first 5 / last 5 of each, and the lagged run's staleness.
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Metrics } from '../../mesh/wire/index.ts';
import { runId, startNatsServer } from '../../mesh/wire/index.ts';
import { evaluationsFor, loadLocalProfile, loadScenarioFile, localProfileFile, planAtLag, poolsOf, ProfileError, type Scenario } from '../runtime/index.ts';
import { launch } from '../cli/launch.ts';

export interface AsyncRow {
  lag: number;
  /** The planner's plan for this lag: call → mesh and strategy. */
  plan: Record<string, string>;
  pools: { rollout: number[]; train: number[]; shared: boolean };
  estimated_seconds_per_iteration: number;
  seconds_per_iteration: number;
  reward_first5: number | null;
  reward_last5: number | null;
  max_staleness: number;
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');

export async function asyncBench(o: {
  file?: string;
  iterations?: number;
  /** The reward actor's time per request. */
  rewardDelayMs: number;
  /** Plan-search budget per lag, seconds of evaluations (search.ts). */
  budget?: number;
  log: (line: string) => void;
}): Promise<{ sync: AsyncRow; lagged: AsyncRow; speedup: number; estimated_speedup: number; estimate_error: number; reward_delay_ms: number; lag: number; max_staleness: number; profile: string }> {
  const loaded = await loadScenarioFile(o.file ?? 'scenarios/async.yaml');
  const profileFile = localProfileFile();
  if (!profileFile) throw new ProfileError('no local device profile: run npm run profile first (the planner prices this machine with it)');
  const local = loadLocalProfile(profileFile);
  const actor = { name: 'ascending', weight: 0.5, timeout_seconds: 30, retries: 2, wait_seconds: 30, seconds: o.rewardDelayMs / 1000 };
  const base: Scenario = { ...loaded, reward: { ...loaded.reward, weight: 0.5, actors: [actor] }, rl: { ...loaded.rl, iterations: o.iterations ?? loaded.rl.iterations } };
  // One server for both runs, where the reward actor serves them.
  const server = await startNatsServer();
  const reward = spawn(process.execPath, [join(ROOT, 'examples/reward-actor/ascending.mjs'), '--nats', server.url, '--delay-ms', String(o.rewardDelayMs)], { stdio: 'ignore' });
  const rows: AsyncRow[] = [];
  try {
    for (const lag of [0, 1]) rows.push(await once(lag));
  } finally {
    reward.kill('SIGTERM');
    await server.stop();
  }
  const [sync, lagged] = rows as [AsyncRow, AsyncRow];
  const speedup = sync.seconds_per_iteration / lagged.seconds_per_iteration;
  const estimated = sync.estimated_seconds_per_iteration / lagged.estimated_seconds_per_iteration;
  const error = Math.abs(estimated - speedup) / speedup;
  o.log(`speedup of lag 1 over lag 0 (s/iteration): ${speedup.toFixed(2)} measured, ${estimated.toFixed(2)} estimated by the planner (${(error * 100).toFixed(1)}% off)`);
  return {
    sync,
    lagged,
    speedup,
    estimated_speedup: estimated,
    estimate_error: error,
    reward_delay_ms: o.rewardDelayMs,
    lag: lagged.lag,
    max_staleness: lagged.max_staleness,
    profile: profileFile,
  };

  async function once(lag: number): Promise<AsyncRow> {
    // The planner's own plan for this lag, on this machine's profile.
    const at: Scenario = { ...base, rl: { ...base.rl, lag, staleness: 0 } };
    const planned = planAtLag(at, lag, { local, search: { evaluations: evaluationsFor(o.budget ?? 2), seed: 1 } });
    const plan = Object.fromEntries(Object.entries(planned.plan).map(([call, p]) => [call, { mesh: p.mesh, dp: p.dp, tp: p.tp, pp: p.pp }]));
    const scenario: Scenario = { ...at, name: `${base.name}-lag${lag}`, plan };
    const dir = mkdtempSync(join(tmpdir(), `ferry-bench-async-${lag}-`));
    const run = await launch({ scenario, run: runId(`bench-async-${lag}`), out: dir, natsUrl: server.url, progress: { phase() {}, iteration() {}, stop() {} }, say: () => {}, workers: undefined });
    if (run.code !== 0 || !run.summary) throw new Error(`the run with rl.lag ${lag} failed: ${run.summary?.error ?? `exit ${run.code}`} (logs in ${dir})`);
    const history = readFileSync(join(dir, 'metrics.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Metrics);
    const row: AsyncRow = {
      lag,
      plan: Object.fromEntries(Object.entries(plan).map(([call, p]) => [call, `${p.mesh} ${p.dp}/${p.tp}/${p.pp}`])),
      pools: poolsOf(planned.problem, planned.plan),
      estimated_seconds_per_iteration: planned.evaluation.iterationSeconds,
      seconds_per_iteration: median(history.slice(2).map((m) => m.seconds)),
      reward_first5: run.summary.reward_first5,
      reward_last5: run.summary.reward_last5,
      max_staleness: Math.max(0, ...history.map((m) => (typeof m.staleness === 'number' ? m.staleness : 0))),
    };
    o.log(
      `lag ${lag}: plan ${Object.entries(row.plan)
        .map(([c, p]) => `${c} ${p}`)
        .join(
          ', ',
        )}; ${row.seconds_per_iteration.toFixed(3)} s/iteration (median; estimated ${row.estimated_seconds_per_iteration.toFixed(3)}), reward ${row.reward_first5?.toFixed(3)} -> ${row.reward_last5?.toFixed(3)}, max staleness ${row.max_staleness}`,
    );
    rmSync(dir, { recursive: true, force: true });
    return row;
  }
}
