// One iteration of an algorithm's graph: its sources, generations (ahead under rl.lag and
// rl.staleness), rewards from rules, models and actors, inference and training, the host steps
// between them, and what an iteration keeps in the run's store; the digests of what was trained.
import type { InflightSpec, LedgerEntry } from '../../../mesh/wire/index.ts';
import type { EpisodeRecordWire, RewardItem } from '../../../mesh/wire/index.ts';
import type { Dispatcher } from '../dispatch/dispatch.ts';
import { mean, rowLengths, readPairsFile, runGraph, taskPairs, type CallDecl, type Fields } from '../../algorithms/index.ts';
import type { PairsFile } from '../../algorithms/index.ts';
import { tokensDigest } from '../../device/index.ts';
import { admitted, asynchronyOf, copyOf, decidedAhead, decisionsOf, generatesWith, handOver, tokenStaleness, type NextViews, type SwitchDecision } from '../../asynchrony/index.ts';
import { Stream, masked, responseLengths, responseMask, seedOf } from '../../model/index.ts';
import { rowsOf, tokenizerDir, type CallName } from '../scenario/scenario.ts';
import type { RunStore } from '../store/store.ts';
import type { Task } from '../../device/index.ts';
import { EpisodeBook, TurnLedger, episodesSpec, type EpisodeMetrics, type EpisodeTaskInfo, type PlayedEpisodes } from '../../environments/index.ts';
import { declOf, layoutOf, ownerOf, samplingOf, viewOf, type RunSpec } from './spec.ts';
import { callMesh, holdView, meshDigest, onLayout, releaseView, type HeldView, type Moved } from './mesh-calls.ts';
import { SampleLedger } from '../../generation/index.ts';
import { EarlyRewards } from './early-rewards.ts';

/** Reward actors on the bus, by name (actors/reward-client.ts over NATS). */
export interface RewardSources {
  score(name: string, iteration: number, items: RewardItem[]): Promise<number[]>;
}

/**
 * Rows of sequences as reward protocol items: tokens, their text, and the task's own answer. A
 * response is the tokens it has (up to and with its end token), not its padding; the text leaves
 * the end token out.
 */
export function rewardItems(r: RunSpec, iteration: number, tokens: Int32Array, mask?: Float32Array): RewardItem[] {
  const { task } = r;
  const { promptLen, responseLen, eos } = task;
  const width = promptLen + responseLen;
  // An episode's response runs to its last action: its observations are in the text too.
  const lengths = mask ? rowLengths(tokens.length / width, responseLen, mask) : responseLengths(tokens, promptLen, responseLen, eos);
  return Array.from({ length: tokens.length / width }, (_, b) => rewardItem(r, iteration, b, tokens.subarray(b * width, (b + 1) * width), lengths[b]!));
}

/** Row `b` of an iteration's sequences as a reward protocol item: its response is its first `length` tokens after the prompt. */
function rewardItem(r: RunSpec, iteration: number, b: number, tokens: Int32Array, length: number): RewardItem {
  const { task } = r;
  const row = Array.from(tokens);
  const prompt = row.slice(0, task.promptLen);
  const response = row.slice(task.promptLen, task.promptLen + length);
  return { id: `${iteration}-${b}`, prompt, response, prompt_text: task.text(prompt), response_text: task.text(response), ground_truth: task.answer(prompt) };
}

/** The reward actors on the bus a reward call asks, in order: a learned reward model's service, then the scenario's actors. */
function rewardActors(r: RunSpec): Array<{ name: string; weight: number; as: string }> {
  const { weight, model: learned } = r.scenario.reward;
  return [...(learned && weight > 0 ? [{ name: r.rewardService, weight, as: 'learned' }] : []), ...r.scenario.reward.actors.map((a) => ({ ...a, as: a.name }))];
}

/**
 * The reward of every row: the reward device's rule (its weight), a learned reward model and
 * reward actors on the bus, each reached over the reward protocol, summed by weight in a fixed
 * order (the rule, then the actors as listed) in float64. Also each source's mean.
 */
async function rewardScores(
  d: Dispatcher,
  r: RunSpec,
  call: CallDecl,
  iteration: number,
  tokens: Int32Array,
  sources?: RewardSources,
  /** For sequences that episodes made: each row's return, and the action mask. */
  played?: { returns: Float64Array; mask: Float32Array },
  /** Scores asked as a continuous generation's rows ended. */
  early?: EarlyRewards,
): Promise<{ scores: Float32Array; sources: Record<string, number> }> {
  const rows = tokens.length / (r.task.promptLen + r.task.responseLen);
  const { weight, model: learned } = r.scenario.reward;
  // A learned reward model is reached like any reward actor: over the reward protocol.
  const actors = rewardActors(r);
  if (actors.length && !sources) throw new Error(`reward actors (${actors.map((a) => a.as).join(', ')}) are reached over the bus; this run has none`);
  const items = actors.length ? rewardItems(r, iteration, tokens, played?.mask) : [];
  const [rule, ...fromActors] = await Promise.all([
    weight > 0 && !learned
      ? callMesh(
          d,
          layoutOf(r, call.name),
          call.model,
          iteration,
          { fn: 'inference', tokens, batch: rows, promptLen: r.task.promptLen, responseLen: r.task.responseLen, ...answersOf(r, tokens) },
          call.name,
        )
      : Promise.resolve(undefined),
    ...actors.map((a) => (early ? early.scores(sources!, a.name, iteration, tokens, items) : sources!.score(a.name, iteration, items))),
  ]);
  const total = new Float64Array(rows);
  const means: Record<string, number> = {};
  const add = (name: string, w: number, xs: ArrayLike<number>) => {
    for (let b = 0; b < rows; b++) total[b]! += w * xs[b]!;
    means[name] = mean(Array.from(xs));
  };
  if (rule) add('rule', weight, pick(rule, 'scores', call.name));
  actors.forEach((a, i) => add(a.as, a.weight, fromActors[i]!));
  if (played && r.scenario.environment) add('environment', r.scenario.environment.weight, played.returns);
  return { scores: Float32Array.from(total), sources: means };
}

/** A verifier's reference answers, one per row (a dataset task's rule reads them from the call). */
function answersOf(r: RunSpec, tokens: Int32Array): { answers?: string[] } {
  if (!r.scenario.data) return {};
  const { promptLen, responseLen } = r.task;
  const width = promptLen + responseLen;
  return { answers: Array.from({ length: tokens.length / width }, (_, b) => r.task.answer(tokens.subarray(b * width, b * width + promptLen))) };
}

function pick(o: object, key: string, call: string): Float32Array {
  const v = (o as Record<string, unknown>)[key];
  if (!(v instanceof Float32Array)) throw new Error(`${call} replied without '${key}'`);
  return v;
}

/** The task's rule on rows of sequences, whatever the reward: what the hidden human thinks. */
export function ruleScore(r: RunSpec, tokens: Int32Array): number {
  const { promptLen, responseLen } = r.task;
  const width = promptLen + responseLen;
  const rows = tokens.length / width;
  let sum = 0;
  for (let b = 0; b < rows; b++) {
    const row = tokens.subarray(b * width, (b + 1) * width);
    sum += r.task.score(row.subarray(0, promptLen), row.subarray(promptLen));
  }
  return sum / rows;
}

/**
 * The rollout's lengths, for a task whose answers end (every response of another task is the
 * budget long): the mean tokens a response has, its end token counted, and the share of responses
 * that ran into the budget without ending.
 */
export function responseStats(r: RunSpec, tokens: Int32Array): { response_length?: number; response_at_limit?: number } {
  const { promptLen, responseLen, eos } = r.task;
  if (eos === undefined) return {};
  const lengths = responseLengths(tokens, promptLen, responseLen, eos);
  const width = promptLen + responseLen;
  let atLimit = 0;
  for (let b = 0; b < lengths.length; b++) if (tokens[b * width + promptLen + lengths[b]! - 1] !== eos) atLimit += 1;
  return { response_length: mean(lengths), response_at_limit: lengths.length ? atLimit / lengths.length : 0 };
}

/** Pairs files, read once per process. */
const pairFiles = new Map<string, PairsFile>();

/** The fields an iteration starts with: the task's prompts (each `group` times) or preference pairs. */
export function sourceOf(r: RunSpec, iteration: number): Fields {
  const { scenario: s, task, graph } = r;
  if (graph.source === 'pairs') {
    if (graph.pairsFile === undefined) return { pairs: taskPairs(task, s.seed, iteration, s.rl.batch) };
    let file = pairFiles.get(graph.pairsFile);
    if (!file) pairFiles.set(graph.pairsFile, (file = readPairsFile(graph.pairsFile, task)));
    return { pairs: file.batch(s.seed, iteration, s.rl.batch) };
  }
  const once = task.prompts(s.seed, iteration, s.rl.batch);
  const G = graph.group;
  if (G === 1) return { prompts: once };
  const P = task.promptLen;
  const prompts = new Int32Array(once.length * G);
  for (let p = 0; p < s.rl.batch; p++) for (let g = 0; g < G; g++) prompts.set(once.subarray(p * P, (p + 1) * P), (p * G + g) * P);
  return { prompts };
}

/** Where a free-running run writes, ahead, the version that generates an iteration's rollouts. */
export const SCHEDULE_STAGE = 'schedule';

/** What a stored call result is kept under: the call's name as a subject token. */
export const stageOf = (call: CallName) => call.replaceAll('.', '__');

export interface IterationResult {
  fields: Fields;
  /** Reallocations into views this iteration needed. */
  moved: Moved[];
  /** Each reward source's mean (`rule`, `learned`, actors by name). */
  sources: Record<string, number>;
  /** Response tokens generated. */
  generated: number;
  /** With an environment: the rollout's episodes, measured, and a few of them as they went. */
  episodes?: EpisodeMetrics & { sample: EpisodeRecordWire[] };
  /** Under rl.lag or rl.staleness: the policy version (updates before it) that generated the rollout trained on. */
  version?: number;
  /** In flight (rl.inflight): how many updates behind this one the rollout's tokens were drawn (mean, most), and the passes each generation switched version at, by call. */
  tokenStaleness?: { mean: number; max: number };
  switches?: Record<CallName, SwitchDecision[]>;
}

/** Where a generation's in-flight decisions are written ahead, for iteration u. */
export const switchesStage = (stage: string) => `switches-${stage}`;

/** What episodes need of the scenario's task: its texts, end token, and how its text becomes tokens. */
export function episodeTaskOf(r: RunSpec, task: Task = r.task): EpisodeTaskInfo {
  const { scenario: s } = r;
  const dir = tokenizerDir(s);
  return {
    promptLen: task.promptLen,
    responseLen: task.responseLen,
    ...(task.eos !== undefined ? { eos: task.eos } : {}),
    fill: task.eos ?? task.pad ?? 0,
    text: (t) => task.text(t),
    answer: (p) => task.answer(p),
    codec: s.data && dir ? { kind: 'tokenizer', dir, template: s.data.chat } : { kind: 'digits', base: s.task.base },
  };
}

/**
 * One iteration of the algorithm's graph: every call and step as soon as its fields exist, calls
 * with no path between them at once. A call that changes no state (generation, inference) is
 * read back from the store when this iteration already ran it (a replay after a recovery), and
 * stored when it runs; training always runs, from the restored state.
 */
export async function runIteration(
  d: Dispatcher,
  r: RunSpec,
  iteration: number,
  store: Pick<RunStore, 'loadStage' | 'saveStage'>,
  sources?: RewardSources,
  /** Under asynchrony, the views of the next version, filled while this one generates (kept between iterations). */
  views?: NextViews<HeldView>,
): Promise<IterationResult> {
  const { scenario: s, task } = r;
  const moved: Moved[] = [];
  // Each reward call's sources; the metrics show those of the call that gives the reward.
  const callSources = new Map<string, Record<string, number>>();
  let generated = 0;
  const trainIndex = new Map(r.graph.calls.filter((c) => c.fn === 'train').map((c, i) => [c.name, i]));
  const asynchrony = asynchronyOf(s.rl);
  const batchOf = (tokens: Int32Array) => ({ tokens, batch: tokens.length / (task.promptLen + task.responseLen), promptLen: task.promptLen, responseLen: task.responseLen });
  // Every response's mask comes from its tokens and the task's end token, or for episodes, from
  // the generating device (their observations are read, never trained on): device calls get it
  // with the tokens they read, and generation writes it for the host steps.
  const book = new EpisodeBook();
  // Reward actors' scores of continuously generated rows, asked as each row ended.
  const early = new EarlyRewards();
  /** Whether reward actors score a generate call's sequences (a reward call reads its tokens). */
  const scoredByActors = (c: CallDecl) => rewardActors(r).length > 0 && r.graph.calls.some((x) => x.fn === 'inference' && declOf(r, x.model).head === 'reward' && x.reads.tokens === c.writes.tokens);
  const maskOf = (tokens: Int32Array) => book.mask(tokens) ?? responseMask(tokens, task.promptLen, task.responseLen, task.eos);
  /**
   * A generate call's rows for iteration `u`'s prompts (this iteration's, or one generated ahead
   * under rl.lag). `queued`: told once the call's work is queued on its devices with the weights it
   * reads (after the reallocation to its layout): nothing queued later can change them under it.
   */
  const generateRows = async (c: CallDecl & { fn: 'generate' }, prompts: Int32Array, u: number, queued?: () => void, on?: HeldView, inflight?: InflightSpec) => {
    const rows = prompts.length / task.promptLen;
    // Decoded continuously in rl.slots slots; in flight without them, every row of the call at once.
    const slots = s.rl.slots > 0 ? s.rl.slots : inflight ? rows : 0;
    const seeds = Uint32Array.from({ length: rows }, (_, i) => seedOf(s.seed, Stream.sample, u, i));
    // Episodes: the answers they receive are kept as they come (the ledger); played again after
    // a fault, the call carries those answers and the environment is not asked them again.
    const stage = stageOf(c.name);
    const ledger = s.environment ? await TurnLedger.open(store, d.turns ? (listen) => d.turns!((log) => listen(log)) : undefined, { iteration: u, stage, epoch: d.epoch }) : undefined;
    const recorded = ledger && ledger.size > 0 ? ledger.recorded().answers : undefined;
    // Continuous generation: each row is kept as it ends (the sample ledger) and its reward asked
    // then; called again after a fault, the generation asks only for the rows not kept.
    const samples =
      slots > 0 && !s.environment
        ? await SampleLedger.open(store, d.samples ? (listen) => d.samples!((log) => listen(log)) : undefined, {
            iteration: u,
            stage,
            epoch: d.epoch,
            rows,
            width: task.promptLen + task.responseLen,
            responseLen: task.responseLen,
            // In flight, a generation called again after a fault makes every row again: the replay of
            // its recorded decisions is then one call, as this one is.
            ...(inflight ? { whole: true } : {}),
          })
        : undefined;
    const scoring =
      samples && sources && scoredByActors(c)
        ? early.begin(
            sources,
            rewardActors(r).map((a) => a.name),
            u,
          )
        : undefined;
    if (scoring) samples!.listen((row, tokens) => scoring.row(row, rewardItem(r, u, row, tokens, responseLengths(tokens, task.promptLen, task.responseLen, task.eos)[0]!)));
    const asked = samples?.ask();
    const pick = <T extends Int32Array | Uint32Array>(x: T, per: number): T => {
      if (!asked || asked.length === rows) return x;
      const out = new (x.constructor as new (n: number) => T)(asked.length * per);
      asked.forEach((row, i) => out.set(x.subarray(row * per, (row + 1) * per), i * per));
      return out;
    };
    const body = (name: string) => {
      const call = callMesh(
        d,
        layoutOf(r, c.name),
        name,
        u,
        {
          fn: 'generate',
          prompts: pick(prompts, task.promptLen),
          batch: asked?.length ?? rows,
          promptLen: task.promptLen,
          responseLen: task.responseLen,
          seeds: pick(seeds, 1),
          ...samplingOf(r),
          ...(c.greedy ? { greedy: true } : {}),
          ...(s.environment
            ? {
                episodes: {
                  ...episodesSpec(s.environment, episodeTaskOf(r), s.seed, u, prompts, r.graph.group),
                  log: stage,
                  ...(recorded ? { recorded } : {}),
                  ...(s.rl.slots > 0 ? { slots: s.rl.slots } : {}),
                },
              }
            : {}),
          ...(samples ? { slots, samples: stage } : {}),
          ...(inflight ? { inflight } : {}),
        },
        c.name,
      );
      queued?.();
      return call;
    };
    let out: Awaited<ReturnType<typeof body>> & { moved?: Moved };
    try {
      if (asked?.length === 0) {
        // Every row was kept before a fault: nothing to generate.
        queued?.();
        out = samples!.rollout();
      } else {
        out = await (on ? body(on.name) : onLayout(d, r, c.name, u, body));
        if (samples) out = { ...out, ...samples.rollout(out) };
      }
    } finally {
      await Promise.all([ledger?.close(), samples?.close()]);
    }
    scoring?.of(out.tokens);
    const into = out.moved;
    if (into) moved.push(into);
    const mask = out.mask && out.episodes ? out.mask : responseMask(out.tokens, task.promptLen, task.responseLen, task.eos);
    // An episode's step rewards, weighted as its return is in the reward, for the token-level estimators.
    const w = s.environment?.weight ?? 0;
    const stepRewards = out.rewards && w !== 0 ? out.rewards.map((x) => w * x) : new Float32Array(mask.length);
    return {
      ...out,
      ports: { tokens: out.tokens, logprobs: out.logprobs, mask, step_rewards: stepRewards } as Fields,
      generated: mask.reduce((n, m) => n + m, 0),
    };
  };
  const runCall = async (c: CallDecl, inputs: Fields): Promise<Fields> => {
    const port = (p: string) => inputs[c.reads[p]!];
    if (c.fn === 'generate') {
      const out = await generateRows(c, port('prompts') as Int32Array, iteration);
      book.note(out.tokens, out);
      generated += out.generated;
      return out.ports;
    }
    if (c.fn === 'inference') {
      const tokens = port('tokens') as Int32Array;
      if (declOf(r, c.model).head === 'reward') {
        const returns = book.returns(tokens);
        const out = await rewardScores(d, r, c, iteration, tokens, sources, returns ? { returns, mask: book.mask(tokens)! } : undefined, early);
        callSources.set(c.name, out.sources);
        return { scores: out.scores };
      }
      const out = await onLayout(d, r, c.name, iteration, (name, base) =>
        callMesh(d, layoutOf(r, c.name), name, iteration, { fn: 'inference', ...batchOf(tokens), ...(base ? { base } : {}) }, c.name),
      );
      if (out.moved) moved.push(out.moved);
      const key = declOf(r, c.model).head === 'policy' ? 'logprobs' : 'values';
      return { [key]: masked(pick(out, key, c.name), maskOf(tokens)) };
    }
    const data = Object.fromEntries(
      Object.entries(c.reads)
        .filter(([p]) => p !== 'tokens')
        .map(([p, f]) => [p, inputs[f] as Float32Array]),
    );
    data.mask = maskOf(port('tokens') as Int32Array);
    const out = await callMesh(
      d,
      layoutOf(r, c.name),
      c.model,
      iteration,
      {
        fn: 'train',
        ...batchOf(port('tokens') as Int32Array),
        seed: seedOf(s.seed, Stream.shuffle, iteration, trainIndex.get(c.name)!),
        epochs: s.rl.epochs,
        minibatches: s.rl.minibatches,
        loss: c.loss,
        data,
        ...(asynchrony ? { version: versionOf(c) } : {}),
      },
      c.name,
    );
    return { loss: out.loss, grad_norm: out.grad_norm, ...out.stats };
  };
  // Asynchrony (rl.lag, rl.staleness; engine/asynchrony/schedule.ts): later iterations whose
  // rollouts come from the version this iteration starts with are generated now and stored as
  // those iterations' stages (they read them back), and so are the calls of frozen models that read
  // nothing but the rollout (the reference's log-probs, the reward; not with an environment, whose
  // returns come with the episodes): none of them depends on the policy's updates. A generation
  // holds its view, filled once with this version's weights, for all it generates. This
  // iteration's own rollout, when none is stored (the first iteration, or a resumed one), is
  // generated before its graph; the decided ahead are queued on their devices before anything of
  // this iteration can update the weights they read, and run (then are scored) while it trains.
  // Free-running (rl.staleness), the rollout devices then go on with the next admitted iterations
  // until the training is done, each written ahead before it starts. All is stored before the
  // iteration ends. A view this iteration's version was moved into beside the last iteration's
  // generation (see below) is taken over; otherwise it is filled when first needed.
  const ahead: Array<Promise<void>> = [];
  const held = new Map<CallName, Promise<HeldView>>();
  // In flight: the generations sent on this version's view and not done, by call, in the order
  // they were sent (a device runs them in that order: the first is the one decoding), for the next
  // version to be handed to.
  const running = new Map<CallName, Array<{ u: number; view: HeldView }>>();
  let trained = false;
  const gens = r.graph.calls.filter((c): c is CallDecl & { fn: 'generate' } => c.fn === 'generate');
  // The epoch this iteration's calls belong to (the fence's: a stage never outlives it).
  const epoch = d.epoch;
  for (const c of asynchrony ? gens : []) {
    const { view, stale } = views?.take(c.name, iteration, epoch, r) ?? {};
    // Its move was counted in the iteration that made it.
    if (view)
      held.set(
        c.name,
        view.then((v) => ({ ...v, moved: undefined })),
      );
    // Filled before an interruption that reset no device (a re-plan that kept the plan): freed
    // where it was filled, beside whatever runs there, whoever answers.
    if (stale) void stale.view.then((v) => releaseView(d, v.name, layoutOf(stale.plan as RunSpec, c.name), iteration, true)).catch(() => {});
  }
  if (asynchrony) {
    const rollout = new Set(gens.flatMap((c) => Object.values(c.writes)));
    const frozen = s.environment ? [] : r.graph.calls.filter((c) => c.fn === 'inference' && !declOf(r, c.model).trained && Object.values(c.reads).every((f) => rollout.has(f)));
    const keptFields = async (c: CallDecl, u: number): Promise<Fields | undefined> => {
      const kept = await store.loadStage<{ ports: Fields }>(u, stageOf(c.name));
      return kept && keptProblem(c, kept) === undefined ? rename(c, kept.ports) : undefined;
    };
    const viewFor = (c: CallDecl) => {
      if (!held.has(c.name)) held.set(c.name, holdView(d, r, c.name, iteration, { copy: copyOf(iteration) }));
      return held.get(c.name)!;
    };
    const generateAndStore = async (c: CallDecl & { fn: 'generate' }, u: number, queued?: () => void): Promise<Fields> => {
      const view = await viewFor(c);
      if (view.moved && !moved.includes(view.moved)) moved.push(view.moved);
      // In flight, the generation may go on with the next version (handed over below); a replay's carries its recorded decisions.
      const planned = s.rl.switches?.[String(u)]?.[c.name];
      const inflight: InflightSpec | undefined = s.rl.inflight && view.isView ? { version: iteration, kv: s.rl.inflight_kv, ...(planned ? { switches: planned } : {}) } : undefined;
      const entry = { u, view };
      if (inflight) running.set(c.name, [...(running.get(c.name) ?? []), entry]);
      let out: Awaited<ReturnType<typeof generateRows>>;
      try {
        out = await generateRows(c, sourceOf(r, u)[c.reads.prompts!] as Int32Array, u, queued, view, inflight);
      } finally {
        running.set(
          c.name,
          (running.get(c.name) ?? []).filter((x) => x !== entry),
        );
      }
      const played = new EpisodeBook().note(out.tokens, out);
      const switches = out.switches ? decisionsOf(out.switches) : undefined;
      await store.saveStage(u, stageOf(c.name), {
        ports: keptPorts(c, out.ports),
        generated: out.generated,
        version: iteration,
        ...(played ? { played } : {}),
        ...(out.versions ? { tokenVersions: out.versions } : {}),
        ...(switches ? { switches } : {}),
      });
      return rename(c, out.ports);
    };
    const scoreAndStore = async (u: number, fields: Fields) => {
      for (const c of frozen) {
        if (await keptFields(c, u)) continue;
        const tokens = fields[c.reads.tokens!] as Int32Array;
        if (declOf(r, c.model).head === 'reward') {
          const out = await rewardScores(d, r, c, u, tokens, sources, undefined, early);
          await store.saveStage(u, stageOf(c.name), { ports: keptPorts(c, { scores: out.scores }), sources: out.sources, generated: 0 });
          continue;
        }
        const out = await onLayout(d, r, c.name, u, (name, base) => callMesh(d, layoutOf(r, c.name), name, u, { fn: 'inference', ...batchOf(tokens), ...(base ? { base } : {}) }, c.name));
        if (out.moved) moved.push(out.moved);
        const key = declOf(r, c.model).head === 'policy' ? 'logprobs' : 'values';
        await store.saveStage(u, stageOf(c.name), { ports: keptPorts(c, { [key]: masked(pick(out, key, c.name), maskOf(tokens)) }), generated: 0 });
      }
    };
    /** Iteration u's rollout; `queue`: returns once its generations are queued, with the rest (and, ahead, the scores) to await. */
    const produce = async (u: number, queue: boolean): Promise<{ rest: Promise<void> }> => {
      const made: Array<Promise<Fields>> = [];
      for (const c of gens) {
        const have = await keptFields(c, u);
        if (have) made.push(Promise.resolve(have));
        else if (!queue) made.push(Promise.resolve(await generateAndStore(c, u)));
        else {
          let queued!: () => void;
          const ready = new Promise<void>((res) => (queued = res));
          const done = generateAndStore(c, u, queued);
          done.catch(() => {});
          await Promise.race([ready, done]);
          made.push(done);
        }
      }
      // In an object: an async function's promise would wait for this one.
      return { rest: Promise.all(made).then(async (fs) => (u !== iteration ? scoreAndStore(u, Object.assign({}, ...fs)) : undefined)) };
    };
    // Written ahead (free-running): the version that generates iteration u, before it starts.
    const record = (u: number) => (asynchrony.mode === 'staleness' ? store.saveStage(u, SCHEDULE_STAGE, { version: iteration }) : Promise.resolve());
    const recorded = async (u: number) => {
      const x = await store.loadStage<{ version?: unknown }>(u, SCHEDULE_STAGE);
      return typeof x?.version === 'number' ? x.version : undefined;
    };
    const stored = async (u: number) => (await Promise.all(gens.map((c) => keptFields(c, u)))).every((f) => f !== undefined);
    if (!(await stored(iteration))) await record(iteration);
    await (await produce(iteration, false)).rest;
    const decided = await decidedAhead(asynchrony, iteration, s.rl.iterations, recorded);
    let last = iteration;
    if (asynchrony.mode === 'staleness') {
      for (let u = iteration + 1; u <= iteration + asynchrony.eta; u++) if ((await recorded(u)) !== undefined) last = u;
      // The first admitted iteration is decided now, whatever the timing: free-running at η = 1 is one-step-off.
      const next = decided.length ? undefined : admitted(iteration, last, asynchrony.eta, s.rl.iterations);
      if (next !== undefined) {
        await record(next);
        decided.push((last = next));
      }
    }
    for (const u of decided) {
      const { rest } = await produce(u, true);
      // Awaited at the end of the iteration; a failure before then must not go unhandled.
      rest.catch(() => {});
      ahead.push(rest);
    }
    // Free-running: while the iteration trains, the next admitted iterations, one after the other,
    // on views that hold this version (a generation on the model's own layout would see the update).
    if (asynchrony.mode === 'staleness' && gens.every((c) => viewOf(r, c.name).isView)) {
      const eta = asynchrony.eta;
      const more = Promise.all(ahead).then(async () => {
        // Each next generation starts once the last is done; their scoring goes on beside them.
        const scored: Array<Promise<void>> = [];
        for (let u = admitted(iteration, last, eta, s.rl.iterations); u !== undefined && !trained; u = admitted(iteration, last, eta, s.rl.iterations)) {
          await record(u);
          last = u;
          const { rest } = await produce(u, false);
          rest.catch(() => {});
          scored.push(rest);
        }
        await Promise.all(scored);
      });
      more.catch(() => {});
      ahead.push(more);
    }
  }
  // The policy version each generation of this iteration came from; in flight, each token's, and the generation's switches.
  const versions = new Map<string, number>();
  const inflightOf = new Map<string, { tokens: Int32Array; switches: SwitchDecision[] }>();
  /** The version that generated the rollout a train call reads (this iteration's, when no generation writes it). */
  const versionOf = (c: CallDecl) => {
    const gen = r.graph.calls.find((g) => g.fn === 'generate' && Object.values(g.writes).includes(c.reads.tokens!));
    return (gen && versions.get(gen.name)) ?? iteration;
  };
  const graph = runGraph(r.graph, sourceOf(r, iteration), async (node, inputs) => {
    if (node.kind === 'step') return node.step.run(inputs, { prompts: s.rl.batch, group: r.graph.group, promptLen: task.promptLen, responseLen: task.responseLen });
    const c = node.call;
    const stage = stageOf(c.name);
    if (c.fn !== 'train') {
      const kept = await store.loadStage<{
        ports: Fields;
        sources?: Record<string, number>;
        generated?: number;
        played?: PlayedEpisodes;
        version?: number;
        tokenVersions?: Int32Array;
        switches?: SwitchDecision[];
      }>(iteration, stage);
      if (kept && keptProblem(c, kept) === undefined) {
        if (c.fn === 'generate') versions.set(c.name, kept.version ?? iteration);
        if (c.fn === 'generate' && kept.tokenVersions instanceof Int32Array) inflightOf.set(c.name, { tokens: kept.tokenVersions, switches: kept.switches ?? [] });
        if (kept.sources) callSources.set(c.name, kept.sources);
        // Episodes are read back from their record, never played again.
        if (kept.played && kept.ports.tokens instanceof Int32Array) book.note(kept.ports.tokens, kept.played);
        generated += kept.generated ?? 0;
        return rename(c, kept.ports);
      }
    }
    const before = generated;
    const ports = await runCall(c, inputs);
    if (c.fn === 'generate') versions.set(c.name, iteration);
    if (c.fn !== 'train') {
      const own = callSources.get(c.name);
      // A generation's episodes are stored with it: a replay reads them back (above).
      const played = ports.tokens instanceof Int32Array ? book.of(ports.tokens) : undefined;
      await store.saveStage(iteration, stage, { ports: keptPorts(c, ports), ...(own ? { sources: own } : {}), generated: generated - before, ...(played ? { played } : {}) });
    }
    return rename(c, ports);
  });
  let fields: Fields;
  try {
    fields = await graph;
  } finally {
    trained = true;
  }
  // The weights of the next version exist now: under asynchrony they move to the generations'
  // views at once, into a second copy beside the generation still running on this version's
  // (engine/asynchrony/next-views.ts), and the next iteration takes them over. The move ends
  // before this iteration does, so a snapshot or a recovery never finds it half done.
  const next: Array<Promise<HeldView>> = [];
  if (asynchrony && views && generatesWith(asynchrony, iteration + 1, s.rl.iterations)) {
    for (const c of gens.filter((g) => viewOf(r, g.name).isView)) {
      next.push(views.prepare(c.name, iteration + 1, epoch, r, () => holdView(d, r, c.name, iteration, { copy: copyOf(iteration + 1), beside: true })));
    }
  }
  // In flight (rl.inflight): the generation still running on this version's view goes on with the
  // next version as soon as its copy is filled (engine/asynchrony/handover.ts), from a pass decided
  // by its devices and written ahead; a replay tells its devices the recorded passes.
  const handNext = async (c: CallDecl, to: HeldView): Promise<void> => {
    const base = { devices: layoutOf(r, c.name).devices, to: { model: to.name, version: iteration + 1 } };
    const call = (device: number, model: string, body: Parameters<Parameters<typeof handOver>[0]['call']>[2]) => d.call(device, model, iteration, body, undefined, { beside: true });
    if (asynchrony?.mode === 'replay') {
      const from = (await held.get(c.name))?.name;
      for (const [u, byCall] of Object.entries(s.rl.switches ?? {})) {
        for (const planned of byCall[c.name] ?? []) {
          if (planned.version === iteration + 1 && from !== undefined) await handOver({ ...base, generation: { iteration: Number(u), model: from }, call, record: async () => {}, planned });
        }
      }
      return;
    }
    const g = running.get(c.name)?.[0];
    if (!g) return;
    await handOver({ ...base, generation: { iteration: g.u, model: g.view.name }, call, record: (decision) => store.saveStage(g.u, switchesStage(stageOf(c.name)), decision) });
  };
  const handed = s.rl.inflight ? gens.filter((g) => viewOf(r, g.name).isView).map((c, i) => next[i]?.then((view) => handNext(c, view))) : [];
  // What was generated ahead is stored before the iteration ends (its snapshot covers it).
  await Promise.all([...ahead, ...handed]);
  for (const view of await Promise.all(next)) if (view.moved) moved.push(view.moved);
  await Promise.all([...held.values()].map((h) => h.then((v) => v.release())));
  const rewardCall = r.graph.calls.find((c) => c.fn === 'inference' && c.writes.scores === r.graph.reward);
  const rollout = rolloutField(r);
  const tokens = rollout ? fields[rollout] : undefined;
  const episodes = tokens instanceof Int32Array ? book.metrics(tokens) : undefined;
  const rolloutCall = r.graph.calls.find((c) => c.fn === 'generate' && c.writes.tokens === rollout);
  const version = rolloutCall ? versions.get(rolloutCall.name) : undefined;
  const flight = rolloutCall ? inflightOf.get(rolloutCall.name) : undefined;
  const staleTokens = flight && tokens instanceof Int32Array ? tokenStaleness(flight.tokens, maskOf(tokens), iteration) : undefined;
  const switches = [...inflightOf].filter(([, f]) => f.switches.length > 0).map(([call, f]) => [call, f.switches] as const);
  return {
    fields,
    moved,
    sources: (rewardCall && callSources.get(rewardCall.name)) ?? {},
    generated,
    ...(asynchrony && version !== undefined ? { version } : {}),
    ...(staleTokens ? { tokenStaleness: staleTokens } : {}),
    ...(switches.length ? { switches: Object.fromEntries(switches) } : {}),
    ...(episodes && tokens instanceof Int32Array ? { episodes: { ...episodes, sample: book.records(tokens)!.slice(0, 4) } } : {}),
  };
}

/**
 * Why a stage record read back from the store cannot stand for the call's output, or undefined:
 * every port the call writes must be there as numbers (a typed array), sources as numbers. A
 * record that fails is computed again (the store has checked its bytes, schema and place).
 */
export function keptProblem(c: CallDecl, kept: unknown): string | undefined {
  const k = kept as { ports?: unknown; sources?: unknown; generated?: unknown; played?: unknown };
  if (typeof k !== 'object' || k === null || typeof k.ports !== 'object' || k.ports === null) return 'no ports';
  for (const port of Object.keys(c.writes)) {
    const v = (k.ports as Record<string, unknown>)[port];
    if (!(v instanceof Int32Array || v instanceof Float32Array || v instanceof Uint32Array)) return `port ${port} is not an array of numbers`;
  }
  if (k.sources !== undefined && (typeof k.sources !== 'object' || k.sources === null || Object.values(k.sources).some((x) => typeof x !== 'number'))) return 'sources are not numbers';
  if (k.generated !== undefined && typeof k.generated !== 'number') return 'generated is not a number';
  if (k.played !== undefined) {
    const p = k.played as { mask?: unknown; episodes?: unknown };
    if (typeof p !== 'object' || p === null || !(p.mask instanceof Float32Array) || !Array.isArray(p.episodes)) return 'played episodes are not a mask and records';
  }
  return undefined;
}

/** The ports a call writes, of those it gave back. */
const keptPorts = (c: CallDecl, ports: Fields): Fields => Object.fromEntries(Object.keys(c.writes).map((p) => [p, ports[p]!]));

/** A call's ports as the batch fields they are bound to. */
const rename = (c: CallDecl, ports: Fields): Fields => Object.fromEntries(Object.entries(c.writes).map(([p, f]) => [f, ports[p]!]));

/** The field of generated sequences the task's rule judges (the first generation's), if any. */
export function rolloutField(r: RunSpec): string | undefined {
  const gen = r.graph.calls.find((c) => c.fn === 'generate' && !c.greedy) ?? r.graph.calls.find((c) => c.fn === 'generate');
  return gen?.writes.tokens;
}

/**
 * Per trained model, the sequences each iteration's train call took in, as the shards' ledgers
 * record them (rows and SHA-256), from the store (generated) or the source (pairs, prompts).
 */
export async function trainedRollouts(
  r: RunSpec,
  store: Pick<RunStore, 'loadStage'>,
  iterations: number,
): Promise<Record<string, Array<{ iteration: number; rows: number; sha256: string; version?: number }>>> {
  const out: Record<string, Array<{ iteration: number; rows: number; sha256: string; version?: number }>> = {};
  const width = r.task.promptLen + r.task.responseLen;
  const asynchronous = asynchronyOf(r.scenario.rl) !== undefined;
  for (const c of r.graph.calls.filter((x) => x.fn === 'train')) {
    const field = c.reads.tokens!;
    const writer = r.graph.calls.find((x) => Object.values(x.writes).includes(field));
    const list = [];
    for (let i = 0; i < iterations; i++) {
      let tokens: Int32Array | undefined;
      // Under asynchrony, the version that generated it (the train call tells the shard's ledger).
      let version = i;
      if (!writer) tokens = sourceOf(r, i)[field] as Int32Array | undefined;
      else {
        const kept = await store.loadStage<{ ports: Fields; version?: number }>(i, stageOf(writer.name));
        const port = Object.entries(writer.writes).find(([, f]) => f === field)?.[0];
        tokens = port && kept && keptProblem(writer, kept) === undefined ? (kept.ports[port] as Int32Array) : undefined;
        if (writer.fn === 'generate' && typeof kept?.version === 'number') version = kept.version;
      }
      const v = asynchronous ? { version } : {};
      list.push(tokens ? { iteration: i, rows: tokens.length / width, sha256: tokensDigest(tokens), ...v } : { iteration: i, rows: rowsOf(r.scenario), sha256: 'missing from the run store', ...v });
    }
    out[c.model] = list;
  }
  return out;
}

/** SHA-256 of each trained model's parameters, and every rank's ledger, from the devices that own them. */
export async function finalDigests(d: Dispatcher, r: RunSpec, iteration: number): Promise<{ digests: Record<string, string>; ledgers: Record<string, LedgerEntry[][]> }> {
  const trained = r.graph.models.filter((m) => m.trained).map((m) => m.name);
  const outs = await Promise.all(trained.map((model) => Promise.all(layoutOf(r, ownerOf(r, model)).devices.map((device) => d.call(device, model, iteration, { fn: 'manifest' })))));
  return {
    digests: Object.fromEntries(trained.map((model, i) => [model, meshDigest(outs[i]!.map((o) => o.digest))])),
    ledgers: Object.fromEntries(trained.map((model, i) => [model, outs[i]!.map((o) => o.ledger)])),
  };
}

/** Every device the plan uses, ascending. */
export function planDevices(r: RunSpec): number[] {
  return [...new Set(Object.values(r.plan).flatMap((p) => p.devices))].sort((a, b) => a - b);
}
