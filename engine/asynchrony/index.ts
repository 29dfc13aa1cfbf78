// Rollouts generated while the policy trains (rl.lag, rl.staleness, rl.inflight): which version generates which iteration,
// the algorithm's graph when its rollouts are stale, and the next version's views filled while the
// last one generates, and handed to the generation still running (in flight).
export * from './next-views.ts';
export * from './schedule.ts';
export * from './stale-graph.ts';
export * from './handover.ts';
