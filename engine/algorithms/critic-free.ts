// The graph the critic-free family shares (GRPO, RLOO, REINFORCE++): G samples of each prompt,
// reference log-probs and rewards for them, one advantage step, one policy update. Each algorithm
// picks the estimator, how many samples, and what its policy loss adds.
import type { KlEstimator, LossParams } from '../model/index.ts';
import type { RlConfig } from './algorithm.ts';
import { estimator, type AdvantageOptions } from './advantages.ts';
import type { CallDecl, Graph } from './graph.ts';
import { policyLoss, type PolicyLossOption } from './policy-loss.ts';

export function criticFree(
  rl: RlConfig,
  o: { group: number; estimator: string; advantage: AdvantageOptions; loss: LossParams; kl?: KlEstimator; klInLoss: boolean; policyLoss: PolicyLossOption },
): Graph {
  const train: CallDecl = {
    name: 'actor.train',
    model: 'actor',
    fn: 'train',
    ...policyLoss(o.policyLoss, { clip: rl.clip, ...o.loss }, o.klInLoss ? { kl_coef: rl.kl_coef, kl: o.kl ?? 'k3' } : undefined),
  };
  const advantage = estimator(o.estimator);
  return {
    source: 'prompts',
    group: o.group,
    reward: 'scores',
    models: [
      { name: 'actor', head: 'policy', trained: true, lr: rl.lr },
      { name: 'reference', head: 'policy', trained: false, from: 'actor' },
      { name: 'reward', head: 'reward', trained: false },
    ],
    calls: [
      { name: 'actor.generate', model: 'actor', fn: 'generate', reads: { prompts: 'prompts' }, writes: { tokens: 'tokens', logprobs: 'logprobs', mask: 'mask', step_rewards: 'step_rewards' } },
      { name: 'reference.inference', model: 'reference', fn: 'inference', reads: { tokens: 'tokens' }, writes: { logprobs: 'ref_logprobs' } },
      { name: 'reward.inference', model: 'reward', fn: 'inference', reads: { tokens: 'tokens' }, writes: { scores: 'scores' } },
      train,
    ],
    steps: [
      {
        name: 'advantages',
        reads: ['scores', 'logprobs', 'ref_logprobs', 'mask', 'step_rewards'],
        writes: ['advantages', 'kl'],
        run: (f, ctx) => {
          const out = advantage(
            {
              scores: f.scores as Float32Array,
              logprobs: f.logprobs as Float32Array,
              ref: f.ref_logprobs as Float32Array,
              responseLen: ctx.responseLen,
              group: ctx.group,
              mask: f.mask as Float32Array,
              stepRewards: f.step_rewards as Float32Array,
            },
            o.advantage,
          );
          return { advantages: out.advantages, ...out.stats };
        },
      },
    ],
  };
}
