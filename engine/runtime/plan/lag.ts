// The planner's choice of asynchrony: for each lag k it may use, the best plan at that lag (the
// search places the rollout calls and the training where they pay: on devices of their own, a
// rollout pool and a train pool, or sharing all of them), priced by the simulator's pipeline; then
// the fastest, unless asynchrony does not pay enough over the best lock-step plan to be worth its
// stale rollouts — then lock-step (NeMo-RL's 16-GB200 runs were 0.73× with it).
import { graphOf, type Scenario } from '../scenario/scenario.ts';
import type { DeviceProfile } from './catalog.ts';
import { PLACEMENTS, Evaluator, namedPlan, type Candidate, type Evaluation, type Problem } from './planner.ts';
import { atLag, problemOf } from './problem.ts';
import { search, type SearchOptions } from './search.ts';

/**
 * Asynchrony is chosen only when it makes an iteration at least this much faster: stale rollouts
 * cost some learning per iteration (the decoupled loss corrects the gradient, not the lost
 * freshness), so a few percent of speed is not worth them.
 */
export const ASYNC_MIN_SPEEDUP = 1.1;

export interface LagPlan {
  lag: number;
  problem: Problem;
  evaluator: Evaluator;
  plan: Candidate;
  evaluation: Evaluation;
  /** The search's own figures (none for a named placement). */
  search?: { seed: number; seconds: number; evaluated: number; accepted: number };
}

export interface LagChoice {
  chosen: LagPlan;
  /** The best lock-step plan. */
  sync: LagPlan;
  /** The best plan at each lag tried, lock-step first. */
  tried: LagPlan[];
  /** The best lock-step plan's period over the chosen one's. */
  speedup: number;
  /** Why the chosen lag, in a sentence. */
  why: string;
}

/** The best plan at one lag: a search from the named placements, or one of them by name. */
export function planAtLag(s: Scenario, lag: number, o: { local?: DeviceProfile; placement?: string; search: SearchOptions }): LagPlan {
  const problem = problemOf(s, o.local, lag);
  const evaluator = new Evaluator(problem);
  if (o.placement && o.placement !== 'search') {
    const plan = namedPlan(evaluator, o.placement as (typeof PLACEMENTS)[number]);
    return { lag, problem, evaluator, plan, evaluation: evaluator.evaluate(plan, true) };
  }
  const starts = PLACEMENTS.map((n) => namedPlan(evaluator, n)).sort((a, b) => evaluator.objective(a) - evaluator.objective(b));
  const r = search(evaluator, starts, o.search);
  const plan = r.best[0]?.plan ?? starts[0]!;
  return { lag, problem, evaluator, plan, evaluation: evaluator.evaluate(plan, true), search: { seed: r.seed, seconds: r.seconds, evaluated: r.evaluated, accepted: r.accepted } };
}

/** The lags a scenario may use: 0, and 1..max below its iterations where its graph can run stale. */
export function lagsFor(s: Scenario, max: number): number[] {
  const out = [0];
  for (let k = 1; k <= max && k < s.rl.iterations; k++) {
    try {
      graphOf(atLag(s, k));
      out.push(k);
    } catch {
      break; // an algorithm of pairs, or a generation that reads what its iteration computes
    }
  }
  return out;
}

/** Each lag's best plan, and the choice between them. */
export function chooseLag(s: Scenario, lags: readonly number[], o: { local?: DeviceProfile; placement?: string; search: SearchOptions }): LagChoice {
  const tried = lags.map((k) => planAtLag(s, k, o));
  const sync = tried.find((t) => t.lag === 0)!;
  const fastest = tried.filter((t) => t.lag > 0 && t.evaluation.feasible).sort((a, b) => a.evaluation.iterationSeconds - b.evaluation.iterationSeconds)[0];
  const speedupOf = (t: LagPlan) => sync.evaluation.iterationSeconds / t.evaluation.iterationSeconds;
  if (!fastest) return { chosen: sync, sync, tried, speedup: 1, why: lags.length > 1 ? 'no plan at a lag fits' : 'lock-step only (the algorithm cannot run stale, or the run is too short)' };
  const gain = speedupOf(fastest);
  if (!sync.evaluation.feasible || gain >= ASYNC_MIN_SPEEDUP) {
    return { chosen: fastest, sync, tried, speedup: gain, why: `lag ${fastest.lag} is ${gain.toFixed(2)}× the best lock-step plan (at least ${ASYNC_MIN_SPEEDUP}× pays for stale rollouts)` };
  }
  return { chosen: sync, sync, tried, speedup: 1, why: `lock-step kept: the best lag (${fastest.lag}) would be ${gain.toFixed(2)}×, less than the ${ASYNC_MIN_SPEEDUP}× that pays for stale rollouts` };
}

/**
 * Where a plan puts the rollout (the calls that run ahead under a lag: generation and what scores
 * it) and the training: two pools of devices, or shared ones.
 */
export function poolsOf(problem: Problem, plan: Candidate): { rollout: number[]; train: number[]; shared: boolean } {
  const devicesOf = (calls: readonly string[]) => [...new Set(calls.flatMap((c) => plan[c]?.devices ?? []))].sort((a, b) => a - b);
  const gens = problem.graph.calls.filter((c) => c.kind === 'generate').map((c) => c.name);
  const rollout = devicesOf(problem.graph.flow.ahead ?? gens);
  const train = devicesOf(problem.graph.calls.filter((c) => c.kind === 'train').map((c) => c.name));
  return { rollout, train, shared: rollout.some((d) => train.includes(d)) };
}
