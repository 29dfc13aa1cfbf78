// The decision of an elastic run that lost devices for good: a plan on the devices left, searched
// within the scenario's budget (plan/replan.ts: warm-started from the current plan, ranked by the
// migration plus the remaining iterations × the period), as the run spec the supervisor goes on
// with and the record it writes ahead to the run's store before acting on it.
import type { ReplanRecord } from '../../mesh/wire/index.ts';
import { candidateOf, loadLocalProfile, localProfileFile, problemOf } from '../runtime/plan/problem.ts';
import { replan } from '../runtime/plan/replan.ts';
import { evaluationsFor } from '../runtime/plan/search.ts';
import { withPlan } from '../runtime/scenario/scenario.ts';
import type { RunSpec } from '../runtime/run/run.ts';
import { runSpec } from '../runtime/run/run.ts';
import type { LossTrigger } from '../../mesh/wire/index.ts';

/** Devices lost for good, why, and when the supervisor heard it. */
export interface Loss {
  devices: number[];
  trigger: LossTrigger;
  reason: string;
}

export type Placements = ReplanRecord['plan_after'];

/** A spec's plan as a scenario's `plan:` writes it. */
export const placementsOf = (r: RunSpec): Placements => Object.fromEntries(Object.values(r.plan).map((p) => [p.call, { mesh: p.mesh, dp: p.dp, tp: p.tp, pp: p.pp }]));

/** The spec of the run on another plan: the same run (its reward service too), the plan replaced. */
export function specOnPlan(r: RunSpec, plan: Placements): RunSpec {
  return { ...runSpec(withPlan(r.scenario, plan)), rewardService: r.rewardService };
}

/**
 * The plan for the rest of the run once `loss` has happened. `lostBefore`: the devices the run
 * had lost already (the current plan does not use them); `iteration`: the one the run goes on
 * from (the last snapshot's next). Throws ReplanError where no plan fits what is left.
 */
export function decideReplan(r: RunSpec, lostBefore: readonly number[], loss: Loss, iteration: number): { spec: RunSpec; record: ReplanRecord } {
  const s = r.scenario;
  const file = s.cluster.device === 'local' ? localProfileFile() : undefined;
  const problem = problemOf(s, file ? loadLocalProfile(file) : undefined);
  const budget = s.elastic?.search_seconds ?? 2;
  const remaining = Math.max(0, s.rl.iterations - iteration);
  const out = replan(
    { ...problem, cluster: { ...problem.cluster, lost: [...lostBefore] } },
    candidateOf(s),
    { lost: loss.devices },
    { remaining, search: { evaluations: evaluationsFor(budget), seed: s.seed } },
  );
  const plan: Placements = Object.fromEntries(Object.entries(out.plan).map(([call, p]) => [call, { mesh: p.mesh, dp: p.dp, tp: p.tp, pp: p.pp }]));
  return {
    spec: specOnPlan(r, plan),
    record: {
      iteration,
      trigger: loss.trigger,
      lost: [...loss.devices],
      reason: loss.reason,
      search_seconds: out.search.seconds,
      plans_evaluated: out.search.evaluated,
      plan_before: placementsOf(r),
      plan_after: plan,
      estimated_period_before: out.period.before,
      estimated_period_after: out.period.after,
      estimated_migration_seconds: out.migration.seconds,
      minimum_bytes: out.migration.minimumBytes,
      snapshot_only_bytes: out.migration.snapshotBytes,
      why: out.why,
    },
  };
}
