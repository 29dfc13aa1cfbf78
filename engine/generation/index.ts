// Continuous generation: a generate call's samples in a queue, a replica's slots kept full.
export * from './continuous.ts';
export * from './ledger.ts';
