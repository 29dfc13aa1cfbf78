// RLOO (Ahmadian et al. 2024): G samples per prompt; each sample's baseline is the mean reward of
// the other G − 1. The KL is a penalty on each sequence's reward.
import { z } from 'zod';
import { defineAlgorithm } from './algorithm.ts';
import { criticFree } from './critic-free.ts';
import { policyLossOption } from './policy-loss.ts';

export const rloo = defineAlgorithm({
  name: 'rloo',
  summary: 'G samples per prompt, leave-one-out baseline, KL penalty in the reward',
  options: z.strictObject({
    group: z.number().int().min(2).default(4).describe('samples per prompt (G)'),
    loss: policyLossOption,
  }),
  graph: (o, rl) => criticFree(rl, { group: o.group, estimator: 'rloo', advantage: { kl_coef: rl.kl_coef }, loss: {}, klInLoss: false, policyLoss: o.loss }),
});
