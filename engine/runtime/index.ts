// The runtime layer: the run of an algorithm's graph on devices, and around it, each in a room of
// its own: scenario/ (the schema, parsing, the plan a scenario asks for), data/ (datasets, the data
// task, the arithmetic set), run/ (an iteration's calls and steps, rewards, the in-process run),
// dispatch/ (calls to devices over the bus or in memory, exchanges), store/ (the run store, on
// JetStream), supervisor/ (the machine, membership, supervision, chaos kill points), plan/ (costs,
// simulation, search), record/ (metrics, summaries, report.html), tools/ (sample, evaluate, export).
// It knows algorithms only through their graphs.
export * from './dispatch/bus-dispatcher.ts';
export * from './supervisor/chaos.ts';
export * from './dispatch/dispatch.ts';
export * from './store/jetstream-store.ts';
export * from './dispatch/local-dispatch.ts';
export * from './run/local-run.ts';
export * from './supervisor/membership.ts';
export * from './record/record.ts';
export * from './record/report.ts';
export * from './run/reward-client.ts';
export * from './record/run-report.ts';
export * from './run/run.ts';
export * from './run/setup.ts';
export * from './scenario/scenario.ts';
export * from './store/store.ts';
export * from './store/reshard.ts';
export { objectName } from './store/snapshots.ts';
export * from './supervisor/supervision.ts';
export * from './supervisor/supervisor.machine.ts';
export * from './plan/catalog.ts';
export * from './plan/cost.ts';
export * from './plan/lag.ts';
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
