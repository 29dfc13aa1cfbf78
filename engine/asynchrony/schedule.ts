// Which policy version generates which iteration's rollouts. Iteration t holds version t (the
// weights after t updates) and, while it trains, generates ahead later iterations' rollouts with
// it. Three ways to decide which:
// - `rl.lag: k`: the rollouts of iteration u come from version max(0, u − k). A pure function of k
//   and the iteration, so a lagged run replays exactly.
// - `rl.staleness: η`: free-running. The rollout devices go on generating while the iteration
//   trains, each next iteration's batch in turn, as long as it is admitted: its version's age when
//   trained, u − t, at most η (AReaL's rule). Which iterations a version makes depends on timing, so
//   each decision is written to the run's store before it is acted on.
// - `rl.versions`: a staleness run's decisions, recorded, re-run without timing (a replay).

/** How a run decides the version of each iteration's rollouts. */
export type Asynchrony = { mode: 'lag'; lag: number } | { mode: 'staleness'; eta: number } | { mode: 'replay'; eta: number; versions: readonly number[] };

/** The mode a scenario's `rl` keys choose; undefined for lock-step. */
export function asynchronyOf(rl: { lag: number; staleness: number; versions?: readonly number[] }): Asynchrony | undefined {
  if (rl.versions) return { mode: 'replay', eta: rl.staleness, versions: rl.versions };
  if (rl.staleness > 0) return { mode: 'staleness', eta: rl.staleness };
  if (rl.lag > 0) return { mode: 'lag', lag: rl.lag };
  return undefined;
}

/** Under rl.lag: the policy version that generates iteration `u`'s rollouts. */
export function versionOf(u: number, lag: number): number {
  return Math.max(0, u - lag);
}

/**
 * Under rl.lag, the iterations whose rollouts iteration `t` generates ahead, with the weights it
 * starts with: at t = 0, iterations 1..k (version 0 serves them all); later, t + k. Only those of
 * the run.
 */
export function aheadOf(t: number, lag: number, iterations: number): number[] {
  if (lag === 0) return [];
  const from = t === 0 ? 1 : t + lag;
  const out: number[] = [];
  for (let u = from; u <= t + lag && u < iterations; u++) out.push(u);
  return out;
}

/**
 * The iterations after `t` whose rollouts iteration t must generate, decided before it starts: by
 * the lag, by a replayed record, or (staleness) by the decisions already written for version t —
 * a supervisor that takes over, or a recovery, acts on what was written before the fault.
 * `recorded(u)`: the version written for iteration u, if any.
 */
export async function decidedAhead(a: Asynchrony, t: number, iterations: number, recorded: (u: number) => Promise<number | undefined>): Promise<number[]> {
  if (a.mode === 'lag') return aheadOf(t, a.lag, iterations);
  const out: number[] = [];
  for (let u = t + 1; u <= t + a.eta && u < iterations; u++) {
    const v = a.mode === 'replay' ? a.versions[u] : await recorded(u);
    if (v === t) out.push(u);
  }
  return out;
}

/**
 * Whether iteration `version` will generate with its version (its own rollout or one ahead), as
 * far as can be known when the iteration before ends: exactly under a lag or a replay;
 * free-running, whenever an iteration after it remains (timing decides the rest).
 */
export function generatesWith(a: Asynchrony, version: number, iterations: number): boolean {
  if (version >= iterations) return false;
  if (a.mode === 'lag') return aheadOf(version, a.lag, iterations).length > 0;
  if (a.mode === 'replay') return a.versions.some((v, u) => v === version && u >= version);
  return version + 1 < iterations;
}

/**
 * Under rl.staleness, the next iteration whose rollouts iteration t may still generate with its
 * version, or undefined: the first after every one decided so far (`last`), if it is admitted
 * (trained at most η updates later) and within the run.
 */
export function admitted(t: number, last: number, eta: number, iterations: number): number | undefined {
  const u = Math.max(last + 1, t + 1);
  return u <= t + eta && u < iterations ? u : undefined;
}

/**
 * Why a recorded schedule (one version per iteration) cannot be replayed with staleness η, or
 * undefined: each version at most its iteration and at most η older, and never going back (the
 * rollout devices generate the iterations in order, each with the newest version they have).
 */
export function versionsProblem(versions: readonly number[], eta: number, iterations: number): string | undefined {
  if (versions.length !== iterations) return `expected one version per iteration (${iterations}), got ${versions.length}`;
  for (const [u, v] of versions.entries()) {
    if (v > u) return `iteration ${u}'s rollouts cannot come from version ${v}: that version exists only after ${v} updates`;
    if (u - v > eta) return `iteration ${u}'s rollouts from version ${v} are ${u - v} updates old, more than rl.staleness (${eta}) admits`;
    if (u > 0 && v < versions[u - 1]!) return `iteration ${u}'s version ${v} is older than iteration ${u - 1}'s (${versions[u - 1]}): rollouts are generated in order, each with the newest version`;
  }
  return undefined;
}

/** Staleness over a run: mean, max and how many iterations trained on rollouts of each age. */
export function stalenessSummary(ages: readonly number[]): { mean: number; max: number; histogram: Record<string, number> } {
  const histogram: Record<string, number> = {};
  for (const a of ages) histogram[a] = (histogram[a] ?? 0) + 1;
  return { mean: ages.length ? ages.reduce((x, y) => x + y, 0) / ages.length : 0, max: ages.length ? Math.max(...ages) : 0, histogram };
}
