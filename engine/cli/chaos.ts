// npm run chaos -- FILE [--kills N] [--seed S] [--hang F] [--json] [--out DIR]
// Runs a scenario twice, clean and with kills, and reports what the kills did: how many, of which
// actors in which calls, how fast the run recovered, whether the final parameters are bit-identical
// to the clean run's, and whether every prompt of every iteration was trained on exactly once.
// The kills come from the scenario's `chaos:` section, or from --kills N (random, seeded by --seed).
// An event that never fired (a kill, a loss, a join) is listed with why, and fails the run unless
// the scenario marks it `optional: true`.
import { join } from 'node:path';
import { UsageError, args, runMain } from '../../actors/host.ts';
import { runId } from '../../mesh/wire/index.ts';
import { loadScenarioFile, planOnly } from '../runtime/index.ts';
import { describeUnfired, unfiredProblem } from '../supervision/index.ts';
import { runChaos } from './chaos-run.ts';

const USAGE = `usage: npm run chaos -- FILE [--kills N] [--seed S] [--hang F] [--json] [--out DIR]
  FILE      scenario file; its chaos: section says which kills to inject
  --kills   instead, N random kills of every actor kind (workers of each model, the supervisor);
            the supervision intensity is raised to 2N for them
  --seed    seed of the random kills (default 0)
  --hang    share of the random kills that hang the process instead (SIGSTOP; found by heartbeats)
  --json    print one JSON object
  --out     where the two run directories go (default runs/chaos-<scenario>-<time>)`;

function parseCount(flag: string, value: string | undefined, min: number): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (!Number.isInteger(n) || n < min) throw new UsageError(`${flag}: expected a whole number >= ${min}, got ${value}`);
  return n;
}

runMain(async () => {
  const { values, positionals } = args(USAGE, {
    kills: { type: 'string' },
    seed: { type: 'string' },
    hang: { type: 'string' },
    json: { type: 'boolean', default: false },
    out: { type: 'string' },
  });
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  if (positionals.length !== 1) throw new UsageError(`expected one scenario file, got ${positionals.length}\n${USAGE}`);
  const file = positionals[0]!;
  let scenario = await loadScenarioFile(file);
  const planning = planOnly(scenario);
  if (planning) throw new UsageError(`${file} is a scenario to plan, not to run here: ${planning}`);
  const kills = parseCount('--kills', values.kills, 1);
  const seed = parseCount('--seed', values.seed, 0) ?? 0;
  const hang = values.hang === undefined ? 0 : Number(values.hang);
  if (!(hang >= 0 && hang <= 1)) throw new UsageError(`--hang: expected a share between 0 and 1, got ${values.hang}`);
  if (kills !== undefined) {
    // N kills come faster than real failures would: the intensity must not end the run for them.
    const supervision = { ...scenario.supervision, intensity: Math.max(scenario.supervision.intensity, 2 * kills) };
    scenario = { ...scenario, supervision, chaos: { kills: [], joins: [], random: { kills, seed, hang } } };
  } else if (values.seed !== undefined || values.hang !== undefined) throw new UsageError('--seed and --hang go with --kills');
  if (!scenario.chaos || (scenario.chaos.kills.length === 0 && !scenario.chaos.random?.kills)) {
    throw new UsageError(`${file} has no chaos: section with kills; add one, or pass --kills N`);
  }
  const out = values.out ?? join('runs', runId(`chaos-${scenario.name ?? 'scenario'}`));
  const say = values.json ? () => {} : (line: string) => console.log(line);
  const report = await runChaos(scenario, out, say);
  if (values.json) {
    console.log(JSON.stringify(report));
  } else {
    const s = (x: number | null) => (x === null ? 'n/a' : `${x.toFixed(2)} s`);
    console.log(`kills: ${report.kills} (${report.hangs} hangs); by actor ${JSON.stringify(report.kills_by_actor)}; by call ${JSON.stringify(report.kills_by_call)}`);
    const must = report.unfired.filter((u) => !u.optional).length;
    console.log(
      report.unfired.length
        ? `unfired: ${report.unfired.length} chaos event(s) never fired (${must} not optional):\n${report.unfired.map((u) => `  ${describeUnfired(u)}`).join('\n')}`
        : 'unfired: none (every chaos event fired)',
    );
    console.log(`recovered: ${report.recovered} of ${report.kills}; ${report.recoveries} recoveries, ${report.restarts} process restarts`);
    console.log(`recovery time: median ${s(report.recovery_seconds_median)}, max ${s(report.recovery_seconds_max)}`);
    console.log(
      `snapshots: ${report.snapshot_bytes_by_devices ?? 0} bytes written by the devices, each into its own bucket; ${report.snapshot_bytes_via_supervisor ?? 0} bytes (the manifests) through the supervisor's process; ${report.snapshot_seconds_mean?.toFixed(3) ?? 'n/a'} s each on average`,
    );
    const b = report.recovery_bytes;
    console.log(
      `recoveries restored ${b.restored} bytes of snapshots to devices (${b.via_supervisor} of them through the supervisor's process); ${b.kept} bytes stayed where survivors held them with the snapshot's state`,
    );
    const replays = report.clean_replays ? "a replay of the chaos run's recorded schedule: the run is free-running" : undefined;
    const against =
      report.reference === 'resumed on each re-plan'
        ? ` (stopped before each re-plan's iteration and resumed from that checkpoint on its plan: a new layout changes reduction order${replays ? `; ${replays}` : ''})`
        : replays
          ? ` (${replays})`
          : '';
    console.log(`digests equal to the clean run's${against}: ${report.digests_equal}; rollouts lost: ${report.rollouts_lost ?? 'n/a'}, trained twice: ${report.rollouts_duplicated ?? 'n/a'}`);
    for (const r of report.replans ?? []) {
      const plan = (p: Record<string, { mesh: string; dp: number; tp: number; pp: number }>) =>
        Object.entries(p)
          .map(([call, q]) => `${call} ${q.mesh} dp${q.dp}·tp${q.tp}·pp${q.pp}`)
          .join(', ');
      console.log(`re-plan at iteration ${r.iteration} (${r.trigger}: device(s) ${r.lost.join(', ')} lost): ${r.why}`);
      console.log(
        `  search ${r.search_seconds.toFixed(2)} s (${r.plans_evaluated} plans); migration ${r.migration_seconds?.toFixed(2) ?? 'n/a'} s, ${r.migration_bytes ?? 'n/a'} bytes (least ${r.migration_minimum_bytes ?? 'n/a'}); parameters equal after it: ${r.parameters_equal_after_migration ?? 'n/a'}`,
      );
      console.log(
        `  period: estimated ${r.estimated_period_after.toFixed(3)} s, measured ${r.measured_period_after?.toFixed(3) ?? 'n/a'} s (before: estimated ${r.estimated_period_before.toFixed(3)} s${r.machine_speed === undefined ? '' : `, priced at the machine's speed: ${r.machine_speed.toFixed(2)} × the profile, from ${r.measured_period_before!.toFixed(3)} s measured`})`,
      );
      console.log(`  before: ${plan(r.plan_before)}\n  after:  ${plan(r.plan_after)}`);
    }
    if (report.replans?.length) {
      const ratios = (xs: Array<number | null> | undefined) => (xs ?? []).map((x) => (x === null ? 'n/a' : x.toFixed(2))).join(', ');
      console.log(
        `migration bytes / the least: ${report.migration_bytes_ratio?.toFixed(2) ?? 'n/a'}; loss-to-going-on / (search + bytes ÷ the run's measured bandwidth): ${ratios(report.migration_time_ratio)}; measured period / estimate: ${ratios(report.period_ratio)}`,
      );
    }
    console.log(
      `clean: ${report.clean.status} in ${report.clean.wall_seconds.toFixed(1)} s; chaos: ${report.chaos.status} in ${report.chaos.wall_seconds.toFixed(1)} s${report.chaos.error ? ` (${report.chaos.error})` : ''}`,
    );
  }
  const unfired = unfiredProblem(report.unfired);
  // With --json, stdout holds the one object (its unfired list); the verdict goes to stderr.
  if (unfired) (values.json ? console.error : console.log)(`FAILED: ${unfired}`);
  const good = report.digests_equal && report.rollouts_lost === 0 && report.rollouts_duplicated === 0 && report.parameters_equal_after_migration !== false && !unfired;
  return good ? 0 : 1;
});
