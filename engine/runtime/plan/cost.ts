// The cost model: for one model function call on one layout, its time on a device profile and the
// memory it needs per device. All times are seconds, all sizes bytes, all rates per second.
//
// Compute is FLOPs over sustained FLOP/s; decoding is bound by reading the weights and the KV
// cache once per token; tensor-parallel all-reduces and data-parallel gradient all-reduces follow
// an α–β ring model over the link they cross (inside a node or between nodes); pipelines add a
// bubble of (pp − 1) / micro-batches (a step's rows go through whole, as the runtime sends them:
// one micro-batch, unless memory needs more); each layer pass pays a fixed overhead. Reallocation time
// comes from the runtime's own transfer planner (mesh/realloc.ts).
import type { Layout, ModelInfo, ParamInfo, Piece } from '../../../mesh/parallel/index.ts';
import { planRealloc, sliceElements } from '../../../mesh/parallel/index.ts';
import { KV_GROWTH, kvCacheBytes } from '../../model/index.ts';
import type { DeviceProfile, ModelShape } from './catalog.ts';

export type CallKind = 'generate' | 'inference' | 'train';

export interface Workload {
  /** Prompts per iteration. */
  batch: number;
  promptLen: number;
  /** The response budget: the most tokens a response may have. */
  responseLen: number;
  /**
   * The mean response length, where responses end before the budget (a long tail): lengths are
   * priced as an exponential of that mean cut at the budget (see decodeSteps). Absent: every
   * response runs to the budget.
   */
  responseMean?: number;
  epochs: number;
  minibatches: number;
  /**
   * Continuous generation (rl.slots): a replica keeps this many rows decoding (at most as many as
   * its KV cache holds), a row that ends giving its slot to the next at once (see continuousSteps);
   * on a generation of one stage, where responses end before the budget. Absent: decoding by waves.
   */
  slots?: number;
  /** Generation as episodes of several turns against an environment on the bus (see episodeGeneration). */
  episodes?: EpisodesWorkload;
  /**
   * In-flight weight updates (rl.inflight): what a generation does with the keys and values the
   * old version wrote when it switches (rl.inflight_kv); see SWITCH_CROSSINGS. Absent: no switches.
   */
  inflight?: 'keep' | 'recompute';
}

/**
 * Crossings of the bus a switch of version waits on (engine/asynchrony/handover.ts): the replica's
 * word that it stopped before a pass, the decision's write to the run's store and its
 * acknowledgement, and the word to go on.
 */
export const SWITCH_CROSSINGS = 4;

/** A generation's episodes, as the scenario's `environment:` bounds them. */
export interface EpisodesWorkload {
  /** Episodes decoded as one batch (environment.group_size). */
  groupSize: number;
  /** Actions per episode, at most (environment.max_turns), and tokens per action, at most. */
  maxTurns: number;
  turnTokens: number;
  /**
   * What one answer takes the environment itself, beyond the bus's round trip (the profile's
   * envAnswerSeconds); 0 where it answers at once.
   */
  answerSeconds?: number;
}

/**
 * The scale m of an exponential whose lengths, cut at `budget`, have mean `mean`:
 * m·(1 − e^(−budget/m)) = mean (bisection; the mean must be below the budget).
 */
export function tailScale(mean: number, budget: number): number {
  let [lo, hi] = [mean, mean * 64];
  const meanOf = (m: number) => m * (1 - Math.exp(-budget / m));
  if (meanOf(hi) < mean) return hi;
  for (let i = 0; i < 60; i++) {
    const mid = (lo + hi) / 2;
    if (meanOf(mid) < mean) lo = mid;
    else hi = mid;
  }
  return (lo + hi) / 2;
}

/**
 * How a wave of `rows` sequences decodes in the runtime (engine/model/rank.ts): one step per
 * position until its longest response ends, on the rows its KV cache holds, which halve each time
 * half of them have ended (a row's length ~ an exponential of scale m cut at the budget: after s
 * steps a share e^(−s/m) is still going, so the k-th halving comes at s = k·m·ln 2). Returns the
 * steps at each number of rows held, {rows, steps}, from the whole wave down; the steps sum to
 * the expected longest response of the wave. Without a mean, every step holds every row.
 */
export function decodeSteps(rows: number, budget: number, mean?: number): Array<{ rows: number; steps: number }> {
  if (mean === undefined || mean >= budget) return [{ rows, steps: budget }];
  const m = tailScale(mean, budget);
  // The expected longest of `rows` lengths: Σ over positions of P(some row is still going).
  let longest = 0;
  for (let s = 0; s < budget; s++) longest += 1 - (1 - Math.exp(-s / m)) ** rows;
  const out: Array<{ rows: number; steps: number }> = [];
  const per = m * Math.LN2;
  for (let k = 0, from = 0; from < longest; k++) {
    const to = Math.min(longest, (k + 1) * per);
    out.push({ rows: Math.max(1, Math.ceil(rows / 2 ** k)), steps: to - from });
    from = to;
  }
  return out;
}

/**
 * How `rows` sequences decode continuously through `slots` slots (engine/generation/continuous.ts):
 * while rows wait, every step holds every slot, and a row that ends gives its slot to the next at
 * once; those steps are the waiting rows' tokens over the slots, (rows − slots)·mean / slots, and
 * a step ends a row in a slot with probability about 1/m (lengths ~ an exponential of scale m),
 * so that many steps prefill one or more new rows. Then the last `slots` rows decode as a wave
 * does (decodeSteps: an exponential has no memory, so rows part-way through are as fresh ones).
 * Undefined where it is a wave's decoding: no rows wait, or every response runs to the budget.
 */
export function continuousSteps(rows: number, slots: number, budget: number, mean?: number): { full: number; refills: number; tail: Array<{ rows: number; steps: number }> } | undefined {
  if (mean === undefined || mean >= budget || rows <= slots) return undefined;
  const full = ((rows - slots) * mean) / slots;
  const m = tailScale(mean, budget);
  return { full, refills: full * (1 - (1 - 1 / m) ** slots), tail: decodeSteps(slots, budget, mean) };
}

/**
 * A generation's episodes as the runtime plays them (engine/episodes/play.ts), on one replica's
 * `rows`: groups of `groupSize` episodes, each its own batch, move in rounds — the group's pass over
 * its prompts or latest observations, then one pass per further token of its actions — and between
 * rounds wait for the environment's answers (a reset before the first round, a step after each),
 * while the device decodes the other groups' rounds. Every round of a group passes all of its rows
 * (those that ended too), and a group goes on until its last episode ends: priced at the turn
 * budget, as decoding is priced at the response budget. An answer takes the bus's round trip
 * (envAnswerSeconds) and the environment's own time.
 *
 * The device works G·W (W: a group's rounds); the call lasts at least that plus the first resets'
 * and the last steps' answers, and at least one group's chain — its resets, every round and every
 * answer — with the other groups' rounds queued before its own (a round's work each): what the
 * call takes beyond the device's work is `waiting`.
 */
export function episodeGeneration(
  rows: number,
  wl: Pick<Workload, 'promptLen' | 'responseLen'>,
  e: EpisodesWorkload,
  dev: DeviceProfile,
  stepOn: (held: number) => { compute: number; comm: number },
): { compute: number; comm: number; waiting: number; rounds: number; groups: number } {
  const group = Math.max(1, Math.min(rows, e.groupSize));
  const groups = Math.ceil(rows / group);
  // Every action takes a token at least: no more rounds than the response has room for.
  const rounds = Math.max(1, Math.min(e.maxTurns, Math.floor(wl.responseLen / Math.max(1, Math.min(e.turnTokens, wl.responseLen)))));
  const passes = rounds * Math.min(e.turnTokens, wl.responseLen);
  const step = stepOn(group);
  const perGroup = passes * (step.compute + step.comm);
  const answer = (dev.envAnswerSeconds ?? 2 * dev.latency) + (e.answerSeconds ?? 0);
  const work = groups * perGroup;
  const chain = (rounds + 1) * answer + perGroup + ((groups - 1) * perGroup) / rounds;
  const span = Math.max(work + 2 * answer, chain);
  return { compute: groups * passes * step.compute, comm: groups * passes * step.comm, waiting: span - work, rounds, groups };
}

export interface CallCost {
  seconds: number;
  compute: number;
  communication: number;
  bubble: number;
  /** Seconds the call's devices wait on an environment's answers beyond the work they have meanwhile. */
  environment: number;
  /**
   * Of `communication`, the bus's latency (the α terms): what the ranks wait; the rest, the bytes
   * over the link's rate, they spend encoding, copying and decoding.
   */
  latency: number;
  /** Memory per device while the call runs, beyond the weights of other models resident there. */
  transientBytes: number;
  /** Weights (and, for a trained model's own layout, gradients and optimizer state) per device. */
  residentBytes: number;
  /** A generation's rows decoded at once per replica, as many as its KV cache holds: its slots when it generates continuously. */
  slots?: number;
  /** In flight: the pause of a generation's switch of version, in `seconds` (see SWITCH_CROSSINGS). */
  switchSeconds?: number;
}

/**
 * The share of a model's parameters that train with LoRA adapters of `rank` on the named modules
 * (the family's Hugging Face names, engine/adapters; a shape with a gated MLP is llama's), and a
 * head trained whole where `head` says (a value model's, or lm_head saved).
 */
export function loraShare(m: ModelShape, lora: { rank: number; targets: readonly string[] }, head: boolean, valueHead = false): number {
  const D = m.width;
  const kv = (D * m.kvHeads) / m.heads;
  const r = lora.rank;
  const t = new Set(lora.targets);
  const pair = (i: number, o: number) => r * (i + o);
  const perLayer = m.gated
    ? (t.has('q_proj') ? pair(D, D) : 0) +
      (t.has('k_proj') ? pair(D, kv) : 0) +
      (t.has('v_proj') ? pair(D, kv) : 0) +
      (t.has('o_proj') ? pair(D, D) : 0) +
      (t.has('gate_proj') ? pair(D, m.ffn) : 0) +
      (t.has('up_proj') ? pair(D, m.ffn) : 0) +
      (t.has('down_proj') ? pair(m.ffn, D) : 0)
    : (t.has('c_attn') ? r * D + r * (D + 2 * kv) : 0) + (t.has('c_proj') ? pair(D, D) + pair(m.ffn, D) : 0) + (t.has('c_fc') ? pair(D, m.ffn) : 0);
  const counts = parameterCounts(m, valueHead);
  const adapters = perLayer * m.layers;
  return (adapters + (head ? counts.head : 0)) / (counts.total + adapters);
}

/** Parameters of one layer, of the embedding and of the head. */
export function parameterCounts(m: ModelShape, valueHead = false) {
  const kv = (m.width * m.kvHeads) / m.heads;
  const attn = m.width * m.width * 2 + m.width * kv * 2;
  const mlp = m.width * m.ffn * (m.gated ? 3 : 2);
  const layer = attn + mlp + 2 * m.width;
  const embed = m.vocab * m.width;
  const head = m.width * (valueHead ? 1 : m.vocab) + m.width;
  return { layer, embed, head, total: layer * m.layers + embed + head };
}

const infos = new Map<string, ModelInfo>();

/** The model as the layout and reallocation code sees it (Megatron splits, like engine/params.ts). */
export function shapeInfo(m: ModelShape, valueHead = false): ModelInfo {
  const key = `${JSON.stringify(m)}|${valueHead}`;
  let info = infos.get(key);
  if (!info) infos.set(key, (info = buildShapeInfo(m, valueHead)));
  return info;
}

function buildShapeInfo(m: ModelShape, valueHead: boolean): ModelInfo {
  const D = m.width;
  const kv = (D * m.kvHeads) / m.heads;
  const params: ParamInfo[] = [{ name: 'embed', shape: [m.vocab, D], layer: 'embed', splitAxis: null }];
  for (let l = 0; l < m.layers; l++) {
    const p = (name: string, shape: number[], splitAxis: number | null) => params.push({ name: `h${l}.${name}`, shape, layer: l, splitAxis });
    p('norm1', [D], null);
    p('wq', [D, D], 1);
    p('wk', [D, kv], 1);
    p('wv', [D, kv], 1);
    p('wo', [D, D], 0);
    p('norm2', [D], null);
    p('w1', [D, m.ffn], 1);
    if (m.gated) p('w3', [D, m.ffn], 1);
    p('w2', [m.ffn, D], 0);
  }
  params.push({ name: 'norm', shape: [D], layer: 'head', splitAxis: null });
  params.push({ name: 'head', shape: [D, valueHead ? 1 : m.vocab], layer: 'head', splitAxis: null });
  return { layers: m.layers, params };
}

/** Why a strategy cannot run a model at all (independent of memory), or undefined. */
export function strategyProblem(m: ModelShape, s: { dp: number; tp: number; pp: number }): string | undefined {
  if (m.heads % s.tp !== 0 || m.kvHeads % s.tp !== 0) return `tp=${s.tp} does not divide ${m.heads} heads (${m.kvHeads} key/value heads)`;
  if (s.pp > m.layers) return `pp=${s.pp} exceeds ${m.layers} layers`;
  return undefined;
}

function sameNode(devices: readonly number[], perNode: number): boolean {
  return Math.floor(devices[0]! / perNode) === Math.floor(devices.at(-1)! / perNode);
}

/** Ring all-reduce of `bytes` over `n` ranks on links of `bw`: 2(n−1)/n·bytes/bw + 2(n−1)·α. */
export function allReduceSeconds(bytes: number, n: number, bw: number, latency: number): number {
  if (n <= 1) return 0;
  return ((2 * (n - 1)) / n) * (bytes / bw) + 2 * (n - 1) * latency;
}

/** Devices of one tensor group and of one data-parallel group, to tell which links they cross. */
function groups(layout: Layout) {
  const tpGroup = layout.devices.slice(0, layout.tp);
  const dpGroup = Array.from({ length: layout.dp }, (_, d) => layout.devices[d * layout.tp * layout.pp]!);
  const ppGroup = Array.from({ length: layout.pp }, (_, p) => layout.devices[p * layout.tp]!);
  return { tpGroup, dpGroup, ppGroup };
}

export function callCost(
  m: ModelShape,
  kind: CallKind,
  layout: Layout,
  wl: Workload,
  dev: DeviceProfile,
  perNode: number,
  opts: {
    valueHead?: boolean;
    owner?: boolean;
    trainable?: boolean;
    /** Device memory not taken by resident models (this one's own state included, if it owns it). */
    availableBytes?: number;
  } = {},
): CallCost {
  const { dp, tp, pp } = layout;
  const counts = parameterCounts(m, opts.valueHead);
  const bytes = m.dtypeBytes;
  const D = m.width;
  const T = wl.promptLen + wl.responseLen;
  const rows = Math.ceil(wl.batch / dp); // sequences per replica
  const stageLayers = Math.ceil(m.layers / pp);
  // The embedding and the head weigh about one layer's overhead per pass: on a pipeline the first
  // stage has the one and the last the other, so a stage carries its share, and a pass through
  // every stage in turn one in all.
  const stageUnits = stageLayers + 1 / pp;
  const bodyFlopsPerToken = 2 * counts.layer * m.layers;
  const headFlopsPerToken = 2 * (counts.embed + counts.head);
  const { tpGroup, dpGroup, ppGroup } = groups(layout);
  const tpBw = sameNode(tpGroup, perNode) ? dev.intraBandwidth : dev.interBandwidth;
  const dpBw = sameNode(dpGroup, perNode) ? dev.intraBandwidth : dev.interBandwidth;
  const ppBw = sameNode(ppGroup, perNode) ? dev.intraBandwidth : dev.interBandwidth;
  const weightsPerDevice = (counts.total / (tp * pp)) * bytes;
  // Gradients and Adam's moments, of what trains (with adapters, a share of the parameters).
  const trainState = opts.owner && opts.trainable ? (counts.total / (tp * pp)) * (bytes + (bytes === 2 ? 12 : 8)) * (m.trainedShare ?? 1) : 0;
  // What is left of a device for activations and the KV cache (and a view's weights), with 10%
  // kept free.
  const available = opts.availableBytes ?? dev.memoryBytes - (opts.owner ? weightsPerDevice + trainState : 0);
  const free = Math.max(0, available - dev.memoryBytes * 0.1 - (opts.owner ? 0 : weightsPerDevice));

  /** One forward pass of `seqs` sequences of `len` tokens on one replica; with `backward`, ×3. */
  const pass = (seqs: number, len: number, backward: boolean, microbatches: number) => {
    // A backward pass is two products per forward one (the inputs' gradient and the weights');
    // with adapters the frozen matrices' own gradients are skipped, one product instead of two.
    const fullMult = dev.trainFactor ?? 3;
    const mult = backward ? (m.trainedShare !== undefined && m.trainedShare < 1 ? 1 + (fullMult - 1) / 2 : fullMult) : 1;
    const layerPass = backward ? (dev.trainLayerOverhead ?? dev.layerOverhead * (dev.trainPassFactor ?? 3)) : dev.layerOverhead;
    const elementMult = backward ? (dev.trainElementFactor ?? 3) : 1;
    const tokens = seqs * len;
    // Causal attention: QKᵀ and AV over half the context on average, per layer.
    const attnFlops = 2 * 2 * m.layers * seqs * ((len * len) / 2) * D;
    const flops = (tokens * (bodyFlopsPerToken + headFlopsPerToken) + attnFlops) * mult;
    const elements = (tokens * stageUnits * D) / tp;
    const compute = flops / (tp * pp) / dev.flops + stageUnits * layerPass * microbatches + elements * (dev.elementSeconds ?? 0) * elementMult;
    // Two all-reduces per layer forward (attention and MLP outputs), two more backward.
    const tpBytes = tokens * D * bytes;
    const tpComm = (m.layers / pp) * 2 * (backward ? 2 : 1) * allReduceSeconds(tpBytes / microbatches, tp, tpBw, dev.latency) * microbatches;
    const ppComm = pp > 1 ? (pp - 1) * ((tokens * D * bytes) / ppBw + dev.latency) * (backward ? 2 : 1) : 0;
    const bubble = pp > 1 ? ((compute + tpComm) * (pp - 1)) / microbatches : 0;
    return { compute, comm: tpComm + ppComm, bubble };
  };

  let compute = 0;
  let communication = 0;
  let bubble = 0;
  let environment = 0;
  let transient = 0;
  let slots: number | undefined;
  let switchSeconds: number | undefined;
  if (kind === 'inference') {
    // A forward pass keeps one layer's working set (and the head's outputs) per sequence; the
    // rows go through whole where they fit, else in micro-batches that do. (The runtime sends a
    // call's rows through a pipeline's stages whole, one stage after the other: micro-batches to
    // fill a pipeline would price each stage's fixed costs several times and a bubble it has not.)
    const perSeq = (T * D * bytes * 4) / tp + T * (opts.valueHead ? 1 : m.vocab) * bytes;
    const fitRows = Math.max(1, Math.floor(free / perSeq));
    const mb = Math.max(1, Math.ceil(rows / fitRows));
    const p = pass(rows, T, false, mb);
    compute = p.compute;
    communication = p.comm;
    bubble = p.bubble;
    transient = perSeq * Math.ceil(rows / mb);
  } else if (kind === 'train') {
    const steps = wl.epochs * wl.minibatches;
    const stepRows = Math.max(1, Math.ceil(rows / wl.minibatches));
    // Megatron's activation estimate: about 34·s·h bytes per sequence per layer (bf16), split by
    // tp. Each optimizer step's rows go through the pipeline whole, as the runtime sends them,
    // where they fit; else in micro-batches small enough that the ones in flight (up to pp, as in
    // 1F1B) fit.
    const perSeq = (stageLayers * T * D * 34 * (bytes / 2)) / tp;
    const fitRows = Math.max(1, Math.floor(free / (perSeq * pp)));
    const mb = Math.max(1, Math.ceil(stepRows / fitRows));
    const p = pass(stepRows, T, true, mb);
    const gradBytes = (counts.total / (tp * pp)) * bytes;
    compute = p.compute * steps;
    communication = (p.comm + allReduceSeconds(gradBytes, dp, dpBw, dev.latency)) * steps;
    bubble = p.bubble * steps;
    transient = perSeq * Math.ceil(stepRows / mb) * Math.min(pp, mb);
  } else {
    // Prefill the prompts, then one token at a time: each step reads the stage's weights and KV
    // cache from memory, or computes, whichever is slower; a token crosses every stage in turn.
    // Sequences decode in waves of as many as the KV cache can hold, each wave reading the
    // weights once per token. The cache is the runtime's (engine/model/kv-cache.ts, the same
    // function): sized for prompt + budget, and attended over the positions written so far
    // (rounded up to KV_GROWTH), so a step late in a long response reads more than an early one.
    const kvPerToken = kvCacheBytes(m.kvHeads / tp, D / m.heads, 1, stageLayers, bytes); // per sequence and position, per device
    const wave = Math.max(1, Math.min(rows, Math.floor(free / (T * kvPerToken + (T * D * bytes * 4) / tp))));
    const waves = Math.ceil(rows / wave);
    slots = wl.slots !== undefined ? Math.min(wave, wl.slots) : wave;
    const prefill = pass(rows, wl.promptLen, false, 1);
    if (dev.recomputeDecode) {
      // Every new token is a forward pass over the whole prefix, then one more over the result
      // for the log-probabilities.
      let total = { compute: 0, comm: 0, bubble: 0 };
      for (let t = 0; t <= wl.responseLen; t++) {
        const p = pass(rows, wl.promptLen + t, false, 1);
        total = { compute: total.compute + p.compute, comm: total.comm + p.comm, bubble: total.bubble + p.bubble };
      }
      compute = total.compute + (dev.callOverhead ?? 0);
      return {
        seconds: compute + total.comm + total.bubble,
        compute,
        communication: total.comm,
        bubble: total.bubble,
        environment: 0,
        latency: total.comm - (dev.latency > 0 ? callCost(m, kind, layout, wl, { ...dev, latency: 0 }, perNode, opts).communication : total.comm),
        transientBytes: (rows * T * D * bytes * 4) / tp + (opts.owner ? 0 : weightsPerDevice),
        residentBytes: opts.owner ? weightsPerDevice + trainState : 0,
      };
    }
    // A step on a number of rows attends `width` positions of their caches (the whole capacity
    // unless said); it reads the weights whatever the rows, so a long tail of few rows is bound by
    // that read.
    const stepOn = (held: number, width = T) => {
      const reads = weightsPerDevice + held * width * kvPerToken;
      const flops = (held * (bodyFlopsPerToken + headFlopsPerToken + 4 * m.layers * width * D)) / (tp * pp);
      const elements = (held * stageUnits * D) / tp;
      const stage = Math.max(reads / dev.memBandwidth, flops / dev.flops) + stageUnits * (dev.decodeLayerOverhead ?? dev.layerOverhead) + elements * (dev.elementSeconds ?? 0);
      // A token crosses every stage in turn, so it pays every layer's all-reduces.
      const comm = m.layers * 2 * allReduceSeconds(held * D * bytes, tp, tpBw, dev.latency) + (pp > 1 ? (pp - 1) * ((held * D * bytes) / ppBw + dev.latency) : 0);
      return { compute: stage * pp + (dev.decodeStepOverhead ?? 0), comm };
    };
    if (wl.episodes) {
      const e = episodeGeneration(rows, wl, wl.episodes, dev, stepOn);
      // Then the log-probabilities of the whole sequences, as training will compute them: a
      // forward pass over every row (engine/device/episodes.ts).
      const logprobs = pass(rows, T, false, 1);
      compute = e.compute + logprobs.compute;
      communication = e.comm + logprobs.comm;
      bubble = logprobs.bubble;
      environment = e.waiting;
      // Every group holds a cache of its own, of twice the sequence's positions, for the whole
      // call; one group's pass at a time.
      const group = Math.min(rows, wl.episodes.groupSize);
      transient = rows * 2 * T * kvPerToken + (group * T * D * bytes * 4) / tp;
    } else {
      let decode = 0;
      let decodeComm = 0;
      let at = 0;
      // Continuously, on one stage: the slots are the wave, kept full while rows wait; then the
      // last wave's worth decodes as a wave does. Each step that refills prefills its new rows in
      // a pass of their own (one more pass's fixed costs; their tokens are in `prefill`).
      const held = Math.min(wave, wl.slots ?? wave);
      const flow = wl.slots !== undefined && pp === 1 ? continuousSteps(rows, held, wl.responseLen, wl.responseMean) : undefined;
      if (flow) {
        // A slot's row is, at a random step, about a scale's worth of tokens in (no memory).
        const step = stepOn(held, Math.min(T, wl.promptLen + tailScale(wl.responseMean!, wl.responseLen) + KV_GROWTH / 2));
        decode += step.compute * flow.full + flow.refills * (stageUnits * dev.layerOverhead + (dev.decodeStepOverhead ?? 0));
        decodeComm += step.comm * flow.full;
      }
      for (const { rows: n, steps } of flow ? flow.tail : decodeSteps(wave, wl.responseLen, wl.responseMean)) {
        // The positions these steps attend, on average: the middle one's, rounded up as the cache grows.
        const step = stepOn(n, Math.min(T, wl.promptLen + at + steps / 2 + KV_GROWTH / 2));
        decode += step.compute * steps * (flow ? 1 : waves);
        decodeComm += step.comm * steps * (flow ? 1 : waves);
        at += steps;
      }
      compute = prefill.compute + decode;
      communication = prefill.comm + decodeComm;
      bubble = prefill.bubble;
      transient = wave * T * kvPerToken + (wave * T * D * bytes * 4) / tp;
      if (wl.inflight) {
        // One switch a generation, the most the runtime makes (the next version is the only one
        // made while it runs): its crossings of the bus, and under recompute a pass of every held
        // row's sequence so far with the new version, each row about a scale's worth of tokens in.
        const position = wl.responseMean !== undefined && wl.responseMean < wl.responseLen ? tailScale(wl.responseMean, wl.responseLen) : wl.responseLen / 2;
        const redo = wl.inflight === 'recompute' ? pass(held, Math.min(T, wl.promptLen + position), false, 1) : { compute: 0, comm: 0, bubble: 0 };
        switchSeconds = SWITCH_CROSSINGS * dev.latency + redo.compute + redo.comm;
        compute += redo.compute;
        communication += SWITCH_CROSSINGS * dev.latency + redo.comm;
      }
    }
  }
  compute += dev.callOverhead ?? 0;
  // The same communication with no latency: its bytes alone (an episode's answers kept as they are).
  const bytesOnly = dev.latency > 0 ? callCost(m, kind, layout, wl, { ...dev, latency: 0, envAnswerSeconds: dev.envAnswerSeconds ?? 2 * dev.latency }, perNode, opts).communication : communication;
  return {
    seconds: compute + communication + bubble + environment,
    compute,
    communication,
    bubble,
    environment,
    latency: communication - bytesOnly,
    transientBytes: transient + (opts.owner ? 0 : weightsPerDevice),
    residentBytes: opts.owner ? weightsPerDevice + trainState : 0,
    ...(slots !== undefined ? { slots } : {}),
    ...(switchSeconds !== undefined ? { switchSeconds } : {}),
  };
}

/**
 * The same bytes as shapeInfo, grouped the way layouts cut them: per layer, one block of every
 * column-split matrix, one of every row-split matrix, one of the replicated vectors. Each rank
 * holds the same share of a group as of its members, so transfer plans move the same bytes
 * between the same devices, with a third of the pieces to plan.
 */
export function coarseInfo(m: ModelShape, valueHead = false): ModelInfo {
  const key = `coarse|${JSON.stringify(m)}|${valueHead}`;
  let info = infos.get(key);
  if (info) return info;
  const fine = shapeInfo(m, valueHead);
  const params: ParamInfo[] = [];
  for (const p of fine.params) {
    if (typeof p.layer !== 'number') {
      params.push(p);
      continue;
    }
    const group = p.splitAxis === null ? 'replicated' : p.splitAxis === 1 ? 'columns' : 'rows';
    const name = `h${p.layer}.${group}`;
    const existing = params.find((q) => q.name === name);
    const size = p.shape.reduce((a, b) => a * b, 1);
    if (!existing) {
      // columns: [D, Σcols]; rows: [Σrows, D]; replicated: [Σ]
      params.push({ name, layer: p.layer, splitAxis: p.splitAxis, shape: p.splitAxis === 1 ? [p.shape[0]!, p.shape[1]!] : p.splitAxis === 0 ? [p.shape[0]!, p.shape[1]!] : [size] });
    } else if (p.splitAxis === 1) existing.shape[1]! += p.shape[1]!;
    else if (p.splitAxis === 0) existing.shape[0]! += p.shape[0]!;
    else existing.shape[0]! += size;
  }
  info = { layers: fine.layers, params };
  infos.set(key, info);
  return info;
}

/**
 * Time to move a model's weights from one layout to another, from the runtime's transfer plan:
 * the slowest destination's receive time or the slowest source's send time, whichever is larger.
 */
export function reallocSeconds(m: ModelShape, from: Layout, to: Layout, dev: DeviceProfile, perNode: number, valueHead = false): number {
  const plan = planRealloc(coarseInfo(m, valueHead), from, to, (d) => Math.floor(d / perNode));
  return piecesSeconds(m, plan.pieces, dev, perNode);
}

/**
 * Time for a transfer plan's pieces (of model `m`, planned over its coarseInfo): the slowest
 * destination's receive time or the slowest source's send time, whichever is larger. `recv`:
 * seconds some destinations spend receiving besides (reading from a snapshot, say).
 */
export function piecesSeconds(m: ModelShape, pieces: readonly Piece[], dev: DeviceProfile, perNode: number, recvAlso: ReadonlyMap<number, number> = new Map()): number {
  const scale = m.dtypeBytes / 4; // the planner counts 4-byte elements
  const recv = new Map(recvAlso);
  const send = new Map<number, number>();
  for (const p of pieces) {
    const b = sliceElements(p) * 4 * scale;
    for (const d of p.dsts) {
      const bw = Math.floor(d / perNode) === Math.floor(p.src / perNode) ? dev.intraBandwidth : dev.interBandwidth;
      recv.set(d, (recv.get(d) ?? 0) + b / bw + dev.latency);
    }
    const bw = p.dsts.every((d) => Math.floor(d / perNode) === Math.floor(p.src / perNode)) ? dev.intraBandwidth : dev.interBandwidth;
    send.set(p.src, (send.get(p.src) ?? 0) + b / bw);
  }
  return Math.max(0, ...recv.values(), ...send.values());
}
