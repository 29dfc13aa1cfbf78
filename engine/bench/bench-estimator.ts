// The estimator benchmark: several plans of one local scenario run for real (worker processes
// over NATS), each against the planner's estimate from the fitted local profile, at the speed the
// machine has when the plan runs (its speed probe, timed just before and just after, against the
// probe's time when the profile was fitted: a shared machine's speed drifts by a fifth or more in
// minutes).
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Metrics } from '../../mesh/wire/index.ts';
import { runId } from '../../mesh/wire/index.ts';
import type { DeviceProfile, Summary } from '../runtime/index.ts';
import { Evaluator, PLACEMENTS, namedPlan, scaledProfile, search, type Candidate } from '../runtime/index.ts';
import { candidateOf, problemOf } from '../runtime/index.ts';
import { median } from '../runtime/index.ts';
import { parseScenario, type Scenario } from '../runtime/index.ts';
import { launch } from '../cli/launch.ts';
import { speedProbe } from '../cli/profile.ts';
import { withWorkers } from '../cli/workers.ts';

const BASE = `name: estimator
seed: 1
backend: wasm
model: { layers: 2, width: 64, heads: 4 }
warmup: { steps: 2, demos: 64, batch: 16 }
`;

/** The tasks the benchmark runs: sort (answers of 4 tokens) or count (a budget of 25, answers that end). */
export const ESTIMATOR_TASKS: Record<string, string> = {
  sort: 'task: { name: sort, digits: 4, base: 10 }',
  count: 'task: { name: count, base: 24 }',
};

/** Plans that differ in what they share, move and split: one device, pairs, one per model, views, 3D. */
export const PLANS: Record<string, string> = {
  'one-device': `plan:
  actor.generate: { mesh: "0:0" }
  actor.train: { mesh: "0:0" }
  critic.inference: { mesh: "0:0" }
  critic.train: { mesh: "0:0" }
  reference.inference: { mesh: "0:0" }
  reward.inference: { mesh: "0:0" }`,
  pairs: `plan:
  actor.generate: { mesh: "0:0" }
  actor.train: { mesh: "0:0" }
  critic.inference: { mesh: "0:1" }
  critic.train: { mesh: "0:1" }
  reference.inference: { mesh: "0:1" }
  reward.inference: { mesh: "0:0" }`,
  split: `plan: {}`,
  views: `plan:
  actor.train: { mesh: "0:0" }
  actor.generate: { mesh: "0:2" }
  critic.train: { mesh: "0:1" }
  critic.inference: { mesh: "0:3" }
  reference.inference: { mesh: "0:2" }
  reward.inference: { mesh: "0:3" }`,
  'data-parallel': `plan:
  actor.train: { mesh: "0:0-1", dp: 2 }
  actor.generate: { mesh: "0:0-1", dp: 2 }
  critic.train: { mesh: "0:2-3", dp: 2 }
  critic.inference: { mesh: "0:2-3", dp: 2 }
  reference.inference: { mesh: "0:2" }
  reward.inference: { mesh: "0:3" }`,
  '3d': `plan:
  actor.train: { mesh: "0:0-1", dp: 2 }
  actor.generate: { mesh: "0:2-3", tp: 2 }
  critic.train: { mesh: "0:0-1", pp: 2 }
  critic.inference: { mesh: "0:2-3", dp: 2 }
  reference.inference: { mesh: "0:2-3", tp: 2 }
  reward.inference: { mesh: "0:3" }`,
};

/**
 * How many times as long the speed probe takes now as when `profile` was fitted (1 for a profile
 * without a probe): this machine is shared, and its speed drifts by a fifth or more within minutes.
 */
export async function speedFactor(profile: DeviceProfile): Promise<number> {
  if (!profile.probeSeconds) return 1;
  const now = await withWorkers(1, 'probe', ({ d }) => speedProbe(d));
  return now / profile.probeSeconds;
}

/**
 * Each plan run for real `repeats` times (the plans in turn, so that a drift of the machine's speed
 * reaches them all alike) against its estimate; a plan's figures are the medians of its repeats.
 */
export async function estimatorBench(profile: DeviceProfile, iterations: number, log: (line: string) => void, task = 'sort', repeats = 1) {
  const runs = new Map<string, Array<{ measured: number; estimated: number; error: number; speed: number }>>();
  for (let r = 0; r < repeats; r++) {
    if (repeats > 1) log(`  repeat ${r + 1} of ${repeats}`);
    for (const [name, plan] of Object.entries(PLANS)) {
      const scenario = { ...parseScenario(`${BASE}${ESTIMATOR_TASKS[task]}\nrl: { iterations: ${iterations}, batch: 64 }\n${plan}\n`, `estimator/${name}`), name: `estimator-${name}` };
      // The profile at the machine's speed while the plan runs: the probe, timed just before and
      // just after the run, averaged.
      const before = await speedFactor(profile);
      const measured = await medianIterationSeconds(scenario, `est-${name}`);
      const speed = (before + (await speedFactor(profile))) / 2;
      const estimated = new Evaluator(problemOf(scenario, scaledProfile(profile, speed))).evaluate(candidateOf(scenario)).iterationSeconds;
      const error = (estimated - measured) / measured;
      log(`  ${name.padEnd(14)} measured ${measured.toFixed(3)} s/it, estimated ${estimated.toFixed(3)} s/it (${(100 * error).toFixed(1)}%), machine ${speed.toFixed(2)}× the profile's time`);
      runs.set(name, [...(runs.get(name) ?? []), { measured, estimated, error, speed }]);
    }
  }
  const rows = [...runs].map(([name, rs]) => ({
    plan: name,
    measured_seconds: median(rs.map((x) => x.measured))!,
    estimated_seconds: median(rs.map((x) => x.estimated))!,
    relative_error: median(rs.map((x) => x.error))!,
    relative_errors: rs.map((x) => x.error),
    speed_factor: median(rs.map((x) => x.speed))!,
  }));
  if (repeats > 1)
    for (const r of rows) log(`  ${r.plan.padEnd(14)} median of ${repeats}: ${(100 * r.relative_error).toFixed(1)}% (${r.relative_errors.map((e) => `${(100 * e).toFixed(1)}%`).join(', ')})`);
  const abs = rows.map((r) => Math.abs(r.relative_error));
  return { bench: 'estimator', task, iterations, repeats, plans: rows, median_relative_error: median(abs), max_relative_error: Math.max(...abs), profile: profile.source };
}

/**
 * Runs `scenario` for real (worker processes over NATS) and returns its median seconds per
 * iteration after the first, which warms caches and compiles, with its snapshots' share added (a
 * snapshot's mean seconds ÷ checkpoint.every: an iteration's own seconds leave its snapshot out):
 * the steady state the simulator estimates, which prices the snapshots too.
 */
async function medianIterationSeconds(scenario: Scenario, run: string): Promise<number> {
  const dir = mkdtempSync(join(tmpdir(), 'ferry-measured-'));
  try {
    const r = await launch({ scenario, run: runId(run), out: dir, progress: { phase() {}, iteration() {}, stop() {} }, say: () => {} });
    if (r.code !== 0) throw new Error(`${scenario.name} failed: ${r.summary?.error ?? `exit ${r.code}`}`);
    const metrics = readFileSync(join(dir, 'metrics.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Metrics);
    const { snapshots } = JSON.parse(readFileSync(join(dir, 'summary.json'), 'utf8')) as Summary;
    const every = scenario.checkpoint.every;
    const snapshotSeconds = snapshots?.count && every ? (snapshots.write_seconds + snapshots.manifest_seconds) / snapshots.count / every : 0;
    return median(metrics.slice(1).map((m) => m.seconds))! + snapshotSeconds;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** A measured run of one plan of `scenario`. */
function measure(scenario: Scenario, plan: Candidate, name: string): Promise<number> {
  const withPlan: Scenario = { ...scenario, name: `search-${name}`, plan: Object.fromEntries(Object.entries(plan).map(([c, p]) => [c, { mesh: p.mesh, dp: p.dp, tp: p.tp, pp: p.pp }])) };
  return medianIterationSeconds(withPlan, `search-${name}`);
}

/**
 * On this machine, measured: the named placement the planner rates best, against the plan its
 * search finds. Both run for real over NATS.
 */
export async function searchBench(profile: DeviceProfile, iterations: number, budget: number, log: (line: string) => void) {
  const scenario = { ...parseScenario(`${BASE}rl: { iterations: ${iterations}, batch: 64 }\n`, 'search'), name: 'search' };
  const ev = new Evaluator(problemOf(scenario, profile));
  const named = PLACEMENTS.map((n) => ({ name: n, plan: namedPlan(ev, n) })).map((x) => ({ ...x, estimated: ev.evaluate(x.plan).iterationSeconds }));
  named.sort((a, b) => a.estimated - b.estimated);
  const found = search(
    ev,
    named.map((n) => n.plan),
    { budgetSeconds: budget },
  );
  const best = named[0]!;
  const searched = found.best[0]!;
  log(`  estimated: best named (${best.name}) ${best.estimated.toFixed(3)} s/it, search ${searched.iterationSeconds.toFixed(3)} s/it`);
  const measuredNamed = await measure(scenario, best.plan, best.name);
  const measuredSearch = await measure(scenario, searched.plan, 'search');
  log(`  measured:  best named (${best.name}) ${measuredNamed.toFixed(3)} s/it, search ${measuredSearch.toFixed(3)} s/it`);
  return {
    bench: 'search',
    best_named: best.name,
    named_estimated_seconds: Object.fromEntries(named.map((n) => [n.name, n.estimated])),
    search_estimated_seconds: searched.iterationSeconds,
    best_named_measured_seconds: measuredNamed,
    search_measured_seconds: measuredSearch,
    speedup_measured: measuredNamed / measuredSearch,
    search_plan: Object.fromEntries(Object.entries(searched.plan).map(([c, p]) => [c, `${p.mesh} dp${p.dp} tp${p.tp} pp${p.pp}`])),
  };
}
