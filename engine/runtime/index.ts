// The runtime layer: the run of an algorithm's graph on devices, the dispatchers, the supervisor
// machine and its membership and supervision, the run store, scenarios, plans and their search,
// chaos kill points, and what a run records and reports. It knows algorithms only through their graphs.
export * from './bus-dispatcher.ts';
export * from './chaos.ts';
export * from './dispatch.ts';
export * from './jetstream-store.ts';
export * from './local-dispatch.ts';
export * from './local-run.ts';
export * from './membership.ts';
export * from './record.ts';
export * from './report.ts';
export * from './reward-client.ts';
export * from './run-report.ts';
export * from './run.ts';
export * from './scenario.ts';
export * from './store.ts';
export * from './supervision.ts';
export * from './supervisor.machine.ts';
export * from './plan/catalog.ts';
export * from './plan/cost.ts';
export * from './plan/planner.ts';
export * from './plan/problem.ts';
export * from './plan/search.ts';
export * from './plan/simulate.ts';
export * from './sample.ts';
export * from './export.ts';
export * from './evaluate.ts';
export * from './data-task.ts';
export * from './dataset.ts';
