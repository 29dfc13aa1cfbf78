// An RL run on devices, for any algorithm's graph, written against a Dispatcher so that it runs
// the same over NATS or in one process: the run's spec (spec.ts), calls on meshes and the views
// filled by reallocation (mesh-calls.ts), one iteration of the graph with its rewards and what it
// keeps (iteration.ts). Setting the models up and checkpoints are setup.ts's. The supervisor
// machine (engine/supervision/supervisor.machine.ts) sequences them.
export * from './spec.ts';
export * from './mesh-calls.ts';
export * from './iteration.ts';
