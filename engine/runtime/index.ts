// The runtime layer: the run of an algorithm's graph on devices, and around it, each in a room of
// its own: scenario/ (the schema, parsing, the plan a scenario asks for), data/ (datasets, the data
// task, the arithmetic set), run/ (an iteration's calls and steps, rewards, models set up and
// restored from a snapshot), dispatch/ (calls to devices over the bus or in memory, exchanges),
// store/ (the run store, on JetStream), plan/ (costs, simulation, search), record/ (metrics,
// summaries, report.html), tools/ (sample, evaluate, export). It knows algorithms only through
// their graphs; the supervisor that sequences a run sits above it, in engine/supervision/.
export * from './dispatch/bus-dispatcher.ts';
export * from './dispatch/dispatch.ts';
export * from './store/jetstream-store.ts';
export * from './dispatch/local-dispatch.ts';
export * from './record/record.ts';
export * from './record/report.ts';
export * from './run/reward-client.ts';
export * from './record/run-report.ts';
export * from './run/run.ts';
export * from './run/setup.ts';
export * from './run/recovery.ts';
export * from './scenario/scenario.ts';
export * from './store/store.ts';
export * from './store/plan-stages.ts';
export * from './store/reshard.ts';
export { objectName } from './store/snapshots.ts';
export * from './plan/catalog.ts';
export * from './plan/cost.ts';
export * from './plan/inflight.ts';
export * from './plan/lag.ts';
export * from './plan/plan-file.ts';
export * from './plan/planner.ts';
export * from './plan/problem.ts';
export * from './plan/replan.ts';
export * from './plan/search.ts';
export * from './plan/simulate.ts';
export * from './tools/sample.ts';
export * from './tools/export.ts';
export * from './tools/evaluate.ts';
export * from './data/data-task.ts';
export * from './data/dataset.ts';
