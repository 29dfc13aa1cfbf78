// GRPO (Shao et al. 2024, DeepSeekMath): G samples per prompt, advantages normalised within each
// prompt's group, no critic. The KL to the reference is a loss term (k3) or a reward penalty; the
// loss is aggregated per token, or per sequence first (DAPO and Dr. GRPO discuss the choice).
import { z } from 'zod';
import { AGGREGATIONS, KL_ESTIMATORS } from '../model/index.ts';
import { defineAlgorithm } from './algorithm.ts';
import { criticFree } from './critic-free.ts';
import { policyLossOption } from './policy-loss.ts';

export const grpo = defineAlgorithm({
  name: 'grpo',
  summary: 'G samples per prompt, group-normalised advantages, no critic; KL in the loss (k3) or the reward',
  options: z.strictObject({
    group: z.number().int().min(2).default(4).describe('samples per prompt (G)'),
    kl: z.enum(['loss', 'reward']).default('loss').describe("loss: β·KL in the loss; reward: a penalty on each sequence's reward"),
    kl_estimator: z.enum(KL_ESTIMATORS).default('k3'),
    aggregation: z.enum(AGGREGATIONS).default('seq_mean_token_mean'),
    clip_high: z.number().positive().optional().describe('ε_high of clip-higher (DAPO: 0.28); defaults to rl.clip'),
    scale: z.boolean().default(true).describe("divide by the group's standard deviation (false: Dr. GRPO)"),
    loss: policyLossOption,
  }),
  graph: (o, rl) =>
    criticFree(rl, {
      group: o.group,
      estimator: 'grpo',
      advantage: { kl_coef: o.kl === 'reward' ? rl.kl_coef : 0, kl_estimator: o.kl_estimator, scale: o.scale },
      loss: { aggregation: o.aggregation, ...(o.clip_high === undefined ? {} : { clip_high: o.clip_high }) },
      kl: o.kl_estimator,
      klInLoss: o.kl === 'loss',
      policyLoss: o.loss,
    }),
});
