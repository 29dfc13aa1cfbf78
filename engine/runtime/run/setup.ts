// Setting an RL run's models up and taking their checkpoints: loading every model on its owner
// layout, the warm-up (on the task's demonstrations or an environment's expert), copying the
// models that start from another, a learned reward model's training, and checkpoints of every
// kept model's ranks. run.ts holds the calls on meshes these are made of.
import { PROTOCOL_VERSION, type Checkpoint, type SnapshotManifest } from '../../../mesh/wire/index.ts';
import { shardSlices, type Layout } from '../../../mesh/parallel/index.ts';
import { baseSpec, isHead, modelInfo, parameterShapes, type GptSpec } from '../../model/index.ts';
import { Stream, seedOf } from '../../model/index.ts';
import { turnCodec } from '../../episodes/index.ts';
import { demonstrations } from '../../device/index.ts';
import { demoRows, episodesSpec, type Demonstrate } from '../../environments/index.ts';
import { CallError, type Dispatcher, type Onto } from '../dispatch/dispatch.ts';
import { shardsProblem } from '../store/reshard.ts';
import { manifestBytes, objectName } from '../store/snapshots.ts';
import type { RunStore } from '../store/store.ts';
import { baseOwnerOf, basePolicy, callMesh, declOf, eosOf, episodeTaskOf, layoutOf, learnedReward, loadModel, modelSpec, ownerOf, reallocate, samplingOf, type Moved, type RunSpec } from './run.ts';

/** Per kept model, one checkpoint per rank of its owner layout. */
export type CheckpointSet = Record<string, Checkpoint[]>;

/**
 * The models whose state a checkpoint keeps: those with parameters (a learned reward model too,
 * not a rule), but a model that is its policy's base (baseOwnerOf: the policy keeps it).
 */
export function keptModels(r: RunSpec): string[] {
  return r.graph.models.filter((m) => (m.head !== 'reward' || r.scenario.reward.model) && baseOwnerOf(r, m.name) === undefined).map((m) => m.name);
}

/** Whether a model's shards own an optimizer: trained ones, and a learned reward model (trained at setup). */
export const optimized = (r: RunSpec, model: string): boolean => declOf(r, model).trained || learnedReward(r, model);

/** The learning rate a model's optimizer takes, if it has one. */
export const lrOf = (r: RunSpec, model: string) => (learnedReward(r, model) ? r.scenario.reward.model!.lr : declOf(r, model).trained ? declOf(r, model).lr : undefined);

/** The layout each kept model's checkpoint ranks are taken on: its owner's. */
export function checkpointLayouts(r: RunSpec): Record<string, Layout> {
  return Object.fromEntries(keptModels(r).map((model) => [model, layoutOf(r, ownerOf(r, model))]));
}

/**
 * A snapshot of every rank of every kept model after `iteration` (weights, and optimizer state
 * where it trains), each written by its own device into its own bucket, all at once; returns the
 * manifest that names them. Data-parallel replicas hold the same slices and the same state: the
 * first of them writes, and the others share its object. Object names carry the recovery epoch,
 * so a snapshot taken again after a recovery never overwrites one a manifest already names.
 */
export async function takeSnapshot(d: Dispatcher, r: RunSpec, iteration: number): Promise<SnapshotManifest> {
  const epoch = d.epoch;
  const models = await Promise.all(
    keptModels(r).map(async (model) => {
      const layout = layoutOf(r, ownerOf(r, model));
      const info = modelInfo(modelSpec(r, model) as GptSpec);
      const first = new Map<string, number>();
      const writers: number[] = [];
      const replicas = layout.devices.map((_, rank) => {
        const key = JSON.stringify(shardSlices(info, layout, rank));
        if (!first.has(key)) first.set(key, writers.push(rank) - 1);
        return first.get(key)!;
      });
      const shards = await Promise.all(
        writers.map(async (rank) => {
          const device = layout.devices[rank]!;
          const object = objectName(iteration, epoch, model, rank);
          const out = await d.call(device, model, iteration, { fn: 'snapshot', object, optimizer: optimized(r, model) });
          return { device, object, ...out };
        }),
      );
      return { model, layout, shards, replicas };
    }),
  );
  return {
    type: 'snapshot',
    v: PROTOCOL_VERSION,
    iteration,
    models: Object.fromEntries(models.map((m) => [m.model, m.shards])),
    replicas: Object.fromEntries(models.map((m) => [m.model, m.replicas])),
    layouts: Object.fromEntries(models.map((m) => [m.model, m.layout])),
  };
}

/** Takes a snapshot after `iteration` (takeSnapshot) and records it in the store; returns what it cost. */
export async function snapshotInto(d: Dispatcher, r: RunSpec, store: RunStore, iteration: number): Promise<SnapshotCost> {
  const t0 = performance.now();
  const manifest = await takeSnapshot(d, r, iteration);
  const t1 = performance.now();
  const { bytes } = await store.saveSnapshot(manifest);
  const t2 = performance.now();
  return { bytes: manifestBytes(manifest), manifest_bytes: bytes, write_seconds: (t1 - t0) / 1000, manifest_seconds: (t2 - t1) / 1000 };
}

/** What one snapshot cost: the bytes its devices wrote, the manifest's bytes (all that went through the supervisor), and the seconds of each. */
export interface SnapshotCost {
  bytes: number;
  manifest_bytes: number;
  write_seconds: number;
  manifest_seconds: number;
}

/**
 * How a rank comes back from a checkpoint when its device kept state through a reset
 * (supervisor/recovery.ts's restorePlan): `held` as it is, or moved `onto` the plan's layout in
 * place and sent only the `pieces` it lacks. A rank absent from the plan is loaded and sent whole.
 */
export type RankRestore = { held: true; parameters: number } | { onto: Onto; pieces: Checkpoint; parameters: number };
export type RestorePlan = Record<string, ReadonlyMap<number, RankRestore>>;

/** Waits for every promise to settle, then throws the first failure, if any: no call of a failed step is still arriving at a device when the next begins. */
export async function allSettled(all: Promise<unknown>[]): Promise<void> {
  const failed = (await Promise.allSettled(all)).find((x) => x.status === 'rejected');
  if (failed) throw (failed as PromiseRejectedResult).reason;
}

/**
 * Loads the algorithm's models. From scratch: warms the base policy up on demonstrations and
 * copies it into the models that start from it (whole, or its body under another head). From a
 * checkpoint: puts every kept model back as it was, each as soon as its own ranks are loaded;
 * ranks in `kept` are not loaded (their devices hold state proven equal to the checkpoint's): a
 * held one is sent nothing, one moved onto the plan's layout only the pieces it lacks.
 * `o.digests`: each rank sent a restore answers with the digest of the weights it holds after it
 * (`rankDigests`, per model and rank; a held rank has none).
 */
export async function setupModels(
  d: Dispatcher,
  r: RunSpec,
  resume?: CheckpointSet,
  demonstrate?: Demonstrate,
  kept: RestorePlan = {},
  o: { digests?: boolean } = {},
): Promise<{ parameters: Record<string, number>; warmup?: WarmupReport; rewardModel?: RewardModelReport; rankDigests?: Record<string, Map<number, string>> }> {
  const { scenario: s } = r;
  const parameters: Record<string, number> = {};
  const planOf = (model: string) => (resume ? (kept[model] ?? new Map<number, RankRestore>()) : new Map<number, RankRestore>());
  const restoring = new Set(resume ? keptModels(r) : []);
  // A model that is its policy's base is the policy's shards: nothing to load, fill or restore.
  const own = r.graph.models.filter((m) => baseOwnerOf(r, m.name) === undefined);
  // From a checkpoint that shared it (another plan), a base model is loaded and filled from its policy.
  const fromPolicy = resume ? own.filter((m) => m.from !== undefined && restoring.has(m.name) && !resume[m.name]?.length && resume[m.from]?.length) : [];
  for (const m of fromPolicy) restoring.delete(m.name);
  if (resume) {
    for (const model of restoring) {
      const problem = shardsProblem(modelSpec(r, model) as GptSpec, model, layoutOf(r, ownerOf(r, model)), resume[model] ?? []);
      if (problem) throw new Error(problem);
    }
  }
  const digests: Record<string, Map<number, string>> = {};
  const restore = (model: string) =>
    allSettled(
      layoutOf(r, ownerOf(r, model)).devices.map(async (device, rank) => {
        const p = planOf(model).get(rank);
        if (p !== undefined && 'held' in p) return;
        const answer = await d.restoreShard(device, model, -1, p === undefined ? resume![model]![rank]! : p.pieces, { ...(p ? { onto: p.onto } : {}), digest: o.digests === true });
        if (answer.digest !== undefined) (digests[model] ??= new Map()).set(rank, answer.digest);
      }),
    );
  // Every model's calls settle before a failure is thrown: a recovery that goes on to another
  // snapshot must not meet a restore of this one still arriving at a device.
  await allSettled(
    own.map(async ({ name }) => {
      const serve = learnedReward(r, name) ? r.rewardService : undefined;
      const skip = planOf(name);
      const loaded = await loadModel(d, r, name, name, layoutOf(r, ownerOf(r, name)), { ...(resume ? {} : { seed: s.seed }), lr: lrOf(r, name), serve, skip: new Set(skip.keys()) });
      parameters[name] = loaded + [...skip.values()].reduce((n, x) => n + x.parameters, 0);
      if (restoring.has(name)) await restore(name);
    }),
  );
  if (resume) {
    await Promise.all(fromPolicy.map((m) => copyModel(d, r, m.from!, m.name, `init-${m.name}`)));
    return { parameters, ...(o.digests ? { rankDigests: digests } : {}) };
  }
  const base = basePolicy(r);
  let warmup: WarmupReport | undefined;
  if (base && s.warmup.steps > 0) {
    const fromEnv = s.warmup.source === 'environment' ? await environmentDemos(r, demonstrate) : undefined;
    const demos = fromEnv?.tokens ?? demonstrations(r.task, s.seed, s.warmup.demos);
    const out = await callMesh(d, layoutOf(r, ownerOf(r, base)), base, -1, {
      fn: 'sft',
      ...(fromEnv ? { mask: fromEnv.mask } : {}),
      tokens: demos,
      batch: s.warmup.demos,
      promptLen: r.task.promptLen,
      responseLen: r.task.responseLen,
      steps: s.warmup.steps,
      minibatch: s.warmup.batch,
      lr: s.warmup.lr,
      seed: seedOf(s.seed, Stream.demos),
      ...eosOf(r.task),
    });
    warmup = { steps: s.warmup.steps, first_loss: out.first_loss, loss: out.loss, ...(fromEnv ? { source: 'environment' as const, turns: fromEnv.turns } : {}) };
  }
  // Models that start from another (a frozen reference, a critic's body) copy it once it is warm.
  await Promise.all(own.filter((m) => m.from !== undefined).map((m) => copyModel(d, r, m.from!, m.name, `init-${m.name}`)));
  const learned = r.graph.models.find((m) => learnedReward(r, m.name));
  const warm = warmup ? { warmup } : {};
  if (!learned || !base) return { parameters, ...warm };
  return { parameters, ...warm, rewardModel: await trainRewardModel(d, r, base, learned.name) };
}

/**
 * The warm-up's demonstrations from the environment's expert: a prompt per row (the task's, apart
 * from RL's), a game of its own per row, laid out as episodes are and trained on the actions only.
 * A failure (no expert, no instance, a demonstration that does not encode) fails the run: setting
 * up again would ask the same environment.
 */
async function environmentDemos(r: RunSpec, demonstrate: Demonstrate | undefined): Promise<{ tokens: Int32Array; mask: Float32Array; turns: number }> {
  const { scenario: s, task } = r;
  const key = s.environment!;
  if (!demonstrate) throw new CallError('environment', `warm-up: warmup.source is 'environment' and this supervisor has no client for environment '${key.name}'`);
  const info = episodeTaskOf(r);
  const count = s.warmup.demos;
  const prompts = task.prompts(seedOf(s.seed, Stream.demos), -1, count);
  const spec = episodesSpec(key, info, seedOf(s.seed, Stream.demos), 0, prompts, 1);
  try {
    return await demoRows(demonstrate, turnCodec(spec.codec, info.eos), {
      prompts,
      tasks: spec.tasks,
      ids: spec.ids.map((_, i) => `warmup-${i}`),
      promptLen: task.promptLen,
      responseLen: task.responseLen,
      maxTurns: key.max_turns,
      ...(info.eos !== undefined ? { eos: info.eos } : {}),
      ...(key.stop_strings.length ? { stopStrings: key.stop_strings } : {}),
      fill: info.fill,
    });
  } catch (e) {
    throw new CallError('environment', `warm-up from environment '${key.name}': ${(e as Error).message}`, { cause: e });
  }
}

/** Copies `from`'s weights into `to` over their owner layouts: all of them, or the body when the heads differ. */
async function copyModel(d: Dispatcher, r: RunSpec, from: string, to: string, id: string): Promise<Moved> {
  const fromSpec = modelSpec(r, from) as GptSpec;
  const toSpec = modelSpec(r, to) as GptSpec;
  // The base's parameters: a value model's head is its own, and adapters start afresh on each
  // trained model (a reference, the base alone, has none).
  const names =
    fromSpec.kind === toSpec.kind && !fromSpec.lora && !toSpec.lora
      ? undefined
      : parameterShapes(baseSpec(fromSpec))
          .map(([n]) => n)
          .filter((n) => fromSpec.kind === toSpec.kind || !isHead(n));
  // A value head weighs less than a token head: the stages of the copy may split elsewhere.
  return reallocate(d, r, id, -1, { model: from, layout: layoutOf(r, ownerOf(r, from)) }, { model: to, layout: layoutOf(r, ownerOf(r, to)) }, fromSpec, names, toSpec);
}

/** The supervised warm-up: its steps and the cross-entropy of its first and last mini-batch. */
export interface WarmupReport {
  steps: number;
  first_loss: number;
  loss: number;
  /** From the environment's expert: its actions per demonstration, mean. */
  source?: 'environment';
  turns?: number;
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
 * The learned reward: the reward model starts from the warmed-up policy's body, then learns from
 * pairs of the policy's own responses to one prompt, labelled by the rule (the human, hidden from
 * the RL iterations), with the Bradley–Terry loss.
 */
async function trainRewardModel(d: Dispatcher, r: RunSpec, base: string, reward: string): Promise<RewardModelReport> {
  const { scenario: s, task } = r;
  const m = s.reward.model!;
  await copyModel(d, r, base, reward, `init-${reward}`);
  // Two samples per prompt, from their own seed streams (iterations past any RL iteration's).
  const prompts = task.prompts(s.seed, PREFERENCE_STREAM, m.pairs);
  const both = new Int32Array(2 * m.pairs * task.promptLen);
  both.set(prompts, 0);
  both.set(prompts, prompts.length);
  const seeds = Uint32Array.from({ length: 2 * m.pairs }, (_, i) => seedOf(s.seed, Stream.sample, PREFERENCE_STREAM + Math.floor(i / m.pairs), i % m.pairs));
  const out = await callMesh(d, layoutOf(r, ownerOf(r, base)), base, -1, {
    fn: 'generate',
    prompts: both,
    batch: 2 * m.pairs,
    promptLen: task.promptLen,
    responseLen: task.responseLen,
    seeds,
    ...samplingOf(r),
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
  const res = await d.call(layoutOf(r, ownerOf(r, reward)).devices[0]!, reward, -1, {
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

/** The "iteration" of the preference pairs' prompt and sample streams: past any RL iteration. */
const PREFERENCE_STREAM = 1_000_000;
