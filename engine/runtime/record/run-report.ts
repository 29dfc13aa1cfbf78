// Builds report.html from what a run directory holds: scenario.json, summary.json, metrics.jsonl,
// timeline.jsonl (written by the supervisor) and chaos.json (by the launcher); the estimate comes
// from the planner's simulation of the run's plan.
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { EpisodeRecordWire, Metrics } from '../../../mesh/wire/index.ts';
import { Evaluator } from '../plan/planner.ts';
import { LOCAL_PROFILE, candidateOf, loadLocalProfile, localProfileFile, problemOf } from '../plan/problem.ts';
import type { DeviceProfile } from '../plan/catalog.ts';
import type { Summary } from './record.ts';
import { planRows, renderReport, type CallRecord, type KillRecord, type RecoveryRecord, type ReportInput, type UnfiredRecord } from './report.ts';
import { resolvePlan, Scenario } from '../scenario/scenario.ts';

/** The planner's estimate of a scenario's plan, or why there is none. */
export function estimateOf(s: Scenario): ReportInput['estimate'] {
  let profile: DeviceProfile | undefined;
  if (s.cluster.device === 'local') {
    const file = localProfileFile();
    if (!file) return { missing: `no local device profile (${LOCAL_PROFILE}): npm run profile fits one` };
    profile = loadLocalProfile(file);
  }
  try {
    const ev = new Evaluator(problemOf(s, profile));
    const e = ev.evaluate(candidateOf(s), true);
    if (!e.feasible || !e.simulation) return { missing: `the planner finds this plan infeasible: ${e.why ?? 'unknown'}` };
    return { simulation: e.simulation, iterationSeconds: e.iterationSeconds, profile: profile ? `${profile.name}: ${profile.source ?? ''}` : s.cluster.device };
  } catch (e) {
    return { missing: `no estimate: ${(e as Error).message}` };
  }
}

function jsonLines<T>(file: string): T[] {
  if (!existsSync(file)) return [];
  return readFileSync(file, 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as T);
}

/** Writes `dir/report.html`; returns its path. */
export function writeRunReport(dir: string): string {
  const scenarioFile = join(dir, 'scenario.json');
  if (!existsSync(scenarioFile)) throw new Error(`${dir} is not a run directory: it has no scenario.json`);
  const scenario = Scenario.parse(JSON.parse(readFileSync(scenarioFile, 'utf8')));
  const summary = existsSync(join(dir, 'summary.json')) ? (JSON.parse(readFileSync(join(dir, 'summary.json'), 'utf8')) as Summary) : undefined;
  const timeline = jsonLines<CallRecord | RecoveryRecord>(join(dir, 'timeline.jsonl'));
  const chaos = existsSync(join(dir, 'chaos.json')) ? (JSON.parse(readFileSync(join(dir, 'chaos.json'), 'utf8')) as { kills: KillRecord[]; unfired?: UnfiredRecord[] }) : undefined;
  const plan = resolvePlan(scenario);
  const html = renderReport({
    title: `ferry run ${summary?.run ?? scenario.name ?? ''}`,
    plan: planRows(plan),
    devices: scenario.cluster.nodes * scenario.cluster.devices_per_node,
    devicesPerNode: scenario.cluster.devices_per_node,
    summary,
    metrics: jsonLines<Metrics>(join(dir, 'metrics.jsonl')),
    calls: timeline.filter((t): t is CallRecord => t.type === 'call'),
    recoveries: timeline.filter((t): t is RecoveryRecord => t.type === 'recovery'),
    kills: chaos?.kills ?? [],
    unfired: chaos?.unfired ?? [],
    episodes: jsonLines<{ iteration: number; episodes: EpisodeRecordWire[] }>(join(dir, 'episodes.jsonl')),
    estimate: estimateOf(scenario),
  });
  const out = join(dir, 'report.html');
  writeFileSync(out, html);
  return out;
}
