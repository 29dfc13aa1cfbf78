// Continuous generation: a generate call's samples in a queue, a replica's slots kept full, and
// newer versions of the policy taken in flight.
export * from './continuous.ts';
export * from './inflight.ts';
export * from './ledger.ts';
