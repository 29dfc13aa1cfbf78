// REINFORCE++ (Hu 2025): no critic; KL-shaped token rewards, returns as suffix sums (γ = 1 by
// default), advantages z-scored over the whole batch rather than per group; PPO's clipped loss.
import { z } from 'zod';
import { defineAlgorithm } from './algorithm.ts';
import { criticFree } from './critic-free.ts';
import { policyLossOption } from './policy-loss.ts';

export const reinforcePP = defineAlgorithm({
  name: 'reinforce_pp',
  summary: 'no critic; per-token KL in the reward, returns normalised over the batch, clipped loss',
  options: z.strictObject({
    group: z.number().int().min(1).default(1).describe('samples per prompt'),
    gamma: z.number().min(0).max(1).default(1),
    loss: policyLossOption,
  }),
  graph: (o, rl) => criticFree(rl, { group: o.group, estimator: 'reinforce_pp', advantage: { kl_coef: rl.kl_coef, gamma: o.gamma }, loss: {}, klInLoss: false, policyLoss: o.loss }),
});
