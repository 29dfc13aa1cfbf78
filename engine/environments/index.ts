// Environments in a run: the scenario's `environment:` key, the episodes of a generate call, the
// iteration's metrics from their records, and the environment processes ferry starts.
export * from './key.ts';
export * from './episodes.ts';
export * from './book.ts';
export * from './ledger.ts';
export * from './demos.ts';
export * from './processes.ts';
