// Elastic runs: a device lost for good (cordoned, past the restart intensity, not back within the
// grace period, or a chaos event) → a re-plan on the devices left → the migration onto it.
export * from './decide.ts';
export * from './migrate.ts';
export * from './cordon.ts';
export * from './search-thread.ts';
export * from './steps.ts';
