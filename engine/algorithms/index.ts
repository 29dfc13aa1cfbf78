// The algorithms layer: graphs, the built-in algorithms, the advantage registry. It knows the
// words actor, critic, reference and PPO; nothing below it does.
export * from './graph.ts';
export * from './algorithm.ts';
export * from './advantages.ts';
export * from './registry.ts';
export { preferenceStats } from './dpo.ts';
export { taskPairs, readPairsFile, PairsError, type PairsFile } from './pairs.ts';
export * from './losses.ts';
export * from './policy-loss.ts';
