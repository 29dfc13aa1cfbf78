// A user's algorithm with its own loss, in one file: GMPO (Zhao et al. 2025, Geometric-Mean Policy
// Optimization). GRPO maximises the arithmetic mean of its tokens' clipped ratio·advantage, so one
// token with an extreme ratio can swing a whole update; GMPO takes their geometric mean instead:
//   J_i = A_i · exp( (1/|o_i|) Σ_t sgn(A_i) · min(sgn(A_i)·log ρ_t, sgn(A_i)·clip(log ρ_t, −ε, ε)) )
// with ρ_t = π_θ/π_old per token, clipped in log space (the paper: ε = 0.4, a wider range than
// PPO's, since the geometric mean is already robust). Nothing in ferry is edited: the scenario
// names this file; the supervisor and every worker that trains with the loss load it (and check
// that they load the same bytes).
//   npm run scenario -- examples/algorithm/gmpo.yaml
import { defineAlgorithm, defineLoss, grpo, rowMean, seqMean, tf, tokenShare, z } from '../../engine/api.ts';

export const gmpoLoss = defineLoss({
  name: 'gmpo',
  summary: 'the geometric mean of the tokens’ clipped ratios, times the sequence advantage',
  head: 'policy',
  params: z.strictObject({ clip: z.number().positive().default(0.4).describe('ε: log ρ is clipped to [−ε, ε]') }),
  ports: ['old', 'advantages'],
  stats: ['clipfrac'],
  compute({ pred, data, mask, norm, params }) {
    const logRatio = tf.sub(pred, data.old!); // [rows, R]
    const A = rowMean(data.advantages!, mask); // [rows]: GRPO's advantage is the same on every token of a response
    const sign = tf.expandDims(tf.sign(A), 1); // [rows, 1]
    const clipped = tf.clipByValue(logRatio, -params.clip, params.clip);
    // Pessimistic per token, as PPO: the smaller of the signed log-ratio and its clipped value.
    const kept = tf.minimum(tf.mul(sign, logRatio), tf.mul(sign, clipped)); // [rows, R]
    const ratio = tf.exp(tf.mul(tf.sign(A), rowMean(kept, mask))); // [rows]: the geometric mean of the ratios
    return {
      loss: seqMean(tf.neg(tf.mul(ratio, A)), norm),
      stats: { clipfrac: tokenShare(tf.greater(tf.abs(logRatio), params.clip), mask, norm) },
    };
  },
});

export default defineAlgorithm({
  name: 'gmpo',
  summary: 'GRPO with the geometric mean of the token ratios (GMPO)',
  options: z.strictObject({
    group: z.number().int().min(2).default(4).describe('samples per prompt (G)'),
    clip: z.number().positive().default(0.4).describe('ε of the log-ratio clip'),
  }),
  // GRPO's graph (group-normalised advantages), training the actor with this file's loss. The loss
  // takes no KL term, so the KL to the reference is a penalty on each response's reward.
  graph: (o, rl) => grpo.graph(grpo.options.parse({ group: o.group, kl: 'reward', kl_estimator: 'k3', loss: { name: 'gmpo', clip: o.clip } }), rl),
});
