// The planner's choice of in-flight weight updates (rl.inflight) for a free-running run: the
// chosen plan priced again in flight with `keep` (PipelineRL's: the switch costs the bus's
// crossings and no pass), and taken where it costs at most INFLIGHT_MAX_COST of the period — the
// tokens drawn after a switch are one update younger for that. `recompute` is the user's to ask
// for (it costs a pass of the rows in flight, priced when the scenario says it).
import type { Scenario } from '../scenario/scenario.ts';
import type { DeviceProfile } from './catalog.ts';
import type { LagPlan } from './lag.ts';
import { Evaluator, type Problem } from './planner.ts';
import { problemOf } from './problem.ts';

/** In flight is chosen where it makes the period at most this much longer. */
export const INFLIGHT_MAX_COST = 0.01;

export interface InflightChoice {
  kv: 'keep';
  /** Whether the planner takes it. */
  chosen: boolean;
  /** The chosen plan's period in flight (Infinity where the plan cannot take it). */
  seconds: number;
  /** The pause of a generation's switch of version (the most of the plan's generations). */
  switchSeconds: number;
  why: string;
}

/**
 * In flight on `chosen`, for a free-running scenario not in flight already, at a lag (η) > 0, that
 * generates without an environment; undefined where it does not apply.
 */
export function inflightChoice(s: Scenario, chosen: Pick<LagPlan, 'lag' | 'plan' | 'evaluation'> & { problem?: Problem }, local?: DeviceProfile): InflightChoice | undefined {
  if (chosen.lag === 0 || s.rl.staleness === 0 || s.rl.inflight || s.environment) return undefined;
  // The very problem the plan was chosen on (its slots where the search chose continuous generation), in flight.
  const base = chosen.problem ?? problemOf(s, local, chosen.lag);
  const ev = new Evaluator({ ...base, workload: { ...base.workload, inflight: 'keep' } }).evaluate(chosen.plan, true);
  if (!ev.feasible) return { kv: 'keep', chosen: false, seconds: Infinity, switchSeconds: Number.NaN, why: `in flight does not fit this plan: ${ev.why}` };
  const switchSeconds = Math.max(0, ...Object.values(ev.calls).map((c) => c.switchSeconds ?? 0));
  // Its period is the plan's, or longer where the switch lengthens it (the simulator's schedule of
  // a longer generation can come out a hair shorter; that is no gain of in flight's).
  const seconds = Math.max(ev.iterationSeconds, chosen.evaluation.iterationSeconds);
  const cost = seconds / chosen.evaluation.iterationSeconds - 1;
  const share = `${(100 * cost).toFixed(2)}% of the period (a generation's switch ${(1000 * switchSeconds).toPrecision(3)} ms)`;
  const ok = cost <= INFLIGHT_MAX_COST;
  return {
    kv: 'keep',
    chosen: ok,
    seconds,
    switchSeconds,
    why: ok
      ? `in flight (rl.inflight, keep) costs ${share}: the tokens drawn after a switch are one update younger for that`
      : `in flight (rl.inflight, keep) would cost ${share}, more than the ${100 * INFLIGHT_MAX_COST}% it is worth`,
  };
}
