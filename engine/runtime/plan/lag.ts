// The planner's choice of asynchrony: for each lag k it may use, the best plan at that lag (the
// search places the rollout calls and the training where they pay: on devices of their own, a
// rollout pool and a train pool, or sharing all of them), priced by the simulator's pipeline; then
// the fastest, unless asynchrony does not pay enough over the best lock-step plan to be worth its
// stale rollouts — then lock-step (NeMo-RL's 16-GB200 runs were 0.73× with it). The lags' searches
// share one budget of evaluations (chooseLag).
import { graphOf, type CallName, type Scenario } from '../scenario/scenario.ts';
import type { DeviceProfile } from './catalog.ts';
import { PLACEMENTS, Evaluator, callCandidates, callNames, namedPlan, type Candidate, type Evaluation, type Placement, type Problem } from './planner.ts';
import { atLag, problemOf } from './problem.ts';
import { budgetOf, planKey, search, shareBudget, type SearchOptions } from './search.ts';

/**
 * Asynchrony is chosen only when it makes an iteration at least this much faster: stale rollouts
 * cost some learning per iteration (the decoupled loss corrects the gradient, not the lost
 * freshness), so a few percent of speed is not worth them.
 */
export const ASYNC_MIN_SPEEDUP = 1.1;

/** Lags whose periods are within this share of each other are as fast: the smallest is chosen. */
export const LAG_TIE = 0.005;

export interface LagPlan {
  lag: number;
  /**
   * Whether its generations decode continuously (rl.slots), with `slots` rows a replica (as many as
   * its KV cache holds); none: by waves, as the scenario says.
   */
  slots?: number;
  problem: Problem;
  evaluator: Evaluator;
  plan: Candidate;
  evaluation: Evaluation;
  /**
   * The search's own figures (none for a named placement): `evaluations` its share of the budget,
   * `evaluated` those it used (the plans carried from other lags included), `found` the best few
   * plans it kept, fastest first.
   */
  search?: { seed: number; seconds: number; evaluations: number; evaluated: number; accepted: number; found: Candidate[] };
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
  /** The budget the lags' searches shared, and the evaluations they used together (0 and 0 for a named placement). */
  evaluations: number;
  evaluated: number;
  /** Wall seconds of every lag's search together: for information only. */
  seconds: number;
}

const placementKey = (p: Placement) => `${p.mesh}/${p.dp}/${p.tp}/${p.pp}`;

/**
 * A plan found at another lag as a plan of `problem`: each call keeps its placement; a call the
 * plan lacks (the proximal pass, which only a lag has) takes that of another call of its model
 * (its training's first) where that placement is one of the call's own, else `fallback`'s.
 */
export function carryPlan(problem: Problem, plan: Candidate, fallback: Candidate): Candidate {
  const out: Candidate = {};
  for (const call of callNames(problem)) {
    if (plan[call]) {
      out[call] = plan[call];
      continue;
    }
    const info = problem.graph.calls.find((c) => c.name === call)!;
    const own = new Map(callCandidates(problem, call).map((p) => [placementKey(p), p]));
    const siblings = problem.graph.calls
      .filter((c) => c.model === info.model && c.name !== call && plan[c.name])
      .sort((a, b) => Number(b.kind === 'train') - Number(a.kind === 'train'))
      .map((c): CallName => c.name);
    const from = siblings.map((c) => own.get(placementKey(plan[c]!))).find((p) => p !== undefined);
    out[call] = from ?? fallback[call]!;
  }
  return out;
}

/**
 * The best plan at one lag: a search from the named placements, or one of them by name. `from`:
 * plans found at other lags (carryPlan), which the search starts from too, among the named ones
 * by their time at this lag; pricing them counts against the search's evaluations.
 */
export function planAtLag(s: Scenario, lag: number, o: { local?: DeviceProfile; placement?: string; search: SearchOptions; from?: readonly Candidate[] }): LagPlan {
  const problem = problemOf(s, o.local, lag);
  const evaluator = new Evaluator(problem);
  if (o.placement && o.placement !== 'search') {
    const plan = namedPlan(evaluator, o.placement as (typeof PLACEMENTS)[number]);
    return { lag, problem, evaluator, plan, evaluation: evaluator.evaluate(plan, true) };
  }
  const t0 = performance.now();
  const evaluations = budgetOf(o.search);
  const named = PLACEMENTS.map((n) => namedPlan(evaluator, n)).sort((a, b) => evaluator.objective(a) - evaluator.objective(b));
  let starts = named;
  let carried = 0;
  if (o.from?.length) {
    const seen = new Set(named.map(planKey));
    const plans: Candidate[] = [];
    for (const p of o.from) {
      const c = carryPlan(problem, p, named[0]!);
      if (!seen.has(planKey(c))) plans.push(c);
      seen.add(planKey(c));
    }
    // The search keeps one evaluation for itself at least.
    const priced = plans.slice(0, Math.max(0, evaluations - 1)).map((plan) => ({ plan, time: evaluator.objective(plan) }));
    carried = priced.length;
    // Stable: a carried plan goes after the named ones it ties with.
    starts = [...named.map((plan) => ({ plan, time: evaluator.objective(plan) })), ...priced].sort((a, b) => a.time - b.time).map((x) => x.plan);
  }
  const r = search(evaluator, starts, { ...o.search, evaluations: Math.max(1, evaluations - carried) });
  const plan = r.best[0]?.plan ?? starts[0]!;
  const found = r.best.map((b) => b.plan);
  return {
    lag,
    problem,
    evaluator,
    plan,
    evaluation: evaluator.evaluate(plan, true),
    search: { seed: r.seed, seconds: (performance.now() - t0) / 1000, evaluations, evaluated: r.evaluated + carried, accepted: r.accepted, found },
  };
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

/**
 * Each lag's best plan, and the choice between them. The searches share one budget, the search
 * options' (`evaluations`, or `budgetSeconds` at EVALUATIONS_PER_SECOND), whatever the number of
 * lags: lock-step first, then each lag in turn, each with an equal share of what is left
 * (shareBudget: what a search leaves unspent goes to those after it). Equal, because the choice
 * sets the best lag against the best lock-step plan, so both sides need estimates as good. Each
 * lag's search starts from the named plans and from the best few plans of the lag before it
 * (carried over: a plan at lag k − 1 is one at lag k, where the pipeline can only wait less), so
 * it need not find them again with its smaller share.
 */
export function chooseLag(s: Scenario, lags: readonly number[], o: { local?: DeviceProfile; placement?: string; search: SearchOptions }): LagChoice {
  const searching = !o.placement || o.placement === 'search';
  const evaluations = searching ? budgetOf(o.search) : 0;
  const t0 = performance.now();
  // Where continuous generation can change the estimate, the search tries it at every lag, after
  // lock-step by waves (today's run, the baseline): its samples are those of decoding by waves,
  // bit for bit, so it costs no learning, and where it is faster it is chosen at any lag.
  const continuous = searching && s.rl.slots === 0 && continuousApplies(s);
  const variants = continuous ? [{ lag: 0, continuous: false }, ...lags.map((lag) => ({ lag, continuous: true }))] : lags.map((lag) => ({ lag, continuous: false }));
  const tried: LagPlan[] = [];
  shareBudget(evaluations, variants.length, (i, share) => {
    const before = tried.at(-1)?.search?.found;
    const v = variants[i]!;
    const at: Scenario = v.continuous ? { ...s, rl: { ...s.rl, slots: AS_MANY_AS_FIT } } : s;
    const t = planAtLag(at, v.lag, { ...o, search: { ...o.search, evaluations: share }, ...(before?.length ? { from: before } : {}) });
    const slots = v.continuous || s.rl.slots > 0 ? generationSlots(t.evaluation) : undefined;
    tried.push(slots !== undefined ? { ...t, slots } : t);
    return { evaluated: t.search?.evaluated ?? 0 };
  });
  const total = { evaluations, evaluated: tried.reduce((a, t) => a + (t.search?.evaluated ?? 0), 0), seconds: (performance.now() - t0) / 1000 };
  const byTime = (xs: LagPlan[]) => xs.filter((t) => t.evaluation.feasible).sort((a, b) => a.evaluation.iterationSeconds - b.evaluation.iterationSeconds);
  if (!searching) {
    // A named placement, priced at the scenario's own lag (the only one tried), against the same
    // placement lock-step.
    const own = tried[0]!;
    const sync = own.lag === 0 ? own : planAtLag(s, 0, o);
    const speedup = own.evaluation.feasible && sync.evaluation.feasible ? sync.evaluation.iterationSeconds / own.evaluation.iterationSeconds : Number.NaN;
    const at = asynchronyOf(s, own.lag);
    if (!own.evaluation.feasible) return { ...total, chosen: own, sync, tried, speedup, why: `the scenario's own ${at}, at which a named placement is priced: infeasible: ${own.evaluation.why}` };
    return {
      ...total,
      chosen: own,
      sync,
      tried,
      speedup,
      why: `the scenario's own ${at}, at which a named placement is priced${own.lag === 0 ? '' : `: ${speedup.toFixed(2)}× the same placement lock-step`}`,
    };
  }
  const sync = tried.find((t) => t.lag === 0)!;
  // Lock-step at its best: by waves, or continuously where that is faster.
  const lockstep = byTime(tried.filter((t) => t.lag === 0))[0] ?? sync;
  const mode = (t: LagPlan) => (t.slots !== undefined && s.rl.slots === 0 ? `, generating continuously (rl.slots ${t.slots})` : '');
  // The fastest lag, or a smaller one as fast (within LAG_TIE): its rollouts are fresher for nothing.
  const stale = byTime(tried.filter((t) => t.lag > 0));
  const fastest = stale.filter((t) => t.evaluation.iterationSeconds <= stale[0]!.evaluation.iterationSeconds * (1 + LAG_TIE)).sort((a, b) => a.lag - b.lag)[0];
  const speedupOf = (t: LagPlan) => (t === sync ? 1 : sync.evaluation.iterationSeconds / t.evaluation.iterationSeconds);
  const kept = lockstep === sync ? 'lock-step kept' : `lock-step kept${mode(lockstep)}, ${speedupOf(lockstep).toFixed(2)}× decoding by waves`;
  const choice = (chosen: LagPlan, why: string): LagChoice => ({ ...total, chosen, sync, tried, speedup: speedupOf(chosen), why });
  if (!fastest) {
    if (lockstep !== sync) return choice(lockstep, `${kept}: no plan at a lag fits, or the algorithm cannot run stale`);
    return choice(lockstep, lags.length > 1 ? 'no plan at a lag fits' : 'lock-step only (the algorithm cannot run stale, or the run is too short)');
  }
  const gain = lockstep.evaluation.iterationSeconds / fastest.evaluation.iterationSeconds;
  if (!lockstep.evaluation.feasible || gain >= ASYNC_MIN_SPEEDUP) {
    const over = lockstep === sync ? '' : ` and ${gain.toFixed(2)}× the best lock-step plan${mode(lockstep)}`;
    return choice(
      fastest,
      `${staleAt(s, fastest.lag)}${mode(fastest)} is ${speedupOf(fastest).toFixed(2)}× the best lock-step plan by waves${over} (at least ${ASYNC_MIN_SPEEDUP}× pays for stale rollouts)`,
    );
  }
  return choice(
    lockstep,
    `${kept}: the best ${s.rl.staleness > 0 ? 'η' : 'lag'} (${fastest.lag}) would be ${gain.toFixed(2)}×${lockstep === sync ? '' : ' that'}, less than the ${ASYNC_MIN_SPEEDUP}× that pays for stale rollouts`,
  );
}

/**
 * How a scenario runs stale at `lag`, as its keys say it: `rl.lag k`, or free-running
 * `rl.staleness k` (in flight, and what it does with the old version's keys and values, where it
 * is); `lock-step` at 0.
 */
export function asynchronyOf(s: Scenario, lag: number): string {
  if (lag === 0) return 'lock-step';
  if (s.rl.staleness === 0) return `rl.lag ${lag}`;
  return `rl.staleness ${lag}${s.rl.inflight ? `, in flight (rl.inflight_kv ${s.rl.inflight_kv})` : ''}`;
}

/** The same in a sentence: `lag k`, or `η k, free-running` (in flight where it is). */
function staleAt(s: Scenario, lag: number): string {
  if (s.rl.staleness === 0) return `lag ${lag}`;
  return `η ${lag}, free-running${s.rl.inflight ? ' in flight' : ''}`;
}

/** Slots beyond any KV cache's: a generation then decodes continuously with as many rows as its cache holds. */
const AS_MANY_AS_FIT = Number.MAX_SAFE_INTEGER;

/**
 * Whether continuous generation can change a scenario's estimate: it samples (no pairs), plays no
 * episodes, and its responses end before the budget (lengths.response_mean), so that rows end at
 * different steps.
 */
export function continuousApplies(s: Scenario): boolean {
  if (s.environment || s.lengths.response_mean === undefined) return false;
  try {
    return graphOf(s).source !== 'pairs';
  } catch {
    return false;
  }
}

/**
 * The slots of a plan's generations: the fewest rows any generation decodes at once per replica;
 * none where a generation runs on several stages (continuous decoding runs on one).
 */
function generationSlots(ev: Evaluation): number | undefined {
  const gens = Object.values(ev.calls).filter((c) => c.slots !== undefined);
  if (!gens.length || gens.some((c) => c.placement.pp > 1)) return undefined;
  return Math.min(...gens.map((c) => c.slots!));
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
