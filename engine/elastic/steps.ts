// The supervisor's re-plan steps (supervisor.machine.ts's `replanning` state invokes them): decide
// and write the decision ahead, migrate onto it; and what the machine derives from its re-plans.
import type { ReplanRecord } from '../../mesh/wire/index.ts';
import { median, type Summary } from '../runtime/index.ts';
import { planDevices, type RunSpec } from '../runtime/index.ts';
import type { Progress, RunStore } from '../runtime/index.ts';
import { restoreDevices, type RestoreInput } from '../runtime/index.ts';
import { specOnPlan, type Loss } from './decide.ts';
import { migrateToPlan, type SnapshotRead } from './migrate.ts';
import { decideOffThread } from './search-thread.ts';

/** Devices lost for good after a re-plan onto `spec`: those `loss` lost, and those lost before that the new plan does not take back. */
export const lostAfter = (before: readonly number[], spec: RunSpec, loss: Pick<Loss, 'devices'>): number[] => [...before.filter((d) => !planDevices(spec).includes(d)), ...loss.devices];

/** The plan for the devices with a worker, searched in the search thread; a changed plan is written ahead to the run's store before anything acts on it. */
export async function decideAndWriteAhead(input: { r: RunSpec; store: RunStore; lost: number[]; spares: number[]; loss: Loss; at: number; progress: Progress; measuredPeriod?: number }) {
  const decided = await decideOffThread(input.r, input.spares, input.loss, input.progress.iteration, input.measuredPeriod);
  const { spec, changed } = decided;
  const record = { ...decided.record, at: input.at };
  const replans = [...(input.progress.replans ?? []), record];
  if (changed) await input.store.saveProgress({ ...input.progress, plan: record.plan_after, lost: lostAfter(input.lost, spec, input.loss), replans });
  return { spec, record, changed };
}

/** What a migration onto a new plan gives back: setup's figures, the snapshot gone back to, and (with a snapshot) what it moved and whether the parameters came through equal. */
export interface MigrationOutput {
  parameters: Record<string, number>;
  rewardModel?: Summary['reward_model'];
  warmup?: Summary['warmup'];
  snapshot: number;
  migration?: { seconds: number; bytes: number; minimumBytes: number; equal: boolean };
  /** The snapshot's bytes sent to devices, and those a survivor held already (the recovery entry's). */
  bytes?: number;
  keptBytes?: number;
}

/** The last snapshot onto the new plan, checked bit for bit (migrate.ts); with none yet, setup on it. */
export async function migrateOrSetUp(input: RestoreInput & { from: RunSpec; lost: number[]; ahead?: Promise<SnapshotRead | undefined> }): Promise<MigrationOutput> {
  if (input.snapshot === undefined) {
    const out = await restoreDevices(input);
    return { parameters: out.parameters, rewardModel: out.rewardModel, warmup: out.warmup, snapshot: out.snapshot };
  }
  const m = await migrateToPlan({ ...input, snapshot: input.snapshot });
  return {
    parameters: m.parameters,
    rewardModel: m.rewardModel,
    warmup: m.warmup,
    snapshot: m.snapshot,
    migration: m,
    bytes: m.bytes,
    ...(m.keptBytes === undefined ? {} : { keptBytes: m.keptBytes }),
  };
}

/**
 * The number of the plan the run is on: 0 for the scenario's, n after the n-th re-plan that changed
 * it (one that kept the plan keeps its number). Each plan keeps its own stage records
 * (runtime/store/plan-stages.ts).
 */
export const planNumber = (replans: readonly Pick<ReplanRecord, 'changed'>[]): number => replans.filter((r) => r.changed).length;

/** Where the supervisor a run is taken over from died between a re-plan's decision and the end of its migration: when the loss was heard, and the plan before it. */
export function unfinishedMigration(takeOver: Progress | undefined, spec: RunSpec): { lossAt?: number; from?: RunSpec } {
  const last = takeOver?.replans?.at(-1);
  if (!last || last.migration_seconds !== undefined || last.seconds !== undefined) return {};
  return { lossAt: last.at ?? Date.now(), from: specOnPlan(spec, last.plan_before) };
}

/** When the supervisor began an iteration (again, after a recovery or a re-plan). */
export interface IterationStart {
  iteration: number;
  /** Milliseconds since the epoch. */
  at: number;
}

/**
 * Each iteration's period, wall-clock: from its last start to the start of the one after it — its
 * calls, its snapshot and the supervisor's writes at the boundary, what a plan's estimated period
 * prices. An iteration that was not followed by the next (the run's last, one a recovery began
 * again) has none.
 */
export function iterationPeriods(starts: readonly IterationStart[]): Array<{ iteration: number; seconds: number }> {
  const out: Array<{ iteration: number; seconds: number }> = [];
  for (let i = 0; i + 1 < starts.length; i++) {
    const [a, b] = [starts[i]!, starts[i + 1]!];
    if (b.iteration === a.iteration + 1) out.push({ iteration: a.iteration, seconds: (b.at - a.at) / 1000 });
  }
  return out;
}

/** Periods recentPeriod takes the median of, at most: the machine's speed of the last minute or so, not of the run's start. */
const RECENT = 5;

/**
 * The period the current plan runs at now: the median of the last RECENT periods of iterations
 * from `since` (the plan's first), leaving out each iteration that began a run of them (the first
 * after the supervisor started, after a recovery or a migration: it warms up the shapes and the
 * kernels). Undefined where there is none.
 */
export function recentPeriod(starts: readonly IterationStart[], since: number): number | undefined {
  const periods: number[] = [];
  // starts[0] always began a run of iterations.
  for (let i = 1; i + 1 < starts.length; i++) {
    const [before, start, next] = [starts[i - 1]!, starts[i]!, starts[i + 1]!];
    if (start.iteration < since || before.iteration !== start.iteration - 1 || next.iteration !== start.iteration + 1) continue;
    periods.push((next.at - start.at) / 1000);
  }
  return median(periods.slice(-RECENT)) ?? undefined;
}

/**
 * Each re-plan with the period measured after it: the median of the periods (iterationPeriods) of
 * the iterations it ran, up to the next re-plan. A supervisor that took the run over measures the
 * iterations it began.
 */
export function measuredPeriods(replans: readonly ReplanRecord[], starts: readonly IterationStart[]): Summary['replans'] {
  const periods = iterationPeriods(starts);
  return replans.map((r, i) => {
    const until = replans[i + 1]?.iteration ?? Number.POSITIVE_INFINITY;
    const measured = median(periods.filter((p) => p.iteration >= r.iteration && p.iteration < until).map((p) => p.seconds));
    return { ...r, ...(typeof measured === 'number' ? { measured_period_after: measured } : {}) };
  });
}
