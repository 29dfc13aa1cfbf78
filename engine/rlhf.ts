// The stages of an RLHF (PPO) run, written against a Dispatcher so that they run the same over
// NATS or in one process. The supervisor machine (actors/supervisor.machine.ts) sequences them.
import { createHash } from 'node:crypto';
import type { CallBody, CallOf, Checkpoint, LedgerEntry, ModelSpec, ResultOf } from '../mesh/protocol.ts';
import type { RewardItem } from '../mesh/reward-protocol.ts';
import type { Dispatcher } from './dispatch.ts';
import { layoutKey, shardSlices, sliceShape, type Layout } from '../mesh/layout.ts';
import { planRealloc } from '../mesh/realloc.ts';
import { isHead, modelInfo, parameterShapes, type GptSpec } from './params.ts';
import { gae, mean, tokenRewards, whiten } from './ppo.ts';
import { Stream, seedOf } from './rng.ts';
import { modelOf, resolvePlan, ScenarioError, MODELS, type CallName, type ModelName, type Plan, type Scenario } from './scenario.ts';
import { demonstrations, makeTask, type Task } from './task.ts';

export interface RunSpec {
  scenario: Scenario;
  plan: Plan;
  task: Task;
  /** The reward service a learned reward model serves (unique to the run). */
  rewardService: string;
}

export function runSpec(scenario: Scenario, run = 'local'): RunSpec {
  const plan = resolvePlan(scenario);
  if (scenario.reward.model && plan['reward.inference'].devices.length !== 1) {
    throw new ScenarioError(`reward.model: a learned reward model trains on one device; the plan gives reward.inference ${plan['reward.inference'].devices.length}`);
  }
  return {
    scenario,
    plan,
    task: makeTask(scenario.task.name, scenario.task.digits, scenario.task.base),
    rewardService: `rm-${run}`,
  };
}

export function modelSpec(r: RunSpec, model: ModelName): ModelSpec {
  const { task, scenario: s } = r;
  if (model === 'reward' && !s.reward.model) return { kind: 'rule', rule: s.reward.rule ?? s.task.name, digits: s.task.digits, base: s.task.base };
  const gpt: GptSpec = {
    kind: model === 'critic' || model === 'reward' ? 'value' : 'policy',
    vocab: task.vocab,
    context: task.promptLen + task.responseLen,
    layers: s.model.layers,
    width: s.model.width,
    heads: s.model.heads,
  };
  return gpt;
}

let groups = 0;

/**
 * Runs one call on every rank of a layout at once (they exchange activations and sums among
 * themselves) and gathers the replies: arrays concatenated in rank order (only the ranks that
 * hold a replica's output return rows), losses summed, gradient norms the largest.
 */
export async function callMesh<F extends 'generate' | 'inference' | 'train' | 'sft' | 'manifest'>(
  d: Dispatcher,
  layout: Layout,
  model: string,
  iteration: number,
  body: CallOf<F>,
): Promise<ResultOf<F>> {
  const fn = (body as CallBody).fn;
  const group = `g${d.epoch}-${iteration < 0 ? 'setup' : iteration}-${model.replace('@', '-')}-${fn}-${groups++}`;
  const outs = (await Promise.all(layout.devices.map((device) => d.call(device, model, iteration, body, group)))) as Array<Record<string, unknown>>;
  if (outs.length === 1) return outs[0] as ResultOf<F>;
  if (fn === 'manifest') {
    // Every rank keeps its own ledger: they are all given back, rank after rank.
    return {
      manifest: outs.flatMap((o) => o.manifest as unknown[]),
      digest: meshDigest(outs.map((o) => o.digest as string)),
      ledger: outs.flatMap((o) => o.ledger as unknown[]),
    } as ResultOf<F>;
  }
  const merged: Record<string, unknown> = {};
  for (const key of Object.keys(outs[0]!)) {
    const values = outs.map((o) => o[key]);
    if (values[0] instanceof Float32Array || values[0] instanceof Int32Array) {
      const arrays = values as Array<Float32Array | Int32Array>;
      const out = new (arrays[0]!.constructor as { new (n: number): Float32Array | Int32Array })(arrays.reduce((n, a) => n + a.length, 0));
      let at = 0;
      for (const a of arrays) {
        out.set(a, at);
        at += a.length;
      }
      merged[key] = out;
    } else {
      const nums = values as number[];
      merged[key] = key === 'grad_norm' ? Math.max(...nums) : nums.reduce((a, b) => a + b, 0);
    }
  }
  return merged as ResultOf<F>;
}

/** One digest for a model held by several ranks: the ranks' digests, in rank order, hashed. */
export function meshDigest(digests: readonly string[]): string {
  return digests.length === 1 ? digests[0]! : createHash('sha256').update(digests.join(',')).digest('hex');
}

export function layoutOf(r: RunSpec, call: CallName): Layout {
  const p = r.plan[call];
  return { devices: p.devices, dp: p.dp, tp: p.tp, pp: p.pp };
}

/** The call whose layout owns a model's weights (and, if trained, its optimizer state). */
export const OWNER: Record<ModelName, CallName> = {
  actor: 'actor.train',
  critic: 'critic.train',
  reference: 'reference.inference',
  reward: 'reward.inference',
};

/**
 * The name under which a call finds its model: the owner itself when the call runs on the
 * owner's layout, else a view of it that is filled before the call and released after.
 */
export function viewOf(r: RunSpec, call: CallName): { name: string; isView: boolean } {
  const model = modelOf(call);
  const isView = layoutKey(layoutOf(r, call)) !== layoutKey(layoutOf(r, OWNER[model]));
  return { name: isView ? `${model}@${call.split('.')[1]}` : model, isView };
}

function nodeOf(r: RunSpec): (device: number) => number {
  return (device) => Math.floor(device / r.scenario.cluster.devices_per_node);
}

export interface Moved {
  seconds: number;
  bytes: number;
}

/** Moves `names` (all when absent) of one model's shard to another model's shard over the plan. */
export async function reallocate(
  d: Dispatcher,
  r: RunSpec,
  id: string,
  iteration: number,
  from: { model: string; layout: Layout },
  to: { model: string; layout: Layout },
  spec: GptSpec,
  names?: string[],
  targetSpec: GptSpec = spec,
): Promise<Moved> {
  const plan = planRealloc(modelInfo(spec), from.layout, to.layout, nodeOf(r), names, modelInfo(targetSpec));
  const out = await d.realloc({ id, iteration, from, to, plan });
  if (out.received_bytes !== plan.minimumBytes) {
    throw new Error(`reallocation ${id}: received ${out.received_bytes} bytes, the plan's minimum is ${plan.minimumBytes}`);
  }
  return { seconds: out.seconds, bytes: out.received_bytes };
}

async function loadModel(d: Dispatcher, r: RunSpec, name: string, role: ModelName, layout: Layout, opts: { seed?: number; lr?: number; serve?: string }, iteration = -1) {
  const s = r.scenario;
  const results = await Promise.all(
    layout.devices.map((device, rank) =>
      d.call(device, name, iteration, {
        fn: 'load',
        role,
        spec: modelSpec(r, role),
        layout,
        rank,
        ...(opts.seed === undefined ? {} : { seed: opts.seed }),
        ...(opts.lr === undefined ? {} : { optim: { lr: opts.lr, beta1: 0.9, beta2: 0.999, eps: 1e-8, clipNorm: s.ppo.clip_norm } }),
        ...(opts.serve === undefined ? {} : { serve: opts.serve }),
      }),
    ),
  );
  return results.reduce((n, x) => n + x.parameters, 0);
}

/**
 * Fills the view a call needs from its owner, runs `body`, and releases the view. Calls on the
 * owner's layout run directly.
 */
async function onLayout<T>(d: Dispatcher, r: RunSpec, call: CallName, iteration: number, body: (name: string) => Promise<T>): Promise<T & { moved?: Moved }> {
  const { name, isView } = viewOf(r, call);
  if (!isView) return body(name) as Promise<T & { moved?: Moved }>;
  const model = modelOf(call);
  const layout = layoutOf(r, call);
  const spec = modelSpec(r, model) as GptSpec;
  await loadModel(d, r, name, model, layout, {}, iteration);
  try {
    const moved = await reallocate(d, r, `it${iteration}-${name.replace('@', '-')}`, iteration, { model, layout: layoutOf(r, OWNER[model]) }, { model: name, layout }, spec);
    return { ...(await body(name)), moved };
  } finally {
    await Promise.all(layout.devices.map((device) => d.call(device, name, iteration, { fn: 'release' })));
  }
}

/** The models whose state a checkpoint keeps (the reward is a rule). Per model, one record per rank. */
export const KEPT = ['actor', 'critic', 'reference'] as const;
export type CheckpointSet = Record<(typeof KEPT)[number], Checkpoint[]> & { reward?: Checkpoint[] };

/** The models a checkpoint keeps: those with parameters (a learned reward model too, not a rule). */
export function keptModels(r: RunSpec): Array<(typeof KEPT)[number] | 'reward'> {
  return r.scenario.reward.model ? [...KEPT, 'reward'] : [...KEPT];
}

/** Every rank of every kept model, at the end of an iteration: weights, and optimizer state where it trains. */
export async function takeCheckpoint(d: Dispatcher, r: RunSpec, iteration: number): Promise<CheckpointSet> {
  // Every rank's checkpoint is an exchange of its own: they all run at once.
  const entries = await Promise.all(
    keptModels(r).map(async (model) => {
      const layout = layoutOf(r, OWNER[model]);
      const info = modelInfo(modelSpec(r, model) as GptSpec);
      const ranks = await Promise.all(
        layout.devices.map((device, rank) => {
          const shapes = shardSlices(info, layout, rank).map((s) => ({ name: s.name, shape: sliceShape(s) }));
          return d.checkpointShard(device, model, iteration, shapes, model !== 'reference');
        }),
      );
      return [model, ranks] as const;
    }),
  );
  return Object.fromEntries(entries) as CheckpointSet;
}

/**
 * Loads the four models. From scratch: warms the actor up on demonstrations and copies it into
 * the reference and the critic's body. From a checkpoint: puts every kept model back as it was.
 */
export async function setupModels(d: Dispatcher, r: RunSpec, resume?: CheckpointSet): Promise<{ parameters: Record<string, number>; rewardModel?: RewardModelReport }> {
  const { scenario: s } = r;
  const parameters: Record<string, number> = {};
  const learned = s.reward.model;
  await Promise.all(
    MODELS.map(async (model) => {
      const lr = model === 'actor' ? s.ppo.actor_lr : model === 'critic' ? s.ppo.critic_lr : model === 'reward' ? learned?.lr : undefined;
      const serve = model === 'reward' && learned ? r.rewardService : undefined;
      parameters[model] = await loadModel(d, r, model, model, layoutOf(r, OWNER[model]), { ...(resume ? {} : { seed: s.seed }), lr, serve });
    }),
  );
  if (resume) {
    const kept = keptModels(r);
    for (const model of kept) {
      const ranks = layoutOf(r, OWNER[model]).devices.length;
      const held = resume[model]?.length ?? 0;
      if (held !== ranks) throw new Error(`the checkpoint holds ${held} rank(s) of '${model}'; the plan gives it ${ranks}`);
    }
    await Promise.all(kept.flatMap((model) => layoutOf(r, OWNER[model]).devices.map((device, rank) => d.restoreShard(device, model, -1, resume[model]![rank]!))));
    return { parameters };
  }
  if (s.warmup.steps > 0) {
    const demos = demonstrations(r.task, s.seed, s.warmup.demos);
    await callMesh(d, layoutOf(r, 'actor.train'), 'actor', -1, {
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
  const actorSpec = modelSpec(r, 'actor') as GptSpec;
  const from = { model: 'actor', layout: layoutOf(r, OWNER.actor) };
  await Promise.all([
    reallocate(d, r, 'init-reference', -1, from, { model: 'reference', layout: layoutOf(r, OWNER.reference) }, actorSpec),
    reallocate(
      d,
      r,
      'init-critic',
      -1,
      from,
      { model: 'critic', layout: layoutOf(r, OWNER.critic) },
      actorSpec,
      parameterShapes(actorSpec).map(([n]) => n).filter((n) => !isHead(n)),
      // The critic's value head weighs less than the actor's: its stages may split elsewhere.
      modelSpec(r, 'critic') as GptSpec,
    ),
  ]);
  if (!learned) return { parameters };
  return { parameters, rewardModel: await trainRewardModel(d, r) };
}

export interface RewardModelReport {
  /** Pairs the rule told apart (ties are dropped), of those drawn. */
  pairs: number;
  drawn: number;
  first_loss: number;
  loss: number;
  /** Share of the training pairs the trained model orders as the rule does. */
  accuracy: number;
}

/**
 * The learned reward: the reward model starts from the warmed-up actor's body, then learns from
 * pairs of the actor's own responses to one prompt, labelled by the rule (the human, hidden from
 * PPO), with the Bradley–Terry loss.
 */
async function trainRewardModel(d: Dispatcher, r: RunSpec): Promise<RewardModelReport> {
  const { scenario: s, task } = r;
  const m = s.reward.model!;
  const actorSpec = modelSpec(r, 'actor') as GptSpec;
  await reallocate(
    d,
    r,
    'init-reward',
    -1,
    { model: 'actor', layout: layoutOf(r, OWNER.actor) },
    { model: 'reward', layout: layoutOf(r, OWNER.reward) },
    actorSpec,
    parameterShapes(actorSpec).map(([n]) => n).filter((n) => !isHead(n)),
    modelSpec(r, 'reward') as GptSpec,
  );
  // Two samples per prompt, from their own seed streams (iterations past any PPO iteration's).
  const prompts = task.prompts(s.seed, PREFERENCE_STREAM, m.pairs);
  const both = new Int32Array(2 * m.pairs * task.promptLen);
  both.set(prompts, 0);
  both.set(prompts, prompts.length);
  const seeds = Uint32Array.from({ length: 2 * m.pairs }, (_, i) => seedOf(s.seed, Stream.sample, PREFERENCE_STREAM + Math.floor(i / m.pairs), i % m.pairs));
  const out = await callMesh(d, layoutOf(r, 'actor.train'), 'actor', -1, {
    fn: 'generate',
    prompts: both,
    batch: 2 * m.pairs,
    promptLen: task.promptLen,
    responseLen: task.responseLen,
    seeds,
    temperature: s.ppo.temperature,
  });
  const width = task.promptLen + task.responseLen;
  const chosen: number[][] = [];
  const rejected: number[][] = [];
  const judge = (a: ArrayLike<number>, b: ArrayLike<number>) => {
    const score = (x: ArrayLike<number>) => task.score(Array.from(x).slice(0, task.promptLen), Array.from(x).slice(task.promptLen));
    const [sa, sb] = [score(a), score(b)];
    if (sa === sb) return;
    chosen.push(Array.from(sa > sb ? a : b));
    rejected.push(Array.from(sa > sb ? b : a));
  };
  for (let i = 0; i < m.pairs; i++) {
    const a = out.tokens.subarray(i * width, (i + 1) * width);
    const b = out.tokens.subarray((m.pairs + i) * width, (m.pairs + i + 1) * width);
    judge(a, b);
    // The human also writes the answer it wants (a demonstration) and compares a sample with it.
    if (m.demonstrations) judge([...Array.from(a.subarray(0, task.promptLen)), ...task.target(a.subarray(0, task.promptLen))], a);
  }
  if (chosen.length === 0) throw new Error(`reward.model: the rule told none of ${m.pairs} pairs apart; draw more pairs or warm up longer`);
  const res = await d.call(layoutOf(r, OWNER.reward).devices[0]!, 'reward', -1, {
    fn: 'preference',
    chosen: Int32Array.from(chosen.flat()),
    rejected: Int32Array.from(rejected.flat()),
    batch: chosen.length,
    promptLen: task.promptLen,
    responseLen: task.responseLen,
    steps: m.steps,
    minibatch: m.batch,
    lr: m.lr,
    seed: seedOf(s.seed, Stream.shuffle, PREFERENCE_STREAM),
  });
  return { pairs: chosen.length, drawn: m.pairs, first_loss: res.first_loss, loss: res.loss, accuracy: res.accuracy };
}

/** The "iteration" of the preference pairs' prompt and sample streams: past any PPO iteration. */
const PREFERENCE_STREAM = 1_000_000;

export interface Rollout {
  iteration: number;
  batch: number;
  tokens: Int32Array;
  logprobs: Float32Array;
  /** Reallocations this iteration needed so far. */
  moved: Moved[];
}

export async function generateStage(d: Dispatcher, r: RunSpec, iteration: number): Promise<Rollout> {
  const { scenario: s, task } = r;
  const batch = s.ppo.batch;
  const prompts = task.prompts(s.seed, iteration, batch);
  const seeds = Uint32Array.from({ length: batch }, (_, i) => seedOf(s.seed, Stream.sample, iteration, i));
  const out = await onLayout(d, r, 'actor.generate', iteration, (name) =>
    callMesh(d, layoutOf(r, 'actor.generate'), name, iteration, {
      fn: 'generate',
      prompts,
      batch,
      promptLen: task.promptLen,
      responseLen: task.responseLen,
      seeds,
      temperature: s.ppo.temperature,
    }),
  );
  return { iteration, batch, tokens: out.tokens, logprobs: out.logprobs, moved: out.moved ? [out.moved] : [] };
}

export interface Scored {
  refLogprobs: Float32Array;
  /** The reward: the weighted sum of every source's score. */
  scores: Float32Array;
  values: Float32Array;
  /** Each source's mean score (`rule` for the reward device, actors by name). */
  sources: Record<string, number>;
}

/** Reward actors on the bus, by name (actors/reward-client.ts over NATS). */
export interface RewardSources {
  score(name: string, iteration: number, items: RewardItem[]): Promise<number[]>;
}

const digitText = (t: number, base: number) => (t < base ? t.toString(36) : '|');

/** A rollout's rows as reward protocol items: tokens, their text, and the task's own answer. */
export function rewardItems(r: RunSpec, ro: Rollout): RewardItem[] {
  const { promptLen, responseLen } = r.task;
  const base = r.scenario.task.base;
  const width = promptLen + responseLen;
  const text = (xs: number[]) => xs.map((t) => digitText(t, base)).join('');
  return Array.from({ length: ro.batch }, (_, b) => {
    const row = Array.from(ro.tokens.subarray(b * width, (b + 1) * width));
    const prompt = row.slice(0, promptLen);
    const response = row.slice(promptLen);
    return { id: `${ro.iteration}-${b}`, prompt, response, prompt_text: text(prompt), response_text: text(response), ground_truth: text(r.task.target(prompt)) };
  });
}

/** Reference, reward and critic inference, and the reward actors: no path between them, so they run at once. */
export async function inferStage(d: Dispatcher, r: RunSpec, ro: Rollout, sources?: RewardSources): Promise<Scored> {
  const batch = { tokens: ro.tokens, batch: ro.batch, promptLen: r.task.promptLen, responseLen: r.task.responseLen };
  const { weight, model: learned } = r.scenario.reward;
  // A learned reward model is reached like any reward actor: over the reward protocol.
  const actors = [...(learned && weight > 0 ? [{ name: r.rewardService, weight, as: 'learned' }] : []), ...r.scenario.reward.actors.map((a) => ({ ...a, as: a.name }))];
  if (actors.length && !sources) throw new Error(`reward actors (${actors.map((a) => a.as).join(', ')}) are reached over the bus; this run has none`);
  const items = actors.length ? rewardItems(r, ro) : [];
  const [ref, reward, critic, ...fromActors] = await Promise.all([
    callMesh(d, layoutOf(r, 'reference.inference'), 'reference', ro.iteration, { fn: 'inference', ...batch }),
    weight > 0 && !learned ? callMesh(d, layoutOf(r, 'reward.inference'), 'reward', ro.iteration, { fn: 'inference', ...batch }) : Promise.resolve(undefined),
    onLayout(d, r, 'critic.inference', ro.iteration, (name) => callMesh(d, layoutOf(r, 'critic.inference'), name, ro.iteration, { fn: 'inference', ...batch })),
    ...actors.map((a) => sources!.score(a.name, ro.iteration, items)),
  ]);
  if (critic.moved) ro.moved.push(critic.moved);
  const pick = <K extends string>(o: object, key: K, model: string): Float32Array => {
    const v = (o as Record<string, unknown>)[key];
    if (!(v instanceof Float32Array)) throw new Error(`${model}.inference replied without '${key}'`);
    return v;
  };
  // The weighted sum, in a fixed order (the rule, then the actors as listed), in float64.
  const total = new Float64Array(ro.batch);
  const sources_: Record<string, number> = {};
  const add = (name: string, w: number, xs: ArrayLike<number>) => {
    for (let b = 0; b < ro.batch; b++) total[b]! += w * xs[b]!;
    sources_[name] = mean(Array.from(xs));
  };
  if (reward) add('rule', weight, pick(reward, 'scores', 'reward'));
  actors.forEach((a, i) => add(a.as, a.weight, fromActors[i]!));
  return {
    refLogprobs: pick(ref, 'logprobs', 'reference'),
    scores: Float32Array.from(total),
    values: pick(critic, 'values', 'critic'),
    sources: sources_,
  };
}

/** The task's rule on a rollout, whatever the reward: what the hidden human thinks. */
export function ruleScore(r: RunSpec, ro: Rollout): number {
  const { promptLen, responseLen } = r.task;
  const width = promptLen + responseLen;
  let sum = 0;
  for (let b = 0; b < ro.batch; b++) {
    const row = ro.tokens.subarray(b * width, (b + 1) * width);
    sum += r.task.score(row.subarray(0, promptLen), row.subarray(promptLen));
  }
  return sum / ro.batch;
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
    callMesh(d, layoutOf(r, 'actor.train'), 'actor', ro.iteration, {
      fn: 'train',
      ...batch,
      seed: seedOf(s.seed, Stream.shuffle, ro.iteration, 0),
      old: ro.logprobs,
      target: Float32Array.from(whiten(advantages)),
    }),
    callMesh(d, layoutOf(r, 'critic.train'), 'critic', ro.iteration, {
      fn: 'train',
      ...batch,
      seed: seedOf(s.seed, Stream.shuffle, ro.iteration, 1),
      old: sc.values,
      target: Float32Array.from(returns),
    }),
  ]);
  return { reward_mean: mean(sc.scores), kl, actor_loss: actor.loss, critic_loss: critic.loss };
}

/** SHA-256 of each trained model's parameters, and every rank's ledger, from the devices that own them. */
export async function finalDigests(d: Dispatcher, r: RunSpec, iteration: number): Promise<{ digests: Record<string, string>; ledgers: Record<string, LedgerEntry[][]> }> {
  const trained = ['actor', 'critic'] as const;
  const outs = await Promise.all(trained.map((model) => Promise.all(layoutOf(r, OWNER[model]).devices.map((device) => d.call(device, model, iteration, { fn: 'manifest' })))));
  return {
    digests: Object.fromEntries(trained.map((model, i) => [model, meshDigest(outs[i]!.map((o) => o.digest))])),
    ledgers: Object.fromEntries(trained.map((model, i) => [model, outs[i]!.map((o) => o.ledger)])),
  };
}

/** Every device the plan uses, ascending. */
export function planDevices(r: RunSpec): number[] {
  return [...new Set(Object.values(r.plan).flatMap((p) => p.devices))].sort((a, b) => a - b);
}
