// npm run bench -- async: the same scenario (scenarios/async.yaml: generation on one device,
// scoring, inference and training on another) lock-step and one-step-off, one after the other in
// one run, over NATS with worker processes, beside a reward actor that takes a fixed time per
// request (examples/reward-actor/ascending.mjs --delay-ms), so that scoring is not free: seconds
// per iteration (median, the first two left out: set-up and the first ahead generation), the
// speedup of lag 1 over lag 0, reward first 5 / last 5 of each, and the lagged run's staleness.
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Metrics } from '../../mesh/wire/index.ts';
import { runId, startNatsServer } from '../../mesh/wire/index.ts';
import { loadScenarioFile } from '../runtime/index.ts';
import { launch } from './launch.ts';

export interface AsyncRow {
  lag: number;
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
  log: (line: string) => void;
}): Promise<{ sync: AsyncRow; lagged: AsyncRow; speedup: number; reward_delay_ms: number }> {
  const base = await loadScenarioFile(o.file ?? 'scenarios/async.yaml');
  // One server for both runs, where the reward actor serves them.
  const server = await startNatsServer();
  const actor = spawn(process.execPath, [join(ROOT, 'examples/reward-actor/ascending.mjs'), '--nats', server.url, '--delay-ms', String(o.rewardDelayMs)], { stdio: 'ignore' });
  const rows: AsyncRow[] = [];
  try {
    for (const lag of [0, 1]) rows.push(await once(lag));
  } finally {
    actor.kill('SIGTERM');
    await server.stop();
  }
  const [sync, lagged] = rows as [AsyncRow, AsyncRow];
  const speedup = sync.seconds_per_iteration / lagged.seconds_per_iteration;
  o.log(`speedup of lag 1 over lag 0 (s/iteration): ${speedup.toFixed(2)}`);
  return { sync, lagged, speedup, reward_delay_ms: o.rewardDelayMs };

  async function once(lag: number): Promise<AsyncRow> {
    const scenario = {
      ...base,
      name: `${base.name}-lag${lag}`,
      rl: { ...base.rl, lag, iterations: o.iterations ?? base.rl.iterations },
      reward: { ...base.reward, weight: 0.5, actors: [{ name: 'ascending', weight: 0.5, timeout_seconds: 30, retries: 2, wait_seconds: 30 }] },
    };
    const dir = mkdtempSync(join(tmpdir(), `ferry-bench-async-${lag}-`));
    const run = await launch({ scenario, run: runId(`bench-async-${lag}`), out: dir, natsUrl: server.url, progress: { phase() {}, iteration() {}, stop() {} }, say: () => {}, workers: undefined });
    if (run.code !== 0 || !run.summary) throw new Error(`the run with rl.lag ${lag} failed: ${run.summary?.error ?? `exit ${run.code}`} (logs in ${dir})`);
    const history = readFileSync(join(dir, 'metrics.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Metrics);
    const row: AsyncRow = {
      lag,
      seconds_per_iteration: median(history.slice(2).map((m) => m.seconds)),
      reward_first5: run.summary.reward_first5,
      reward_last5: run.summary.reward_last5,
      max_staleness: Math.max(0, ...history.map((m) => (typeof m.staleness === 'number' ? m.staleness : 0))),
    };
    o.log(`lag ${lag}: ${row.seconds_per_iteration.toFixed(3)} s/iteration (median), reward ${row.reward_first5?.toFixed(3)} -> ${row.reward_last5?.toFixed(3)}, max staleness ${row.max_staleness}`);
    rmSync(dir, { recursive: true, force: true });
    return row;
  }
}
