// Rollouts generated while the policy trains (rl.lag, rl.staleness): which version generates which iteration,
// the algorithm's graph when its rollouts are stale, and the next version's views filled while the
// last one generates.
export * from './next-views.ts';
export * from './schedule.ts';
export * from './stale-graph.ts';
export * from './handover.ts';
