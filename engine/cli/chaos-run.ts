// Chaos runs: a scenario run clean and with kills, and the report that compares them (used by
// npm run chaos and by the chaos soak benchmark).
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { runId } from '../../mesh/wire/index.ts';
import { median, withPlan } from '../runtime/index.ts';
import type { Scenario, Summary } from '../runtime/index.ts';
import type { UnfiredEvent } from '../supervision/index.ts';
import { launch, type LaunchResult } from './launch.ts';

export interface ChaosReport {
  scenario: string;
  kills: number;
  kills_by_actor: Record<string, number>;
  kills_by_call: Record<string, number>;
  hangs: number;
  /** The scenario's events (kills, losses, joins) that never fired in the chaos run, each with why; npm run chaos fails on one not marked optional. */
  unfired: UnfiredEvent[];
  recovered: number;
  recoveries: number;
  restarts: number;
  recovery_seconds_median: number | null;
  recovery_seconds_max: number | null;
  /**
   * Over the recoveries: the snapshots' bytes restored to devices, those not (ranks a survivor kept
   * with the snapshot's state), and of those restored, what went through the supervisor's process
   * (a recovery in place: none, the devices reload from their buckets).
   */
  recovery_bytes: { restored: number; kept: number; via_supervisor: number };
  digests_equal: boolean;
  rollouts_lost: number | null;
  rollouts_duplicated: number | null;
  clean: { status: string; wall_seconds: number; digests: Record<string, string> };
  chaos: { status: string; wall_seconds: number; digests: Record<string, string>; error?: string };
  runs: { clean: string; chaos: string };
  /** Free-running (rl.staleness): the clean run replayed the schedule the chaos run recorded. */
  clean_replays?: boolean;
  /** The chaos run's bus: the NATS server's version and how its JetStream syncs writes. */
  bus?: { server_version: string; sync: string };
  /**
   * An elastic run that lost devices for good: its re-plans, and what they moved. The clean run it
   * is compared with is then the reference item 3 of the elastic issue names: the run stopped
   * where each re-plan went back to, and resumed from that checkpoint on the re-plan's plan.
   */
  replans?: NonNullable<Summary['replans']>;
  migration_bytes_ratio?: number | null;
  parameters_equal_after_migration?: boolean;
  /** Bytes of snapshots that went through the supervisor's process: their manifests (each device writes its own state). */
  snapshot_bytes_via_supervisor?: number;
  /** Seconds a snapshot took, fetched from the devices and stored, on average over the run's snapshots (one after each iteration by default). */
  /** Bytes of state the devices wrote, each into its own bucket, over all snapshots. */
  snapshot_bytes_by_devices?: number;
  snapshot_seconds_mean?: number | null;
  /**
   * Per re-plan that moved the run: seconds from the loss to going on, against the search plus the
   * bytes sent at the chunk path's bandwidth measured in the same run (the snapshots' fetches);
   * and the median period measured after it against the planner's estimate.
   */
  migration_time_ratio?: Array<number | null>;
  period_ratio?: Array<number | null>;
  reference?: 'clean' | 'resumed on each re-plan';
}

const sum = (xs: readonly number[] = []) => xs.reduce((n, x) => n + x, 0);
const count = (xs: readonly string[]) => xs.reduce<Record<string, number>>((m, x) => ((m[x] = (m[x] ?? 0) + 1), m), {});

export function chaosReport(scenario: string, clean: LaunchResult, chaos: LaunchResult, runs: ChaosReport['runs']): ChaosReport {
  const kills = chaos.chaos.kills;
  const times = kills.map((k) => k.recovery_seconds).filter((t): t is number => t !== undefined);
  const c = clean.summary;
  const x = chaos.summary;
  const ok = x?.status === 'succeeded';
  return {
    scenario,
    kills: kills.length,
    kills_by_actor: count(kills.map((k) => k.actor)),
    kills_by_call: count(kills.map((k) => k.call)),
    hangs: kills.filter((k) => k.how === 'hang').length,
    unfired: chaos.chaos.unfired,
    // A kill is recovered from when a recovery followed it and the run went on to succeed.
    recovered: ok ? times.length : 0,
    recoveries: x?.recoveries.length ?? 0,
    restarts: chaos.chaos.restarts.length,
    recovery_seconds_median: median(times),
    recovery_seconds_max: times.length ? Math.max(...times) : null,
    recovery_bytes: {
      restored: sum(x?.recoveries.map((r) => r.restored_bytes ?? 0)),
      kept: sum(x?.recoveries.map((r) => r.kept_bytes ?? 0)),
      via_supervisor: sum(x?.recoveries.map((r) => r.via_supervisor_bytes ?? 0)),
    },
    digests_equal: !!c && !!x && c.status === 'succeeded' && ok && JSON.stringify(c.digests) === JSON.stringify(x.digests),
    rollouts_lost: x?.rollouts?.lost ?? null,
    rollouts_duplicated: x?.rollouts?.duplicated ?? null,
    clean: { status: c?.status ?? 'failed', wall_seconds: c?.wall_seconds ?? 0, digests: c?.digests ?? {} },
    chaos: { status: x?.status ?? 'failed', wall_seconds: x?.wall_seconds ?? 0, digests: x?.digests ?? {}, ...(x?.error ? { error: x.error } : {}) },
    runs,
    ...(x?.bus ? { bus: x.bus } : {}),
    ...snapshotFigures(x),
    ...(x?.replans?.length ? elasticFigures(x) : {}),
  };
}

/** What the chaos run's snapshots cost: bytes through the supervisor's process, and seconds per snapshot. */
function snapshotFigures(x: Summary | undefined): Partial<ChaosReport> {
  const s = x?.snapshots;
  if (!s) return {};
  return {
    snapshot_bytes_via_supervisor: s.bytes_via_supervisor,
    snapshot_bytes_by_devices: s.total_bytes,
    snapshot_seconds_mean: s.count ? (s.write_seconds + s.manifest_seconds) / s.count : null,
  };
}

/** What an elastic run's re-plans moved: bytes sent against the least a migration could send, and whether the parameters came through bit for bit. */
function elasticFigures(x: Summary): Partial<ChaosReport> {
  const replans = x.replans ?? [];
  // A decision to keep the plan (workers that joined, and did not pay) moves nothing.
  const moved = replans.filter((r) => r.changed);
  const sent = moved.reduce((n, r) => n + (r.migration_bytes ?? 0), 0);
  const least = moved.reduce((n, r) => n + (r.migration_minimum_bytes ?? 0), 0);
  // The bus's bandwidth into the run's store as this run measured it: every snapshot's bytes, as
  // the devices wrote them (all at once), over the seconds they took.
  const s = x.snapshots;
  const bandwidth = s && s.write_seconds > 0 ? s.total_bytes / s.write_seconds : undefined;
  return {
    replans,
    migration_bytes_ratio: least > 0 ? sent / least : null,
    parameters_equal_after_migration: moved.every((r) => r.parameters_equal_after_migration === true),
    migration_time_ratio: moved.map((r) => (bandwidth && r.seconds !== undefined && r.migration_bytes !== undefined ? r.seconds / (r.search_seconds + r.migration_bytes / bandwidth) : null)),
    period_ratio: moved.map((r) => (r.measured_period_after !== undefined ? r.measured_period_after / r.estimated_period_after : null)),
  };
}

/** Whether the scenario loses devices for good (chaos `lose` events). */
const losesDevices = (s: Scenario) => s.chaos?.kills.some((k) => 'lose' in k) ?? false;

/**
 * The reference of an elastic chaos run: the clean scenario stopped where each re-plan went back
 * to (its iteration), then resumed from that checkpoint on the re-plan's plan, up to the next. A
 * free-running one (rl.staleness) replays the schedule the chaos run recorded (`versions`), each
 * leg its part of it: which version made which rollout is the chaos run's timing, not the
 * reference's.
 */
async function resumedOnEachPlan(clean: Scenario, replans: NonNullable<Summary['replans']>, out: string, name: string, versions?: readonly number[]): Promise<LaunchResult> {
  const quiet = { phase() {}, iteration() {}, stop() {} };
  const changed = replans.filter((r) => r.changed);
  const stops = [...changed.map((r) => r.iteration), clean.rl.iterations];
  let last: LaunchResult | undefined;
  for (const [i, stop] of stops.entries()) {
    const leg = { ...clean, rl: { ...clean.rl, iterations: stop, ...(versions ? { versions: versions.slice(0, stop) } : {}) } };
    const scenario = i === 0 ? leg : withPlan(leg, changed[i - 1]!.plan_after);
    last = await launch({ scenario, run: runId(`${name}-ref${i}`), out, progress: quiet, say: () => {}, ...(i > 0 ? { resume: true } : {}) });
    if (last.code !== 0) return last;
  }
  return last!;
}

/**
 * Runs `scenario` without its chaos section, then with it; both in `out`. A free-running scenario
 * (rl.staleness) has no schedule of its own to compare with (which version made which rollout
 * depends on timing): its chaos run comes first, and the clean run replays the schedule the chaos
 * run recorded (rl.versions), without timing and without kills.
 */
export async function runChaos(scenario: Scenario, out: string, say: (line: string) => void = () => {}): Promise<ChaosReport> {
  const quiet = { phase() {}, iteration() {}, stop() {} };
  const name = scenario.name ?? 'scenario';
  const { chaos: _none, ...clean } = scenario;
  const runs = { clean: join(out, 'clean'), chaos: join(out, 'chaos') };
  mkdirSync(out, { recursive: true });
  const cleanRun = (s: Scenario) => {
    say(`clean run: ${runs.clean}${s.rl.versions ? ` (the chaos run's schedule, replayed: versions ${s.rl.versions.join(' ')})` : ''}`);
    return launch({ scenario: s, run: runId(`${name}-clean`), out: runs.clean, progress: quiet, say: () => {} });
  };
  const chaosRun = () => {
    say(`chaos run: ${runs.chaos}`);
    return launch({ scenario, run: runId(`${name}-chaos`), out: runs.chaos, progress: quiet, say: (l) => (l.startsWith('chaos:') || l.startsWith('recovered') ? say(`  ${l}`) : undefined) });
  };
  if (losesDevices(scenario)) {
    const b = await chaosRun();
    const replans = (b.summary?.replans ?? []).filter((r) => r.changed);
    say(`reference: ${runs.clean}, stopped before each re-plan's iteration (${replans.map((r) => r.iteration).join(', ') || 'none'}) and resumed on its plan`);
    const versions = scenario.rl.staleness > 0 && !scenario.rl.versions ? b.summary?.staleness?.versions : undefined;
    const a =
      b.summary?.status === 'succeeded' && replans.length
        ? await resumedOnEachPlan(clean, replans, runs.clean, name, versions)
        : await cleanRun(versions ? { ...clean, rl: { ...clean.rl, versions } } : clean);
    return { ...chaosReport(name, a, b, runs), reference: replans.length ? 'resumed on each re-plan' : 'clean', ...(versions ? { clean_replays: true } : {}) };
  }
  if (scenario.rl.staleness > 0 && !scenario.rl.versions) {
    const b = await chaosRun();
    const versions = b.summary?.staleness?.versions;
    // In flight, the passes its generations switched version at are part of the schedule too.
    const switches = b.summary?.staleness?.switches;
    const a = await cleanRun(versions && b.summary?.status === 'succeeded' ? { ...clean, rl: { ...clean.rl, versions, ...(switches ? { switches } : {}) } } : clean);
    return { ...chaosReport(name, a, b, runs), clean_replays: true };
  }
  const a = await cleanRun(clean);
  const b = await chaosRun();
  return chaosReport(name, a, b, runs);
}
