// Losses: defineLoss and what losses are made of, the registry (built-ins and a user's file's),
// and the loading of a user's module on a worker.
export * from './define.ts';
export * from './reduce.ts';
export * from './registry.ts';
export * from './modules.ts';
export { clipPolicy, klParams, withRef } from './clip-policy.ts';
export { clipValue } from './clip-value.ts';
export { pairSigmoid } from './pair-sigmoid.ts';
export { gspo } from './gspo.ts';
export { cispo } from './cispo.ts';
export { decoupled } from './decoupled.ts';
