// Rollouts generated while the policy trains (rl.lag, rl.staleness): which version generates which iteration,
// and the algorithm's graph when its rollouts are stale.
export * from './schedule.ts';
export * from './stale-graph.ts';
