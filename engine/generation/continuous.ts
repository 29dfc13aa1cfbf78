// Continuous generation: a generate call's samples wait in a queue, and a replica decodes a fixed
// number of them at once, its slots. When a response ends, its slot takes the next sample at once:
// the sample's prompt is prefilled as a batch of its own and its keys and values placed into the
// slot, beside the rows that go on decoding. The device's time is then its token throughput, not
// the longest response of a batch; and each sample is done, and can be scored, the moment it ends.
//
// Exact: a sample's tokens and log-probabilities are those of the same sample generated alone,
// bit for bit, whatever shared its slots. Its randomness is its own stream (its seed); a row's
// arithmetic is the same in any batch (engine/model/batch-invariance.test.ts); its prefill is a
// generate call's prefill; its decoding attends over the cache's width, the positions it has not
// written masked, which adds exact zeros; its log-probabilities come from a forward pass over the
// whole sequence, as a generate call's do.
import { type DecodingRank, type GptRank, Rng, ShardError, logSoftmaxRows, replicaRows, sampleToken, samplingProblem, yieldToLoop, type RowDecoder, type Sampling } from '../model/index.ts';

export interface ContinuousOptions extends Sampling {
  /** The queue's prompts [N, promptLen], in the order their samples take slots. */
  prompts: Int32Array;
  /** Each sample's sampling stream. */
  seeds: Uint32Array;
  promptLen: number;
  responseLen: number;
  vocab: number;
  /** The end-of-sequence token: a response stops after it (none: every response runs to the budget). */
  eos?: number;
  /** Sequences decoded at once. */
  slots: number;
  /** Told of each sample as it ends, in the order they end: its whole row [promptLen + responseLen], its log-probabilities [responseLen] and, in flight, each token's version [responseLen]. */
  onSample?: (index: number, tokens: Int32Array, logprobs: Float32Array, versions?: Int32Array) => void;
  /** In-flight weight updates: the session may go on with a newer version between two passes. */
  inflight?: Inflight;
}

/** What a session needs to take new versions in flight (engine/generation/inflight.ts says when). */
export interface Inflight {
  /** The version the session starts with. */
  version: number;
  /** The keys and values written before a switch: kept as the old version wrote them (PipelineRL), or written again with the new one (AReaL). */
  kv: 'keep' | 'recompute';
  /**
   * Asked before each pass (`step`, from 0): the version to go on with from that pass on, and its
   * rank; undefined (or a promise of it) to go on as is. A promise holds the pass until it settles.
   */
  at(step: number): SwitchTo | undefined | Promise<SwitchTo | undefined>;
}

export interface SwitchTo {
  version: number;
  rank: () => Promise<DecodingRank>;
}

export interface ContinuousResult {
  /** [N, promptLen + responseLen]: each prompt and its response, `eos` after its end. */
  tokens: Int32Array;
  /** [N, responseLen]: each sampled token's log-probability, 0 after the end. */
  logprobs: Float32Array;
  /** Decoding passes (one position for every slot each). */
  steps: number;
  /** Prefills (samples that took slots together count once). */
  prefills: number;
  /** Slot-steps that held a sample, over all slot-steps decoded: how full the slots were. */
  occupancy: number;
  /** In flight: [N, responseLen], the version that drew each token (−1 after the end). */
  versions?: Int32Array;
  /** In flight: the passes from which the session went on with a newer version. */
  switches?: Array<{ step: number; version: number }>;
}

/** Why a continuous generation cannot run as asked, or undefined. */
export function continuousProblem(o: Pick<ContinuousOptions, 'slots' | 'promptLen' | 'responseLen' | 'prompts' | 'seeds'>): string | undefined {
  if (!Number.isInteger(o.slots) || o.slots < 1) return `slots must be a whole number of at least 1; got ${o.slots}`;
  if (o.prompts.length !== o.seeds.length * o.promptLen) return `${o.prompts.length} prompt tokens for ${o.seeds.length} seeds of prompts of ${o.promptLen}`;
  if (o.responseLen < 1) return `a response budget of at least 1 token is needed; got ${o.responseLen}`;
  return undefined;
}

/**
 * Generates every sample of the queue through decoding sessions `open` makes (GptRank.decoder):
 * the first min(slots, N) samples take the slots, and each that ends gives its slot to the next.
 * Once the queue is empty and half the slots or more are free, the session keeps the busy ones
 * only (as a generate call's cache does), so a long last response is decoded alone.
 */
export async function generateContinuous(open: (rows: number, capacity: number) => Promise<RowDecoder>, o: ContinuousOptions): Promise<ContinuousResult> {
  const bad = continuousProblem(o) ?? samplingProblem(o);
  if (bad) throw new ShardError(bad);
  const { promptLen: P, responseLen: R, vocab: V, eos } = o;
  const width = P + R;
  const N = o.seeds.length;
  const tokens = new Int32Array(N * width).fill(eos ?? 0);
  for (let i = 0; i < N; i++) tokens.set(o.prompts.subarray(i * P, (i + 1) * P), i * width);
  const logprobs = new Float32Array(N * R);
  const inflight = o.inflight;
  // In flight, a row's tokens may come from several versions: each token's log-probability is read
  // off the logits it was drawn from (the behaviour policy's, token by token), with its version.
  const versions = inflight ? new Int32Array(N * R).fill(-1) : undefined;
  let version = inflight?.version ?? 0;
  const result: ContinuousResult = { tokens, logprobs, steps: 0, prefills: 0, occupancy: 0, ...(inflight ? { versions, switches: [] } : {}) };
  if (N === 0) return result;
  const dec = await open(Math.min(o.slots, N), width);
  // Per row of the session: its sample (−1: free), its length so far (its next position), and the logits that draw its next token.
  let sample = new Int32Array(dec.rows).fill(-1);
  let len = new Int32Array(dec.rows);
  let logits: Array<Float32Array | undefined> = new Array(dec.rows);
  // In flight: each row's log-softmax of those logits, and the version that made them.
  let lsm: Array<Float32Array | undefined> = new Array(dec.rows);
  let made = new Int32Array(dec.rows);
  const rngs = new Map<number, Rng>();
  let next = 0;
  let live = 0;
  let busy = 0;
  try {
    for (;;) {
      // Free rows take the next samples: their prompts prefilled together, as a batch of their own.
      const free = Array.from(sample.keys()).filter((r) => sample[r] === -1);
      if (free.length && next < N) {
        const into = Int32Array.from(free.slice(0, N - next));
        const first = await dec.prefill(into, o.prompts.subarray(next * P, (next + into.length) * P), P);
        const firstLsm = inflight ? logSoftmaxRows(first, into.length, V) : undefined;
        result.prefills += 1;
        into.forEach((r, j) => {
          sample[r] = next + j;
          len[r] = P;
          logits[r] = first.subarray(j * V, (j + 1) * V);
          lsm[r] = firstLsm?.subarray(j * V, (j + 1) * V);
          made[r] = version;
          rngs.set(next + j, new Rng(o.seeds[next + j]!));
        });
        next += into.length;
        live += into.length;
      }
      if (live === 0) break;
      // Every busy row draws its next token.
      const ended: number[] = [];
      for (let r = 0; r < sample.length; r++) {
        const i = sample[r]!;
        if (i < 0) continue;
        const tok = sampleToken(logits[r]!, o, o.greedy ? 0 : rngs.get(i)!.uniform());
        tokens[i * width + len[r]!] = tok;
        if (versions) {
          versions[i * R + len[r]! - P] = made[r]!;
          logprobs[i * R + len[r]! - P] = lsm[r]![tok]!;
        }
        len[r]! += 1;
        if (tok === eos || len[r] === width) ended.push(r);
      }
      // Those that ended: their log-probabilities in one pass (in flight, drawn with them), then their slots are free.
      if (ended.length) {
        let lp: Float32Array | undefined;
        if (!inflight) {
          const rows = new Int32Array(ended.length * width);
          ended.forEach((r, j) => rows.set(tokens.subarray(sample[r]! * width, (sample[r]! + 1) * width), j * width));
          lp = await dec.logprobs(rows, ended.length, P, eos);
        }
        ended.forEach((r, j) => {
          const i = sample[r]!;
          if (lp) logprobs.set(lp.subarray(j * R, (j + 1) * R), i * R);
          rngs.delete(i);
          sample[r] = -1;
          logits[r] = undefined;
          lsm[r] = undefined;
          o.onSample?.(i, tokens.subarray(i * width, (i + 1) * width), logprobs.subarray(i * R, (i + 1) * R), versions?.subarray(i * R, (i + 1) * R));
        });
        live -= ended.length;
      }
      if (live === 0) {
        if (next === N) break;
        continue;
      }
      // With no sample left to take them, the free rows leave once they are half the session or more.
      if (next === N && live <= dec.rows / 2) {
        const kept = Array.from(sample.keys()).filter((r) => sample[r] !== -1);
        dec.keep(kept);
        sample = Int32Array.from(kept, (r) => sample[r]!);
        len = Int32Array.from(kept, (r) => len[r]!);
        logits = kept.map((r) => logits[r]);
        lsm = kept.map((r) => lsm[r]);
        made = Int32Array.from(kept, (r) => made[r]!);
      }
      // In flight: a newer version from this pass on, where one is ready.
      const to = inflight ? await inflight.at(result.steps) : undefined;
      if (to) {
        dec.switchTo(await to.rank());
        version = to.version;
        result.switches!.push({ step: result.steps, version });
        if (inflight!.kv === 'recompute') {
          const busyRows = Array.from(sample.keys()).filter((r) => sample[r]! >= 0);
          await dec.recompute(
            Int32Array.from(busyRows),
            busyRows.map((r) => tokens.slice(sample[r]! * width, sample[r]! * width + len[r]! - 1)),
          );
        }
      }
      // One position for every row: a busy row feeds the token it drew; a free one (about to take
      // a sample, or about to leave) feeds anything at position 0, written over by its next prefill.
      const feed = new Int32Array(sample.length);
      const starts = new Int32Array(sample.length);
      for (let r = 0; r < sample.length; r++) {
        if (sample[r]! < 0) continue;
        feed[r] = tokens[sample[r]! * width + len[r]! - 1]!;
        starts[r] = len[r]! - 1;
      }
      await yieldToLoop();
      const out = await dec.pass(feed, 1, starts, new Int32Array(sample.length));
      result.steps += 1;
      busy += live;
      result.occupancy += sample.length;
      const outLsm = inflight ? logSoftmaxRows(out, sample.length, V) : undefined;
      for (let r = 0; r < sample.length; r++) {
        if (sample[r]! < 0) continue;
        logits[r] = out.subarray(r * V, (r + 1) * V);
        lsm[r] = outLsm?.subarray(r * V, (r + 1) * V);
        made[r] = version;
      }
    }
  } finally {
    dec.dispose();
  }
  result.occupancy = result.occupancy ? busy / result.occupancy : 1;
  return result;
}

/**
 * A generate call's rows on one rank of a replica on one stage, generated continuously in `slots`
 * slots: this replica's rows (as a generate call takes them), every tensor rank making the same
 * passes. Speaking ranks return their rows' tokens and log-probabilities; `onSample` (speaking
 * ranks only) hears each as it ends, by its index in the whole batch.
 */
export async function generateRows(
  rank: GptRank,
  group: string,
  body: Sampling & { prompts: Int32Array; batch: number; promptLen: number; responseLen: number; seeds: Uint32Array; eos?: number; slots: number },
  o: { memoryBytes?: number; onSample?: ContinuousOptions['onSample']; inflight?: Inflight } = {},
): Promise<ContinuousResult> {
  const [lo, hi] = replicaRows(body.batch, rank.layout.dp, rank.coords.dp);
  const { promptLen: P } = body;
  if (P + body.responseLen > rank.spec.context) throw new ShardError(`a prompt of ${P} and a response of ${body.responseLen} tokens exceed the context of ${rank.spec.context}`);
  if (body.eos !== undefined && !(Number.isInteger(body.eos) && body.eos >= 0 && body.eos < rank.spec.vocab))
    throw new ShardError(`the end-of-sequence token ${body.eos} is not a token of a vocabulary of ${rank.spec.vocab}`);
  const speaks = rank.speaks;
  const out = await generateContinuous((rows, capacity) => rank.decoder(group, rows, capacity, { memoryBytes: o.memoryBytes, tensorParallel: true, what: 'continuous generations' }), {
    ...body,
    prompts: body.prompts.subarray(lo * P, hi * P),
    seeds: body.seeds.subarray(lo, hi),
    vocab: rank.spec.vocab,
    ...(speaks && o.onSample ? { onSample: (i, t, l, v) => o.onSample!(lo + i, t, l, v) } : {}),
    // The call's own `inflight` (what it asks for) is not the gate the device opened for it.
    inflight: o.inflight,
  });
  return speaks ? out : { ...out, tokens: new Int32Array(0), logprobs: new Float32Array(0), ...(out.versions ? { versions: new Int32Array(0) } : {}) };
}
