// Which policy version generates which iteration's rollouts, under `rl.lag: k`: the rollouts of
// iteration u come from version max(0, u − k), the weights after that many updates. A pure
// function of k and the iteration, so a lagged run replays exactly. Iteration t starts with
// version t on hand and generates ahead the iterations whose version that is, while it trains.

/** The policy version that generates iteration `u`'s rollouts. */
export function versionOf(u: number, lag: number): number {
  return Math.max(0, u - lag);
}

/**
 * The iterations whose rollouts iteration `t` generates ahead, with the weights it starts with:
 * at t = 0, iterations 1..k (version 0 serves them all); later, t + k. Only those of the run.
 */
export function aheadOf(t: number, lag: number, iterations: number): number[] {
  if (lag === 0) return [];
  const from = t === 0 ? 1 : t + lag;
  const out: number[] = [];
  for (let u = from; u <= t + lag && u < iterations; u++) out.push(u);
  return out;
}
