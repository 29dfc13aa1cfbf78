// The plan search: Metropolis–Hastings over plans, from the named placements, then a descent from
// the best plan found. It is bounded by a number of plan evaluations, not by a clock, so a seed and
// a budget give the same plan on any machine at any load.
import type { CallName } from '../scenario/scenario.ts';
import { callCandidates, callNames, type Candidate, type Evaluator, type Placement } from './planner.ts';

/**
 * Plan evaluations per second of budget: `npm run plan -- FILE --budget S` evaluates S × 4000
 * plans, whatever the machine. Measured once, on the 2-core machine ferry is developed on (Node
 * 20, another benchmark running beside it): `npm run plan -- FILE --json` on each scenario of
 * scenarios/cluster/ at the default 10 s, search_seconds against plans_evaluated. A plan costs
 * more on a larger cluster (its moves' transfer plans, its simulation), so the searches took from
 * 1.6 s (grpo-llama7b-8gpu, about 23,000 plans/s) to 12.5 s (llama70b-128gpu, about 2,900 plans/s):
 * at this rate a budget is about the seconds the largest of them takes.
 */
export const EVALUATIONS_PER_SECOND = 4000;

/** The evaluations a budget of `seconds` buys (a few more than the chains' starts, at least). */
export function evaluationsFor(seconds: number): number {
  return Math.max(16, Math.round(seconds * EVALUATIONS_PER_SECOND));
}

/** The evaluations a search's options allow: `evaluations`, or `budgetSeconds` (10 unless given) at EVALUATIONS_PER_SECOND. */
export function budgetOf(opts: Pick<SearchOptions, 'evaluations' | 'budgetSeconds'>): number {
  return opts.evaluations ?? evaluationsFor(opts.budgetSeconds ?? 10);
}

/**
 * One budget of evaluations shared by several searches run in turn — a plan's lags, and whatever
 * else it chooses by searching each choice apart (a staleness bound, a generation mode): search i
 * gets the evaluations still left times its weight over the weights of the searches still to run
 * (equal weights unless given), and what it leaves unspent (a final descent that ends early) goes
 * to those after it. `run` gets its search's index and evaluations and says how many it used, at
 * most those; so the searches together use at most `total` (when `total` is at least their
 * number: each gets one evaluation at least). Nothing depends on the clock: the same searches and
 * total give the same shares.
 */
export function shareBudget<T extends { evaluated: number }>(total: number, count: number, run: (i: number, evaluations: number) => T, weights?: readonly number[]): T[] {
  const w = (i: number) => weights?.[i] ?? 1;
  const out: T[] = [];
  let left = total;
  for (let i = 0; i < count; i++) {
    let rest = 0;
    for (let j = i; j < count; j++) rest += w(j);
    const share = Math.max(1, Math.floor((left * w(i)) / rest));
    const r = run(i, share);
    if (r.evaluated > share) throw new Error(`a search used ${r.evaluated} evaluations of its share of ${share}`);
    left = Math.max(0, left - r.evaluated);
    out.push(r);
  }
  return out;
}

export interface SearchOptions {
  /** Seconds of budget, turned into evaluations at EVALUATIONS_PER_SECOND; 10 unless given. */
  budgetSeconds?: number;
  /** Plans to evaluate, the starts included; when given, `budgetSeconds` is ignored. */
  evaluations?: number;
  chains?: number;
  seed?: number;
  keep?: number;
  /** Placements each call's moves draw from: its fastest on its own that fit. */
  perCall?: number;
}

export interface SearchResult {
  best: Array<{ plan: Candidate; iterationSeconds: number }>;
  seed: number;
  /** The budget, in plan evaluations. */
  evaluations: number;
  /** Plans evaluated: the budget, or fewer when the final descent ends before it. */
  evaluated: number;
  accepted: number;
  /** Wall seconds the search took: for information only, nothing depends on them. */
  seconds: number;
}

/** A small, seeded generator for the search (mulberry32). */
function random(seed: number) {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 2 ** 32;
  };
}

const placementKey = (p: Placement) => `${p.mesh}/${p.dp}/${p.tp}/${p.pp}`;
/** A plan as a key: its calls' placements, in call order. */
export const planKey = (c: Candidate) =>
  Object.keys(c)
    .sort()
    .map((call) => placementKey(c[call]!))
    .join('|');

/**
 * Each call's moves are drawn from its `perCall` fastest placements that fit on their own (and
 * the placements the chains start from): on large clusters most of the thousands of mesh and
 * strategy pairs are hopeless.
 */
function pools(ev: Evaluator, starts: Candidate[], perCall: number): Record<CallName, Map<string, Placement>> {
  return Object.fromEntries(
    callNames(ev.problem).map((call) => {
      const ranked = callCandidates(ev.problem, call)
        .map((p) => ({ p, c: ev.callCost(call, p, true) }))
        .filter(({ c }) => !c || c.residentBytes + c.transientBytes <= ev.problem.device.memoryBytes)
        .sort((a, b) => (a.c?.seconds ?? 0) - (b.c?.seconds ?? 0))
        .slice(0, perCall)
        .map(({ p }) => p);
      const pool = new Map(ranked.map((p) => [placementKey(p), p]));
      for (const s of starts) if (!pool.has(placementKey(s[call]!))) pool.set(placementKey(s[call]!), s[call]!);
      return [call, pool];
    }),
  );
}

const disjoint = (p: Placement, q: Placement) => p.devices[0]! > q.devices.at(-1)! || q.devices[0]! > p.devices.at(-1)!;

/**
 * The moves and how often each is drawn. One call: `anywhere` in its pool; another `strategy` on
 * its mesh; `follow` another call's placement (a view joins its owner, two models share one);
 * `colocate` on another call's mesh with any strategy. Two calls: `apart`, on devices that do not
 * overlap, to run side by side; `halves`, one on each half of a mesh, or both from neighbouring
 * halves onto the whole; `swap` their placements. `group`: a model's calls move together. A
 * single-call move alone seldom gets two calls from sharing devices to running side by side,
 * since the first step of such a change costs time; `apart` and `halves` take both steps at once.
 */
const MOVES = [
  ['anywhere', 0.4],
  ['strategy', 0.1],
  ['follow', 0.1],
  ['colocate', 0.1],
  ['apart', 0.1],
  ['halves', 0.05],
  ['group', 0.05],
  ['swap', 0.1],
] as const;

function mover(ev: Evaluator, pool: Record<CallName, Map<string, Placement>>, rand: () => number) {
  const calls = callNames(ev.problem);
  const list = Object.fromEntries(calls.map((c) => [c, [...pool[c]!.values()]])) as Record<CallName, Placement[]>;
  const byMesh = Object.fromEntries(
    calls.map((c) => {
      const m = new Map<string, Placement[]>();
      for (const p of list[c]!) m.set(p.mesh, [...(m.get(p.mesh) ?? []), p]);
      return [c, m];
    }),
  ) as Record<CallName, Map<string, Placement[]>>;
  const callsOf = new Map<string, CallName[]>();
  for (const c of ev.problem.graph.calls) callsOf.set(c.model, [...(callsOf.get(c.model) ?? []), c.name]);
  const groups = [...callsOf.values()].filter((g) => g.length > 1);
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)]!;
  /** The call's own copy of a placement, if its pool has it. */
  const own = (call: CallName, p: Placement) => pool[call]!.get(placementKey(p));
  /** A placement of the call's pool on devices first…last: p's tp and pp with `factor` × its replicas if there is one, else any. */
  const scaled = (call: CallName, p: Placement, first: number, last: number, factor: number): Placement | undefined => {
    const on = list[call]!.filter((q) => q.devices[0] === first && q.devices.at(-1) === last);
    return on.find((q) => q.tp === p.tp && q.pp === p.pp && q.dp === p.dp * factor) ?? (on.length ? pick(on) : undefined);
  };

  return (plan: Candidate): Candidate => {
    let r = rand();
    const kind = MOVES.find(([, weight]) => (r -= weight) < 0)?.[0] ?? 'swap';
    const call = pick(calls);
    const other = pick(calls);
    const anywhere = () => ({ ...plan, [call]: pick(list[call]!) });
    const both = (a: Placement | undefined, b: Placement | undefined) => (a && b ? { ...plan, [call]: a, [other]: b } : anywhere());
    const [p, q] = [plan[call]!, plan[other]!];
    if (kind === 'anywhere' || other === call) return anywhere();
    switch (kind) {
      case 'strategy':
        return { ...plan, [call]: pick(byMesh[call]!.get(p.mesh) ?? list[call]!) };
      case 'follow': {
        const same = own(call, q);
        return same ? { ...plan, [call]: same } : anywhere();
      }
      case 'colocate': {
        const near = byMesh[call]!.get(q.mesh);
        return near ? { ...plan, [call]: pick(near) } : anywhere();
      }
      case 'apart': {
        const there = pick(list[call]!);
        const apart = list[other]!.filter((x) => disjoint(there, x));
        return apart.length ? { ...plan, [call]: there, [other]: pick(apart) } : { ...plan, [call]: there };
      }
      case 'halves': {
        const [lo, hi] = [Math.min(p.devices[0]!, q.devices[0]!), Math.max(p.devices.at(-1)!, q.devices.at(-1)!)];
        if (disjoint(p, q) && hi - lo + 1 === p.devices.length + q.devices.length) return both(scaled(call, p, lo, hi, 2), scaled(other, q, lo, hi, 2));
        if (p.devices.length < 2) return anywhere();
        const mid = p.devices[0]! + p.devices.length / 2;
        return both(scaled(call, p, p.devices[0]!, mid - 1, 0.5), scaled(other, q, mid, p.devices.at(-1)!, 0.5));
      }
      case 'group': {
        if (groups.length === 0) return anywhere();
        const group = pick(groups);
        const target = pick(list[pick(group)]!);
        const next = { ...plan };
        for (const c of group) next[c] = own(c, target) ?? next[c]!;
        return next;
      }
      case 'swap':
        return both(own(call, q), own(other, p));
    }
  };
}

/**
 * Metropolis–Hastings over plans: a move (MOVES) changes one call's placement or two together; a
 * worse plan (Δt > 0 seconds) is accepted with probability exp(−Δt / T), T in seconds too, cooled
 * geometrically from 10% to 0.1% of the fastest start's time over nine tenths of the budget.
 * Eight chains start from the named plans (`starts`, fastest first) and take turns; at each
 * quarter, the chain furthest behind restarts from the best plan found (more often, the chains
 * all end in one basin). The last tenth descends from the best plan: every single change of one
 * call, taken when it helps, until none does. The best few feasible plans are kept.
 *
 * Every draw comes from one generator seeded with `seed`, and the budget counts evaluations, so
 * the same problem, starts, seed and budget give the same result on any machine, whatever the
 * evaluator has cached.
 */
export function search(ev: Evaluator, starts: Candidate[], opts: SearchOptions = {}): SearchResult {
  const t0 = performance.now();
  const seed = opts.seed ?? 1;
  const evaluations = budgetOf(opts);
  const rand = random(seed);
  const pool = pools(ev, starts, opts.perCall ?? 24);
  const move = mover(ev, pool, rand);
  const best = new Map<string, { plan: Candidate; iterationSeconds: number }>();
  let top = { plan: starts[0]!, time: Infinity };
  let evaluated = 0;
  let accepted = 0;
  const score = (plan: Candidate, bound = Infinity) => {
    evaluated += 1;
    const t = ev.objective(plan, bound);
    // Above the bound, `t` may be a lower figure than the plan's time: nothing to keep.
    if (t <= bound) {
      if (t < 1e9) best.set(planKey(plan), { plan, iterationSeconds: t });
      if (t < top.time) top = { plan, time: t };
    }
    return t;
  };
  // No more chains than evaluations: a budget's share may be that small.
  const chains = Array.from({ length: Math.max(1, Math.min(opts.chains ?? 8, evaluations)) }, (_, i) => {
    const plan = starts[i % starts.length]!;
    return { plan, time: score(plan) };
  });
  const feasibleTimes = chains.map((c) => c.time).filter((t) => t < 1e9);
  const scale = feasibleTimes.length ? Math.min(...feasibleTimes) : 1;
  const annealing = Math.floor(evaluations * 0.9);
  const restartEvery = Math.max(1, Math.floor(annealing / 4)); // steps: one evaluation each
  for (let step = 0; evaluated < annealing; step++) {
    const progress = evaluated / annealing;
    const temperature = scale * 0.1 * 0.01 ** progress; // seconds
    const chain = chains[step % chains.length]!;
    if (step > 0 && step % restartEvery === 0) {
      const worst = chains.reduce((a, b) => (b.time > a.time ? b : a));
      [worst.plan, worst.time] = [top.plan, top.time];
    }
    const next = move(chain.plan);
    // Accepted when Δt ≤ −T·ln(u): the bound lets the evaluator turn most plans down cheaply.
    const bound = chain.time - temperature * Math.log(rand());
    const time = score(next, bound);
    if (time <= bound) {
      chain.plan = next;
      chain.time = time;
      accepted += 1;
    }
  }
  // The descent: first-improvement over every call's pool, until a whole pass finds nothing.
  const calls = callNames(ev.problem);
  let improved = top.time < 1e9;
  while (improved && evaluated < evaluations) {
    improved = false;
    for (const call of calls) {
      for (const p of pool[call]!.values()) {
        if (evaluated >= evaluations) break;
        if (placementKey(p) === placementKey(top.plan[call]!)) continue;
        const next = { ...top.plan, [call]: p };
        const before = top.time;
        score(next, before);
        if (top.time < before) improved = true;
      }
    }
  }
  const ranked = [...best.values()].sort((a, b) => a.iterationSeconds - b.iterationSeconds).slice(0, opts.keep ?? 5);
  return { best: ranked, seed, evaluations, evaluated, accepted, seconds: (performance.now() - t0) / 1000 };
}
