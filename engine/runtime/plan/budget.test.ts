// The plan search's one budget: shared by the searches of every lag a plan may use, never more in
// all than the budget, the same for a seed, and each lag's search starting from the plans the lag
// before it found.
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { loadScenario } from '../scenario/scenario.ts';
import { carryPlan, chooseLag, lagsFor, planAtLag } from './lag.ts';
import { smallScenarioText } from './pipeline.fixture.ts';
import { Evaluator, PLACEMENTS, namedPlan } from './planner.ts';
import { DEFAULT_LOCAL_PROFILE, loadLocalProfile, problemOf } from './problem.ts';
import { evaluationsFor, planKey, search, shareBudget } from './search.ts';

const LLAMA7B_8GPU = fileURLToPath(new URL('../../../scenarios/cluster/llama7b-8gpu.yaml', import.meta.url));

describe('shareBudget', () => {
  it('gives each search an equal share of what is left, and what one leaves unspent to those after it', () => {
    const asked: number[] = [];
    // The first uses 700 of its 1000, the second all of its 1150, the last gets the 1150 left.
    const used = [700, Infinity, Infinity];
    shareBudget(3000, 3, (i, evaluations) => {
      asked.push(evaluations);
      return { evaluated: Math.min(used[i]!, evaluations) };
    });
    expect(asked).toEqual([1000, 1150, 1150]);
  });

  it('follows weights, and never gives more in all than the total', () => {
    const asked: number[] = [];
    const runs = shareBudget(
      1001,
      3,
      (_, evaluations) => {
        asked.push(evaluations);
        return { evaluated: evaluations };
      },
      [2, 1, 1],
    );
    expect(asked).toEqual([500, 250, 251]);
    expect(runs.reduce((a, r) => a + r.evaluated, 0)).toBe(1001);
  });

  it('refuses a search that used more than its share', () => {
    expect(() => shareBudget(10, 2, (_, evaluations) => ({ evaluated: evaluations + 1 }))).toThrow(/used 6 evaluations of its share of 5/);
  });
});

describe('one budget for every lag', () => {
  const local = loadLocalProfile(DEFAULT_LOCAL_PROFILE);

  it('a search given fewer evaluations than it has chains evaluates no more than it was given', () => {
    const ev = new Evaluator(problemOf(loadScenario(LLAMA7B_8GPU)));
    const starts = PLACEMENTS.map((n) => namedPlan(ev, n));
    const r = search(ev, starts, { evaluations: 5, seed: 1 });
    expect(r.evaluated).toBeLessThanOrEqual(5);
    expect(r.best.length).toBeGreaterThan(0);
  });

  it('the searches of lock-step and of every lag use at most the budget together, each its share', () => {
    const s = loadScenario(LLAMA7B_8GPU);
    const lags = lagsFor(s, 2);
    expect(lags).toEqual([0, 1, 2]);
    const budget = 1500;
    const c = chooseLag(s, lags, { search: { evaluations: budget, seed: 1 } });
    const used = c.tried.map((t) => t.search!.evaluated);
    expect(used.reduce((a, b) => a + b, 0)).toBeLessThanOrEqual(budget);
    expect(c.evaluations).toBe(budget);
    expect(c.evaluated).toBe(used.reduce((a, b) => a + b, 0));
    // Lock-step first, with its equal share; every lag searched.
    expect(c.tried.map((t) => t.lag)).toEqual([0, 1, 2]);
    expect(c.tried[0]!.search!.evaluations).toBe(500);
    for (const t of c.tried) expect(t.search!.evaluated).toBeGreaterThan(PLACEMENTS.length);
    // A budget in seconds is the same number of evaluations, shared the same way.
    const inSeconds = chooseLag(s, lags, { search: { budgetSeconds: 0.25, seed: 1 } });
    expect(inSeconds.evaluations).toBe(evaluationsFor(0.25));
    expect(inSeconds.evaluated).toBeLessThanOrEqual(evaluationsFor(0.25));
  });

  it('gives the same plans, lag by lag, for the same seed and budget', () => {
    const s = loadScenario(smallScenarioText('budget-seed', 0.1));
    const run = () => chooseLag(s, [0, 1, 2], { local, search: { evaluations: 900, seed: 4 } });
    const [a, b] = [run(), run()];
    const figures = (c: ReturnType<typeof run>) => c.tried.map((t) => ({ lag: t.lag, plan: planKey(t.plan), seconds: t.evaluation.iterationSeconds, evaluated: t.search!.evaluated }));
    expect(figures(b)).toEqual(figures(a));
    expect(b.chosen.lag).toBe(a.chosen.lag);
    expect(a.evaluated).toBeLessThanOrEqual(900);
  });

  it('with lock-step alone, the search has the whole budget: the plan planAtLag finds with it', () => {
    const s = loadScenario(LLAMA7B_8GPU);
    const c = chooseLag(s, [0], { search: { evaluations: 800, seed: 2 } });
    const alone = planAtLag(s, 0, { search: { evaluations: 800, seed: 2 } });
    expect(c.tried[0]!.search!.evaluations).toBe(800);
    expect(planKey(c.chosen.plan)).toBe(planKey(alone.plan));
    expect(c.evaluated).toBe(alone.search!.evaluated);
  });

  it("carries a lock-step plan to a lag: the proximal pass, which only a lag has, goes where its model's training is", () => {
    const s = loadScenario(LLAMA7B_8GPU);
    const sync = new Evaluator(problemOf(s, undefined, 0));
    const lagged = problemOf(s, undefined, 1);
    expect(lagged.graph.calls.map((c) => c.name)).toContain('actor.prox');
    const plan = namedPlan(sync, 'separation');
    const carried = carryPlan(lagged, plan, namedPlan(new Evaluator(lagged), 'colocate'));
    for (const call of Object.keys(plan)) expect(carried[call]).toEqual(plan[call]);
    expect(carried['actor.prox']).toMatchObject({ mesh: plan['actor.train']!.mesh, dp: plan['actor.train']!.dp, tp: plan['actor.train']!.tp, pp: plan['actor.train']!.pp });
  });

  it('a lag searched from the plans of the lag before it is no slower than they are there, and pays for pricing them', () => {
    const s = loadScenario(LLAMA7B_8GPU);
    const before = planAtLag(s, 1, { search: { evaluations: 600, seed: 1 } });
    const found = before.search!.found;
    expect(found.length).toBeGreaterThan(0);
    const next = planAtLag(s, 2, { search: { evaluations: 600, seed: 1 }, from: found });
    const ev = next.evaluator;
    const carriedBest = Math.min(...found.map((p) => ev.objective(p)));
    expect(next.evaluation.iterationSeconds).toBeLessThanOrEqual(carriedBest * (1 + 1e-9));
    expect(next.search!.evaluated).toBeLessThanOrEqual(600);
  });
});
