// The decision of an elastic run whose devices changed for good: lost (cordoned, past the restart
// intensity, not back within the grace period, a chaos event) or joined (workers for devices the
// plan does not use). A plan on the devices that have a worker, searched within the scenario's
// budget (plan/replan.ts: warm-started from the current plan, ranked by the migration plus the
// remaining iterations × the period; after a join the current plan stays unless the gain pays for
// the migration), as the run spec the supervisor goes on with and the record it writes ahead to
// the run's store before acting on it.
import { deviceCount } from '../../mesh/parallel/index.ts';
import type { ReplanRecord, ReplanTrigger } from '../../mesh/wire/index.ts';
import { candidateOf, loadLocalProfile, localProfileFile, problemOf } from '../runtime/index.ts';
import { Evaluator, type Problem } from '../runtime/index.ts';
import { scaledProfile } from '../runtime/index.ts';
import { replan } from '../runtime/index.ts';
import { evaluationsFor } from '../runtime/index.ts';
import { planDevices, runSpec, type RunSpec } from '../runtime/index.ts';
import { withPlan } from '../runtime/index.ts';

/** What changed: devices lost for good, devices whose workers joined beyond the plan; why. */
export interface Loss {
  devices: number[];
  joined?: number[];
  trigger: ReplanTrigger;
  reason: string;
}

export type Placements = ReplanRecord['plan_after'];

/** The run as a planning problem, priced with this machine's profile where its devices are local. */
export function problemFor(r: RunSpec): Problem {
  const s = r.scenario;
  const file = s.cluster.device === 'local' ? localProfileFile() : undefined;
  return problemOf(s, file ? loadLocalProfile(file) : undefined);
}

/** A spec's plan as a scenario's `plan:` writes it. */
export const placementsOf = (r: RunSpec): Placements => Object.fromEntries(Object.values(r.plan).map((p) => [p.call, { mesh: p.mesh, dp: p.dp, tp: p.tp, pp: p.pp }]));

/** The spec of the run on another plan: the same run (its reward service too), the plan replaced. */
export function specOnPlan(r: RunSpec, plan: Placements): RunSpec {
  return { ...runSpec(withPlan(r.scenario, plan)), rewardService: r.rewardService };
}

/**
 * The problem priced at the machine's speed now: where the run measured the current plan's period
 * (recentPeriod), the profile scaled by that period ÷ the plan's estimate. Every cost scales alike,
 * so the plans rank as they did; what changes is what the estimates say the seconds will be. A
 * shared machine runs a fifth or more slower or faster within minutes than when it was profiled.
 */
export function atMachineSpeed(r: RunSpec, problem: Problem, measuredPeriod: number | undefined): { problem: Problem; speed?: number } {
  if (measuredPeriod === undefined) return { problem };
  const estimated = new Evaluator(problem).evaluate(candidateOf(r.scenario)).iterationSeconds;
  if (!(estimated > 0 && Number.isFinite(estimated))) return { problem };
  const speed = measuredPeriod / estimated;
  return { problem: { ...problem, device: scaledProfile(problem.device, speed) }, speed };
}

/**
 * The plan for the rest of the run once `loss` has happened. `spares`: devices whose workers
 * joined earlier and that the plan does not use (offered to the search again with the change);
 * `iteration`: the one the run goes on from; `measuredPeriod`: the current plan's period as the
 * run measured it lately (atMachineSpeed), if it did. The search sees only devices with a worker:
 * the plan's, the spares and the newly joined. Throws ReplanError where no plan fits what is left.
 */
export function decideReplan(
  r: RunSpec,
  spares: readonly number[],
  loss: Loss,
  iteration: number,
  fitted = problemFor(r),
  measuredPeriod?: number,
): { spec: RunSpec; record: ReplanRecord; changed: boolean } {
  const s = r.scenario;
  const t0 = performance.now();
  const { problem, speed } = atMachineSpeed(r, fitted, measuredPeriod);
  // Pricing the current plan at the machine's speed is part of the search's time.
  const pricing = (performance.now() - t0) / 1000;
  const budget = s.elastic?.search_seconds ?? 2;
  const remaining = Math.max(0, s.rl.iterations - iteration);
  // To the planner, every device the plan does not use is lost; those with a worker come back as joined.
  const used = planDevices(r);
  const unused = Array.from({ length: deviceCount(problem.cluster) }, (_, d) => d).filter((d) => !used.includes(d));
  const joined = [...new Set([...spares, ...(loss.joined ?? [])])].filter((d) => !loss.devices.includes(d) && unused.includes(d));
  const out = replan(
    { ...problem, cluster: { ...problem.cluster, lost: unused } },
    candidateOf(s),
    { lost: loss.devices, joined },
    { remaining, search: { evaluations: evaluationsFor(budget), seed: s.seed } },
  );
  const plan: Placements = Object.fromEntries(Object.entries(out.plan).map(([call, p]) => [call, { mesh: p.mesh, dp: p.dp, tp: p.tp, pp: p.pp }]));
  return {
    spec: out.changed ? specOnPlan(r, plan) : r,
    changed: out.changed,
    record: {
      iteration,
      trigger: loss.trigger,
      lost: [...loss.devices],
      joined: [...(loss.joined ?? [])],
      reason: loss.reason,
      changed: out.changed,
      gain_seconds: out.gainSeconds,
      search_seconds: out.search.seconds + pricing,
      plans_evaluated: out.search.evaluated,
      plan_before: placementsOf(r),
      plan_after: plan,
      estimated_period_before: out.period.before,
      estimated_period_after: out.period.after,
      estimated_migration_seconds: out.migration.seconds,
      ...(speed === undefined ? {} : { measured_period_before: measuredPeriod, machine_speed: speed }),
      minimum_bytes: out.migration.minimumBytes,
      snapshot_only_bytes: out.migration.snapshotBytes,
      why: out.why,
    },
  };
}
