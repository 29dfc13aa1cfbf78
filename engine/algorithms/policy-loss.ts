// The policy loss an algorithm's actor trains with, as its `loss:` option: clip_policy (PPO's,
// the default), another built-in (gspo, cispo, decoupled) or one its file exports, by name or as
// `{ name, ...params }` (verl's `policy_loss.loss_mode`). Its ports are bound to the batch fields
// every actor update has: the generation's log-probs (old, and behav/prox while rollouts are
// fresh), the advantages and the reference's log-probs.
import { z } from 'zod';
import type { LossSpec } from '../../mesh/wire/index.ts';
import { lossOf, lossParams, type KlEstimator, type Loss, type LossParams } from '../model/index.ts';
import { GraphError } from './graph.ts';

const scalar = z.union([z.number(), z.string(), z.boolean()]);

export const policyLossOption = z
  .union([z.string().min(1), z.looseObject({ name: z.string().min(1) }).catchall(scalar)])
  .default('clip_policy')
  .describe("the actor's loss: clip_policy, gspo, cispo, decoupled or one the algorithm's file exports; a name, or { name, ...its parameters }");
export type PolicyLossOption = z.output<typeof policyLossOption>;

/** Where each port a policy loss may read comes from in an actor update's batch. */
export const POLICY_PORTS: Record<string, string> = { old: 'logprobs', behav: 'logprobs', prox: 'logprobs', advantages: 'advantages', ref: 'ref_logprobs' };

/**
 * The actor's train call's loss and port bindings. `knobs`: clip_policy's parameters from the
 * algorithm's own options and `rl:` (clip, clip_high, aggregation); another loss takes its
 * parameters from `loss:` and its own defaults. `kl`: the KL term, when it is in the loss.
 */
export function policyLoss(option: PolicyLossOption, knobs: LossParams, kl?: { kl_coef: number; kl: KlEstimator }): { loss: LossSpec; reads: Record<string, string>; writes: Record<string, string> } {
  const { name, ...given } = typeof option === 'string' ? { name: option } : (option as { name: string } & LossParams);
  let loss: Loss | undefined;
  try {
    loss = lossOf(name);
  } catch {
    // Unknown: the graph's check names it with the known ones.
    return { loss: { name, params: given }, reads: { tokens: 'tokens' }, writes: { loss: 'actor_loss' } };
  }
  const shape = (loss.params as unknown as { shape?: Record<string, unknown> }).shape ?? {};
  if (kl && kl.kl_coef > 0 && !('kl_coef' in shape)) {
    throw new GraphError(`algorithm.loss: the loss '${name}' has no kl_coef parameter, so the KL cannot be a term of its loss; set algorithm.kl: reward, or rl.kl_coef: 0`);
  }
  const params: LossParams = { ...(name === 'clip_policy' ? knobs : {}), ...(kl ? kl : {}), ...given };
  let ports: string[] = [];
  try {
    ports = loss.ports(lossParams(loss, params));
  } catch {
    // Parameters its schema refuses: the graph's check says which.
  }
  return {
    loss: { name, params },
    reads: { tokens: 'tokens', ...Object.fromEntries(ports.filter((p) => p in POLICY_PORTS).map((p) => [p, POLICY_PORTS[p]!])) },
    // The loss, and its clip fraction where it reports one (verl's pg_clipfrac), go to the metrics.
    writes: { loss: 'actor_loss', ...(loss.stats.includes('clipfrac') ? { clipfrac: 'actor_clipfrac' } : {}) },
  };
}
