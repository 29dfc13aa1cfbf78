// The search-quality benchmark: how close the plan search comes, within its default budget, to what
// a much longer search finds. On each cluster scenario, several short searches (different seeds)
// and one long reference search (a seed of its own); the gap of a short search is
// (short − long) / long, in estimated seconds per iteration. The search is bounded by a number of
// plan evaluations (the budget in seconds converted at a fixed rate), so these figures do not
// depend on how fast or how loaded the machine is.
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { UsageError, args } from '../../actors/host.ts';
import { Evaluator, loadScenarioFile, median, namedStarts, problemOf, search } from '../runtime/index.ts';

export const USAGE = `usage: npm run bench -- search-quality [--json] [--budget S] [--reference S] [--seeds N] [--scenario FILE]...
  on each cluster scenario (default scenarios/cluster/*.yaml; --scenario is repeatable or comma-separated):
  N searches of S seconds' budget (default 5 of 10 s, seeds 1..N) against one of --reference seconds
  (default 120 s, seed 0); the gap is (short − long) / long in estimated seconds per iteration`;

/** The seed of the long reference search: distinct from the short searches' seeds 1..N. */
export const REFERENCE_SEED = 0;

export interface Run {
  seed: number;
  seconds_per_iteration: number;
  evaluated: number;
  /** As measured: negative when the short search beat the long one. */
  gap: number;
  /** Wall seconds of the search (informative only: the budget is a number of evaluations). */
  search_seconds: number;
}

/** How much slower a short search's plan is than the reference plan, as a fraction of the reference. */
export function gapOf(short: number, reference: number): number {
  return (short - reference) / reference;
}

/**
 * The median and worst gap of some runs. A short search that beat the reference counts as 0: the
 * figure says how far short searches fall behind, not how lucky one was.
 */
export function summarize(gaps: readonly number[]): { median_gap: number; worst_gap: number } {
  if (gaps.length === 0) throw new Error('summarize: expected at least one gap, got none');
  const clamped = gaps.map((g) => Math.max(0, g));
  return { median_gap: median(clamped)!, worst_gap: Math.max(...clamped) };
}

/** `--scenario` values (repeated or comma-separated), or every scenario of scenarios/cluster/. */
export function scenarioFiles(values: readonly string[] | undefined, dir = join('scenarios', 'cluster')): string[] {
  const given = (values ?? [])
    .flatMap((v) => v.split(','))
    .map((v) => v.trim())
    .filter((v) => v.length > 0);
  if (given.length > 0) return given;
  return readdirSync(dir)
    .filter((f) => f.endsWith('.yaml'))
    .sort()
    .map((f) => join(dir, f));
}

/** One search of a scenario, from the named placements, with a fresh evaluator (no warm caches). */
async function searchOnce(file: string, budgetSeconds: number, seed: number) {
  const problem = problemOf(await loadScenarioFile(file));
  const ev = new Evaluator(problem);
  const r = search(ev, namedStarts(ev), { budgetSeconds, seed });
  const best = r.best[0];
  if (!best) throw new Error(`${file}: the search (seed ${seed}, ${budgetSeconds} s) found no feasible plan`);
  return { seconds_per_iteration: best.iterationSeconds, evaluated: r.evaluated, search_seconds: r.seconds };
}

export interface SearchQualityOptions {
  files: string[];
  budget: number;
  reference: number;
  seeds: number;
  log: (line: string) => void;
}

export async function searchQuality(o: SearchQualityOptions) {
  const scenarios: Record<string, { reference_seconds_per_iteration: number; reference_seed: number; reference_evaluated: number; runs: Run[]; median_gap: number; worst_gap: number }> = {};
  for (const file of o.files) {
    const ref = await searchOnce(file, o.reference, REFERENCE_SEED);
    o.log(`${file}: reference ${ref.seconds_per_iteration.toFixed(3)} s/iteration (seed ${REFERENCE_SEED}, ${ref.evaluated} plans, ${ref.search_seconds.toFixed(1)} s)`);
    const runs: Run[] = [];
    for (let seed = 1; seed <= o.seeds; seed++) {
      const r = await searchOnce(file, o.budget, seed);
      const run = { seed, ...r, gap: gapOf(r.seconds_per_iteration, ref.seconds_per_iteration) };
      runs.push(run);
      o.log(`  seed ${seed}: ${r.seconds_per_iteration.toFixed(3)} s/iteration, gap ${(100 * run.gap).toFixed(2)}% (${r.evaluated} plans, ${r.search_seconds.toFixed(1)} s)`);
    }
    scenarios[file] = {
      reference_seconds_per_iteration: ref.seconds_per_iteration,
      reference_seed: REFERENCE_SEED,
      reference_evaluated: ref.evaluated,
      runs,
      ...summarize(runs.map((r) => r.gap)),
    };
  }
  const all = Object.values(scenarios).flatMap((s) => s.runs.map((r) => r.gap));
  return { bench: 'search-quality', ...summarize(all), budget_seconds: o.budget, reference_seconds: o.reference, seeds: o.seeds, scenarios };
}

function positive(flag: string, value: string | undefined): number {
  const n = Number(value);
  if (!(n > 0)) throw new UsageError(`--${flag}: expected a number > 0, got ${value}\n${USAGE}`);
  return n;
}

/** `npm run bench -- search-quality …`: parses its own options (bench.ts hands it the command line). */
export async function searchQualityBench(): Promise<number> {
  const { values } = args(USAGE, {
    json: { type: 'boolean', default: false },
    budget: { type: 'string', default: '10' },
    reference: { type: 'string', default: '120' },
    seeds: { type: 'string', default: '5' },
    scenario: { type: 'string', multiple: true },
  });
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  const seeds = Number(values.seeds);
  if (!(Number.isInteger(seeds) && seeds >= 1)) throw new UsageError(`--seeds: expected a whole number >= 1, got ${values.seeds}\n${USAGE}`);
  const o = { files: scenarioFiles(values.scenario), budget: positive('budget', values.budget), reference: positive('reference', values.reference), seeds };
  const log = values.json ? () => {} : (line: string) => console.log(line);
  log(`bench search-quality: ${o.files.length} scenarios, ${seeds} searches of ${o.budget} s against one of ${o.reference} s each`);
  const r = await searchQuality({ ...o, log });
  if (values.json) {
    console.log(JSON.stringify(r));
    return 0;
  }
  const pct = (x: number) => `${(100 * x).toFixed(2)}%`.padStart(8);
  console.log(`\n${'scenario'.padEnd(48)}${'reference'.padStart(11)}${'median'.padStart(9)}${'worst'.padStart(9)}  gaps by seed`);
  for (const [file, s] of Object.entries(r.scenarios)) {
    console.log(`${file.padEnd(48)}${s.reference_seconds_per_iteration.toFixed(3).padStart(11)}${pct(s.median_gap)}${pct(s.worst_gap)}  ${s.runs.map((x) => pct(x.gap).trim()).join(' ')}`);
  }
  console.log(`median gap ${pct(r.median_gap).trim()}, worst ${pct(r.worst_gap).trim()} (short searches of ${r.budget_seconds} s against ${r.reference_seconds} s)`);
  return 0;
}
