// ferry's public API for a user's own algorithm file: everything such a file needs, from one
// module, so that a file kept outside the checkout imports this path alone (its own folder has no
// node_modules). `tf` and `z` are ferry's own instances: a loss must build its tensors with the
// TensorFlow.js that trains it.
//   import { defineAlgorithm, defineLoss, tf, z } from '/path/to/ferry/engine/api.ts';
export { defineAlgorithm, type Algorithm, type RlConfig } from './algorithms/algorithm.ts';
export type { CallDecl, Field, Fields, Graph, HostStep, ModelDecl, StepContext } from './algorithms/graph.ts';
export { ESTIMATORS, estimator, groupNormalised, leaveOneOut, perToken, rowLengths, sequenceKl, type AdvantageOptions } from './algorithms/advantages.ts';
export { POLICY_PORTS, policyLoss, policyLossOption } from './algorithms/policy-loss.ts';
// The built-in algorithms, to build on: `grpo.graph(grpo.options.parse({ loss: 'mine' }), rl)`.
export { BUILTIN } from './algorithms/registry.ts';
export { dpo } from './algorithms/dpo.ts';
export { grpo } from './algorithms/grpo.ts';
export { ppo } from './algorithms/ppo.ts';
export { reinforcePP } from './algorithms/reinforce-pp.ts';
export { remax } from './algorithms/remax.ts';
export { rloo } from './algorithms/rloo.ts';
export { defineLoss, stopGradient, type Loss, type LossDefinition, type LossInput, type LossNorm, type LossOutput, type LossParams } from './model/losses/define.ts';
export { AGGREGATIONS, KL_ESTIMATORS, aggregate, clippedSurrogate, klTensor, outsideClip, rowMean, seqMean, tokenMean, tokenShare } from './model/losses/reduce.ts';
export { klParams, withRef } from './model/losses/clip-policy.ts';
export { z } from 'zod';
export * as tf from '@tensorflow/tfjs';
// An environment of several turns on the bus, in TypeScript (docs/environment-protocol.md).
export { serveEnvironment, type EnvStepResult, type EnvironmentServer, type ServeEnvironmentOptions } from '../mesh/wire/services/env-serve.ts';
export type { EnvTask } from '../mesh/wire/services/env-protocol.ts';
