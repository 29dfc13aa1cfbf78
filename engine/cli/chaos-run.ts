// Chaos runs: a scenario run clean and with kills, and the report that compares them (used by
// npm run chaos and by the chaos soak benchmark).
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { runId } from '../../mesh/wire/index.ts';
import { median } from '../runtime/index.ts';
import type { Scenario } from '../runtime/index.ts';
import { launch, type LaunchResult } from './launch.ts';

export interface ChaosReport {
  scenario: string;
  kills: number;
  kills_by_actor: Record<string, number>;
  kills_by_call: Record<string, number>;
  hangs: number;
  recovered: number;
  recoveries: number;
  restarts: number;
  recovery_seconds_median: number | null;
  recovery_seconds_max: number | null;
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
}

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
    // A kill is recovered from when a recovery followed it and the run went on to succeed.
    recovered: ok ? times.length : 0,
    recoveries: x?.recoveries.length ?? 0,
    restarts: chaos.chaos.restarts.length,
    recovery_seconds_median: median(times),
    recovery_seconds_max: times.length ? Math.max(...times) : null,
    digests_equal: !!c && !!x && c.status === 'succeeded' && ok && JSON.stringify(c.digests) === JSON.stringify(x.digests),
    rollouts_lost: x?.rollouts?.lost ?? null,
    rollouts_duplicated: x?.rollouts?.duplicated ?? null,
    clean: { status: c?.status ?? 'failed', wall_seconds: c?.wall_seconds ?? 0, digests: c?.digests ?? {} },
    chaos: { status: x?.status ?? 'failed', wall_seconds: x?.wall_seconds ?? 0, digests: x?.digests ?? {}, ...(x?.error ? { error: x.error } : {}) },
    runs,
    ...(x?.bus ? { bus: x.bus } : {}),
  };
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
  if (scenario.rl.staleness > 0 && !scenario.rl.versions) {
    const b = await chaosRun();
    const versions = b.summary?.staleness?.versions;
    const a = await cleanRun(versions && b.summary?.status === 'succeeded' ? { ...clean, rl: { ...clean.rl, versions } } : clean);
    return { ...chaosReport(name, a, b, runs), clean_replays: true };
  }
  const a = await cleanRun(clean);
  const b = await chaosRun();
  return chaosReport(name, a, b, runs);
}
