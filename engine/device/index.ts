// The device layer: what a worker process hosts (shards of models by name), how it checks and runs
// calls, exchanges and checkpoints, the tasks' rule rewards and the verifiable rewards of datasets,
// and the ledger of what it trained on.
export * from './beside.ts';
export * from './device.ts';
export * from './ledger.ts';
export * from './task.ts';
export * from './verify.ts';
export { baseDigest, wholeCheckpoint } from './snapshot.ts';
