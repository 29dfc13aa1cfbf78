// The stages of an RLHF (PPO) run, written against a Dispatcher so that they run the same over
// NATS or in one process. The supervisor machine (actors/supervisor.machine.ts) sequences them.
import type { ModelSpec, Optim } from '../mesh/protocol.ts';
import type { Dispatcher } from './dispatch.ts';
import { isHead, type GptSpec } from './params.ts';
import { gae, mean, tokenRewards, whiten } from './ppo.ts';
import { Stream, seedOf } from './rng.ts';
import { resolvePlan, MODELS, type CallName, type ModelName, type Plan, type Scenario } from './scenario.ts';
import { demonstrations, makeTask, type Task } from './task.ts';

export interface RunSpec {
  scenario: Scenario;
  plan: Plan;
  task: Task;
}

export function runSpec(scenario: Scenario): RunSpec {
  return {
    scenario,
    plan: resolvePlan(scenario),
    task: makeTask(scenario.task.name, scenario.task.digits, scenario.task.base),
  };
}

export function modelSpec(r: RunSpec, model: ModelName): ModelSpec {
  const { task, scenario: s } = r;
  if (model === 'reward') return { kind: 'rule', rule: s.reward.rule ?? s.task.name, digits: s.task.digits, base: s.task.base };
  const gpt: GptSpec = {
    kind: model === 'critic' ? 'value' : 'policy',
    vocab: task.vocab,
    context: task.promptLen + task.responseLen,
    layers: s.model.layers,
    width: s.model.width,
    heads: s.model.heads,
  };
  return gpt;
}

/** The device a call runs on (one-device meshes). */
export function deviceOf(r: RunSpec, call: CallName): number {
  return r.plan[call].devices[0]!;
}

const TRAIN_CALL: Record<ModelName, CallName> = {
  actor: 'actor.train',
  critic: 'critic.train',
  reference: 'reference.inference',
  reward: 'reward.inference',
};

/** Loads the four models, warms the actor up on demonstrations, and copies it into the reference and critic body. */
export async function setupModels(d: Dispatcher, r: RunSpec): Promise<{ parameters: Record<string, number> }> {
  const { scenario: s } = r;
  const optim = (lr: number): Optim => ({ lr, beta1: 0.9, beta2: 0.999, eps: 1e-8, clipNorm: s.ppo.clip_norm });
  const parameters: Record<string, number> = {};
  await Promise.all(
    MODELS.map(async (model) => {
      const p = r.plan[TRAIN_CALL[model]];
      const trainable = model === 'actor' || model === 'critic';
      const res = await d.call(p.devices[0]!, model, -1, {
        fn: 'load',
        role: model,
        spec: modelSpec(r, model),
        layout: { devices: p.devices, dp: p.dp, tp: p.tp, pp: p.pp },
        rank: 0,
        seed: s.seed,
        optim: trainable ? optim(model === 'actor' ? s.ppo.actor_lr : s.ppo.critic_lr) : undefined,
      });
      parameters[model] = res.parameters;
    }),
  );
  const actorDevice = deviceOf(r, 'actor.train');
  if (s.warmup.steps > 0) {
    const demos = demonstrations(r.task, s.seed, s.warmup.demos);
    await d.call(actorDevice, 'actor', -1, {
      fn: 'sft',
      tokens: demos,
      batch: s.warmup.demos,
      promptLen: r.task.promptLen,
      responseLen: r.task.responseLen,
      steps: s.warmup.steps,
      minibatch: s.warmup.batch,
      lr: s.warmup.lr,
      seed: seedOf(s.seed, Stream.demos),
    });
  }
  // The reference is the warmed-up policy, frozen; the critic starts from the same body.
  const { manifest } = await d.call(actorDevice, 'actor', -1, { fn: 'manifest' });
  await Promise.all([
    d.transfer({
      id: 'init-reference',
      iteration: -1,
      from: { device: actorDevice, model: 'actor' },
      to: { device: deviceOf(r, 'reference.inference'), model: 'reference' },
      manifest,
    }),
    d.transfer({
      id: 'init-critic',
      iteration: -1,
      from: { device: actorDevice, model: 'actor' },
      to: { device: deviceOf(r, 'critic.train'), model: 'critic' },
      manifest: manifest.filter((t) => !isHead(t.name)),
    }),
  ]);
  return { parameters };
}

export interface Rollout {
  iteration: number;
  batch: number;
  tokens: Int32Array;
  logprobs: Float32Array;
}

export async function generateStage(d: Dispatcher, r: RunSpec, iteration: number): Promise<Rollout> {
  const { scenario: s, task } = r;
  const batch = s.ppo.batch;
  const prompts = task.prompts(s.seed, iteration, batch);
  const seeds = Uint32Array.from({ length: batch }, (_, i) => seedOf(s.seed, Stream.sample, iteration, i));
  const out = await d.call(deviceOf(r, 'actor.generate'), 'actor', iteration, {
    fn: 'generate',
    prompts,
    batch,
    promptLen: task.promptLen,
    responseLen: task.responseLen,
    seeds,
    temperature: s.ppo.temperature,
  });
  return { iteration, batch, tokens: out.tokens, logprobs: out.logprobs };
}

export interface Scored {
  refLogprobs: Float32Array;
  scores: Float32Array;
  values: Float32Array;
}

/** Reference, reward and critic inference: no path between them, so they run at once. */
export async function inferStage(d: Dispatcher, r: RunSpec, ro: Rollout): Promise<Scored> {
  const batch = { tokens: ro.tokens, batch: ro.batch, promptLen: r.task.promptLen, responseLen: r.task.responseLen };
  const [ref, reward, critic] = await Promise.all([
    d.call(deviceOf(r, 'reference.inference'), 'reference', ro.iteration, { fn: 'inference', ...batch }),
    d.call(deviceOf(r, 'reward.inference'), 'reward', ro.iteration, { fn: 'inference', ...batch }),
    d.call(deviceOf(r, 'critic.inference'), 'critic', ro.iteration, { fn: 'inference', ...batch }),
  ]);
  const pick = <K extends string>(o: object, key: K, model: string): Float32Array => {
    const v = (o as Record<string, unknown>)[key];
    if (!(v instanceof Float32Array)) throw new Error(`${model}.inference replied without '${key}'`);
    return v;
  };
  return {
    refLogprobs: pick(ref, 'logprobs', 'reference'),
    scores: pick(reward, 'scores', 'reward'),
    values: pick(critic, 'values', 'critic'),
  };
}

export interface Trained {
  reward_mean: number;
  kl: number;
  actor_loss: number;
  critic_loss: number;
}

/** Advantages (KL-shaped rewards, GAE, whitening), then actor and critic training at once. */
export async function trainStage(d: Dispatcher, r: RunSpec, ro: Rollout, sc: Scored): Promise<Trained> {
  const { scenario: s, task } = r;
  const R = task.responseLen;
  const { rewards, kl } = tokenRewards(sc.scores, ro.logprobs, sc.refLogprobs, R, s.ppo.kl_coef);
  const { advantages, returns } = gae(rewards, sc.values, R, s.ppo.gamma, s.ppo.lambda);
  const hyper = { epochs: s.ppo.epochs, minibatches: s.ppo.minibatches, clip: s.ppo.clip, valueClip: s.ppo.value_clip };
  const batch = { tokens: ro.tokens, batch: ro.batch, promptLen: task.promptLen, responseLen: R, hyper };
  const [actor, critic] = await Promise.all([
    d.call(deviceOf(r, 'actor.train'), 'actor', ro.iteration, {
      fn: 'train',
      ...batch,
      seed: seedOf(s.seed, Stream.shuffle, ro.iteration, 0),
      old: ro.logprobs,
      target: Float32Array.from(whiten(advantages)),
    }),
    d.call(deviceOf(r, 'critic.train'), 'critic', ro.iteration, {
      fn: 'train',
      ...batch,
      seed: seedOf(s.seed, Stream.shuffle, ro.iteration, 1),
      old: sc.values,
      target: Float32Array.from(returns),
    }),
  ]);
  return { reward_mean: mean(sc.scores), kl, actor_loss: actor.loss, critic_loss: critic.loss };
}

/** SHA-256 of each trained model's parameters, from the devices that own them. */
export async function finalDigests(d: Dispatcher, r: RunSpec, iteration: number): Promise<Record<string, string>> {
  const [actor, critic] = await Promise.all([
    d.call(deviceOf(r, 'actor.train'), 'actor', iteration, { fn: 'manifest' }),
    d.call(deviceOf(r, 'critic.train'), 'critic', iteration, { fn: 'manifest' }),
  ]);
  return { actor: actor.digest, critic: critic.digest };
}

/** Every device the plan uses, ascending. */
export function planDevices(r: RunSpec): number[] {
  return [...new Set(Object.values(r.plan).flatMap((p) => p.devices))].sort((a, b) => a - b);
}
