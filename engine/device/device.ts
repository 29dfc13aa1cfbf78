// A device: what one worker process hosts. It holds the shards of the models that the plan puts
// on it and answers calls about them. The worker process's machine (worker.machine.ts) decides when
// a call may run; this module decides whether the device's contents allow it and runs it.
import type { Bus } from '../../mesh/wire/index.ts';
import { encode } from '../../mesh/wire/index.ts';
import { checkStrategy, shardSlices, sliceElements, sliceKey, sliceShape, type Slice } from '../../mesh/parallel/index.ts';
import { Go, PROTOCOL_VERSION, type LedgerEntry, type Call, type CallBody, type CallFn, type CallOf, type ErrorCode, type Layout, type ModelSpec, type ResultOf } from '../../mesh/wire/index.ts';
import { cut, pasteRange } from '../../mesh/parallel/index.ts';
import type { Subjects } from '../../mesh/wire/index.ts';
import { subscribe } from '../../mesh/wire/index.ts';
import { manifestOf, modelDigest, noTimes, offerTensors, pacer, receiveTensors, timed, type NamedTensor } from '../../mesh/wire/index.ts';
import { randomUUID } from 'node:crypto';
import { serveReward, type RewardActor } from '../../mesh/wire/index.ts';
import { EnvCallError, EnvClient } from '../../mesh/wire/index.ts';
import { CodecError, playEpisodes, turnCodec } from '../episodes/index.ts';
import { modelInfo } from '../model/index.ts';
import { tokensDigest } from './ledger.ts';
import { Comm } from '../../mesh/parallel/index.ts';
import { LossError, loadLossModule, lossOf, lossParams, lossSource, type Loss } from '../model/index.ts';
import { GptRank, heldBytes, kvCacheProblem, masked, replicaRows } from '../model/index.ts';
import { HfError, SafetensorsError, TextTokenizer, readHfWeights, responseLength } from '../model/index.ts';
import { makeTask, TASKS, type TaskName } from './task.ts';
import { VERIFIERS, verifier, type VerifierName } from './verify.ts';

export class CallRejected extends Error {
  override name = 'CallRejected';
  constructor(
    readonly code: ErrorCode,
    message: string,
  ) {
    super(message);
  }
}

/**
 * A rule reward: a model with no parameters whose inference scores whole sequences. A digit
 * task's rule knows the answer from the prompt; a verifier reads each response through the
 * tokenizer and checks it against the reference answer the call carries for its row.
 */
class RuleShard {
  private readonly score: (prompt: Int32Array, response: Int32Array, answer: string | undefined) => number;
  constructor(spec: Extract<ModelSpec, { kind: 'rule' }>) {
    const rules = [...TASKS, ...VERIFIERS];
    if ((VERIFIERS as readonly string[]).includes(spec.rule)) {
      if (spec.tokenizer === undefined) throw new CallRejected('malformed', `the '${spec.rule}' verifier reads responses as text; the rule names no tokenizer`);
      let tokenizer: TextTokenizer;
      try {
        tokenizer = TextTokenizer.load(spec.tokenizer);
      } catch (e) {
        throw new CallRejected('malformed', (e as Error).message);
      }
      const check = verifier(spec.rule as VerifierName);
      this.score = (_, response, answer) => {
        if (answer === undefined) throw new CallRejected('malformed', `the '${spec.rule}' verifier checks each response against its reference answer; the call carries none`);
        return check(tokenizer.decode(response.subarray(0, responseLength(response, tokenizer.eos)).filter((t) => t !== tokenizer.eos)), answer);
      };
    } else if ((TASKS as readonly string[]).includes(spec.rule)) {
      if (spec.digits === undefined || spec.base === undefined) throw new CallRejected('malformed', `the '${spec.rule}' rule needs the task's digits and base`);
      const task = makeTask(spec.rule as TaskName, spec.digits, spec.base);
      this.score = (prompt, response) => task.score(prompt, response);
    } else {
      throw new CallRejected('unsupported', `unknown reward rule '${spec.rule}'; expected one of ${rules.join(', ')}`);
    }
  }
  scores(tokens: Int32Array, batch: number, promptLen: number, answers?: readonly string[]): Float32Array {
    if (answers !== undefined && answers.length !== batch) throw new CallRejected('malformed', `answers: expected one per row (${batch}), got ${answers.length}`);
    const width = tokens.length / batch;
    const out = new Float32Array(batch);
    for (let b = 0; b < batch; b++) {
      const row = tokens.subarray(b * width, (b + 1) * width);
      out[b] = this.score(row.subarray(0, promptLen), row.subarray(promptLen), answers?.[b]);
    }
    return out;
  }
}

/**
 * What is wrong with a train call's loss: unknown here, from another copy of its file than the
 * one the supervisor planned with, or parameters its schema refuses. Refused with code `loss`:
 * it would fail the same way after any recovery.
 */
function lossProblem(body: CallOf<'train'>): string | undefined {
  try {
    const fn = lossOf(body.loss.name);
    const source = lossSource(fn.name);
    const want = body.loss.module;
    if (want && source?.sha256 !== want.sha256) {
      return `the loss '${fn.name}' of ${want.file} (SHA-256 ${want.sha256}) is not loaded on this device${source ? `: it has the loss from ${source.file} (SHA-256 ${source.sha256})` : ' (the shard was loaded without its module)'}`;
    }
    if (!want && source) return `the loss '${fn.name}' here is ${source.file}'s, but the call names the built-in one`;
    lossParams(fn, body.loss.params);
    return undefined;
  } catch (e) {
    return (e as Error).message;
  }
}

/** What is wrong with a train call's per-token arrays, given its loss; undefined when nothing is. */
function dataProblem(body: CallOf<'train'>): string | undefined {
  const fn: Loss = lossOf(body.loss.name);
  if (body.batch % fn.rowsPerItem !== 0) return `the loss '${body.loss.name}' takes rows in groups of ${fn.rowsPerItem}; the batch has ${body.batch}`;
  for (const port of fn.ports(lossParams(fn, body.loss.params))) {
    const a = body.data[port];
    if (!a) return `the loss '${body.loss.name}' reads '${port}'; the call's data has ${Object.keys(body.data).join(', ') || 'nothing'}`;
    if (a.length !== body.batch * body.responseLen) return `data.${port} has ${a.length} values, expected ${body.batch * body.responseLen}`;
  }
  const mask = body.data.mask;
  if (mask) {
    if (mask.length !== body.batch * body.responseLen) return `data.mask has ${mask.length} values, expected ${body.batch * body.responseLen}`;
    for (let i = 0; i < mask.length; i++) {
      if (mask[i] !== 0 && mask[i] !== 1) return `data.mask[${i}] = ${mask[i]}; a response mask holds 1 (a token the response has) or 0 (padding)`;
    }
  }
  return undefined;
}

/** What is wrong with a call's arrays, given the model's shape; undefined when nothing is. */
function shapeProblem(body: CallBody, spec: { vocab: number; context: number } | undefined): string | undefined {
  const expect = (what: string, got: number, want: number) => (got === want ? undefined : `${what} has ${got} values, expected ${want}`);
  const tokensIn = (what: string, t: Int32Array) => {
    if (!spec) return undefined;
    for (let i = 0; i < t.length; i++) {
      if (t[i]! < 0 || t[i]! >= spec.vocab) return `${what}[${i}] = ${t[i]} is not a token of a vocabulary of ${spec.vocab}`;
    }
    return undefined;
  };
  const fits = (len: number) => (spec && len > spec.context ? `sequences of ${len} tokens exceed the model's context of ${spec.context}` : undefined);
  switch (body.fn) {
    case 'generate':
      return (
        expect('prompts', body.prompts.length, body.batch * body.promptLen) ??
        expect('seeds', body.seeds.length, body.batch) ??
        fits(body.promptLen + body.responseLen) ??
        (body.episodes
          ? (expect('episodes.ids', body.episodes.ids.length, body.batch) ??
            expect('episodes.tasks', body.episodes.tasks.length, body.batch) ??
            (body.episodes.stop.length ? tokensIn('episodes.stop', Int32Array.from(body.episodes.stop)) : undefined))
          : undefined) ??
        tokensIn('prompts', body.prompts) ??
        (body.eos !== undefined ? tokensIn('eos', Int32Array.of(body.eos)) : undefined)
      );
    case 'inference':
    case 'sft':
    case 'train': {
      const width = body.promptLen + body.responseLen;
      return expect('tokens', body.tokens.length, body.batch * width) ?? (body.fn === 'train' ? dataProblem(body) : undefined) ?? fits(width) ?? tokensIn('tokens', body.tokens);
    }
    default:
      return undefined;
  }
}

/** A model's shard: one rank of its layout (the whole model, on a one-device layout). */
type ModelShard = GptRank;

interface Hosted {
  /** The model this shard belongs to. */
  role: string;
  layout: Layout;
  rank: number;
  shard: ModelShard | RuleShard;
  /** The training calls this shard's parameters have taken in, oldest first (see LedgerEntry). */
  ledger: LedgerEntry[];
  /** A learned reward model served on the bus (load's `serve`). */
  serving?: RewardActor;
}

type Body = Record<string, unknown>;

export interface DeviceOptions {
  /** How long a reallocation may wait for its go and its chunks. */
  transferTimeoutMs?: number;
  /** The bytes this device may hold in tensors (default: its backend's limit; see kvCacheProblem). */
  memoryBytes?: number;
  /** Where a transfer says what it dropped or sent again (default: standard error). */
  warn?: (line: string) => void;
  /** Called once in each generation of episodes, after their first step (chaos: a kill mid-episode). */
  midEpisode?: (call: Call) => Promise<void>;
}

export class Device {
  private readonly hosted = new Map<string, Hosted>();
  /** Listens for peers' activations and partial sums from the start, so none is missed. */
  private readonly comm: Comm;

  constructor(
    readonly index: number,
    private readonly bus: Bus,
    private readonly subj: Subjects,
    private readonly options: DeviceOptions = {},
  ) {
    this.comm = new Comm(bus, subj, index, options.transferTimeoutMs);
  }

  /** Highest RSS sampled since the last `stats` call: the memory a call needed at most. */
  private rssPeak = process.memoryUsage.rss();
  private readonly sampler = setInterval(() => {
    this.rssPeak = Math.max(this.rssPeak, process.memoryUsage.rss());
  }, 10).unref();

  close(): void {
    for (const c of this.environments.values()) c.close();
    this.environments.clear();
    for (const h of this.hosted.values()) void this.drop(h);
    this.comm.close();
    clearInterval(this.sampler);
  }

  /**
   * Drops every shard and ends every collective in flight, so that a call still running on this
   * device (abandoned by a reset) fails at its next step instead of changing anything that stays.
   * Returns the models it held.
   */
  reset(why: string): string[] {
    const dropped = this.models();
    for (const h of this.hosted.values()) void this.drop(h);
    this.hosted.clear();
    this.comm.endAll(why);
    return dropped;
  }

  /** Frees a shard, and stops serving it as a reward actor if it was. */
  private async drop(h: Hosted): Promise<void> {
    if (!(h.shard instanceof RuleShard)) h.shard.dispose();
    const serving = h.serving;
    h.serving = undefined;
    await serving?.stop();
  }

  models(): string[] {
    return [...this.hosted.keys()];
  }

  /**
   * Whether this device can take `call` now, decided before anything runs, so that a call it
   * cannot do is refused whole. Returns the refusal, or undefined.
   */
  check(call: Call): CallRejected | undefined {
    const { body, model } = call;
    if (body.fn === 'load' || body.fn === 'shutdown' || body.fn === 'stats' || body.fn === 'probe' || body.fn === 'reset') return undefined;
    if (body.fn === 'realloc') return this.checkRealloc(model, body);
    const h = this.hosted.get(model);
    if (!h) return this.notLoaded(model, body.fn);
    const kind = this.kindOf(h);
    const allowed: Record<string, readonly CallFn[]> = {
      policy: ['sft', 'generate', 'inference', 'train', 'manifest', 'weights', 'checkpoint', 'restore', 'release'],
      value: ['inference', 'train', 'preference', 'manifest', 'weights', 'checkpoint', 'restore', 'release'],
      rule: ['inference', 'manifest', 'release'],
    };
    if (!allowed[kind]!.includes(body.fn)) {
      return new CallRejected('unsupported', `'${body.fn}' is not a call of a ${kind} model ('${model}' on device ${this.index})`);
    }
    if (body.fn === 'preference' && h.layout.devices.length > 1) {
      return new CallRejected('unsupported', `'preference' trains a reward model on a one-device layout; '${model}' on device ${this.index} is one rank of ${h.layout.devices.length}`);
    }
    if ((body.fn === 'train' || body.fn === 'sft' || body.fn === 'preference') && !(h.shard as ModelShard).trainable) {
      return new CallRejected('invalid_state', `'${model}' on device ${this.index} is not on its training layout (no optimizer); '${body.fn}' is refused`);
    }
    if (body.fn === 'checkpoint' && body.optimizer !== (h.shard as ModelShard).trainable) {
      const has = (h.shard as ModelShard).trainable ? 'one' : 'none';
      return new CallRejected('invalid_state', `'${model}' on device ${this.index}: expected ${body.optimizer ? 'an' : 'no'} optimizer state, the shard has ${has}`);
    }
    if (body.fn === 'restore' && body.optimizer && !(h.shard as ModelShard).trainable) {
      return new CallRejected('invalid_state', `'${model}' on device ${this.index} holds no optimizer (not its training layout); the checkpoint has optimizer state`);
    }
    const lossBad = body.fn === 'train' ? lossProblem(body) : undefined;
    if (lossBad) return new CallRejected('loss', `'train' of '${model}' on device ${this.index}: ${lossBad}`);
    const bad = shapeProblem(body, h.shard instanceof RuleShard ? undefined : h.shard.spec);
    if (bad) return new CallRejected('malformed', `'${body.fn}' of '${model}': ${bad}`);
    if (body.fn === 'generate') {
      // The KV cache is sized from the batch and the budget before anything is allocated.
      const shard = h.shard as ModelShard;
      const full = kvCacheProblem(shard.cacheBytes(body.batch, body.promptLen + body.responseLen), this.options.memoryBytes);
      if (full) return new CallRejected('too_large', `'generate' of '${model}' on device ${this.index}: ${body.batch} sequences of ${body.promptLen} + ${body.responseLen} tokens: ${full}`);
    }
    return undefined;
  }

  private notLoaded(model: string, fn: string): CallRejected {
    const held = this.models();
    return new CallRejected('not_loaded', `device ${this.index} holds no shard of '${model}' (it holds ${held.length ? held.join(', ') : 'none'}); '${fn}' needs one`);
  }

  private kindOf(h: Hosted): 'policy' | 'value' | 'rule' {
    return h.shard instanceof RuleShard ? 'rule' : h.shard.spec.kind;
  }

  private checkRealloc(model: string, body: CallOf<'realloc'>): CallRejected | undefined {
    const gives = body.sends.length > 0 || body.locals.length > 0;
    const takes = body.recvs.length > 0 || body.locals.length > 0;
    for (const [name, needed] of [
      [body.source, gives],
      [model, takes],
    ] as const) {
      if (!needed) continue;
      const h = this.hosted.get(name);
      if (!h) return this.notLoaded(name, 'realloc');
      if (h.shard instanceof RuleShard) return new CallRejected('unsupported', `'${name}' is a rule reward: it has no parameters to move`);
    }
    return undefined;
  }

  async run(call: Call): Promise<Body> {
    const group = call.group ?? call.id;
    this.running = call;
    try {
      const refused = this.check(call);
      if (refused) throw refused;
      const out = await this.dispatch(call, group);
      if (call.body.fn === 'train') {
        this.hosted.get(call.model)?.ledger.push({ iteration: call.iteration, rows: call.body.batch, sha256: tokensDigest(call.body.tokens) });
      }
      return out;
    } catch (e) {
      // The other ranks of a multi-device call would wait for this one: tell them.
      const h = this.hosted.get(call.model);
      if (call.group && h && h.layout.devices.length > 1) this.comm.abort(group, h.layout.devices);
      // A loss that fails (not finite, not a scalar, a module that does not load) fails the same way again.
      if (e instanceof LossError) throw new CallRejected('loss', `'${call.body.fn}' of '${call.model}' on device ${this.index}: ${e.message}`);
      if (e instanceof EnvCallError || e instanceof CodecError) throw new CallRejected('environment', `'${call.body.fn}' of '${call.model}' on device ${this.index}: ${e.message}`);
      throw e;
    } finally {
      this.comm.forget(group);
    }
  }

  private async dispatch(call: Call, group: string): Promise<Body> {
    const body = call.body;
    switch (body.fn) {
      case 'load':
        return this.load(call.model, body);
      case 'shutdown':
        return {};
      case 'reset':
        return { dropped: this.reset(`device ${this.index} was reset (recovery ${body.epoch})`) };
      case 'realloc':
        return this.realloc(call.model, body);
      case 'probe':
        return this.probe(body);
      case 'stats': {
        const mb = (bytes: number) => bytes / (1 << 20);
        const rss = process.memoryUsage.rss();
        const windowPeak = Math.max(this.rssPeak, rss);
        this.rssPeak = rss;
        return { rss_mb: mb(rss), window_peak_rss_mb: mb(windowPeak), peak_rss_mb: process.resourceUsage().maxRSS / 1024, heap_mb: mb(process.memoryUsage().heapUsed) };
      }
      case 'release': {
        await this.drop(this.hosted.get(call.model)!);
        this.hosted.delete(call.model);
        return {};
      }
      default:
        return this.runOnShard(this.hosted.get(call.model)!, body, group);
    }
  }

  private async load(model: string, body: CallOf<'load'>): Promise<ResultOf<'load'>> {
    const { layout, rank, spec } = body;
    const size = layout.dp * layout.tp * layout.pp;
    if (size !== layout.devices.length) {
      throw new CallRejected('invalid_state', `layout dp×tp×pp = ${size} does not match its ${layout.devices.length} device(s)`);
    }
    if (layout.devices[rank] !== this.index) {
      throw new CallRejected('invalid_state', `rank ${rank} of layout [${layout.devices}] is device ${layout.devices[rank]}, not this device ${this.index}`);
    }
    if (spec.kind === 'rule' && size !== 1) throw new CallRejected('unsupported', `a rule reward runs on one device; got a layout of ${size}`);
    if (body.serve !== undefined && (spec.kind !== 'value' || size !== 1)) {
      throw new CallRejected('unsupported', `only a value model on one device can serve as a reward actor; '${model}' is a ${spec.kind} model on ${size} device(s)`);
    }
    if (spec.kind !== 'rule' && size > 1) {
      const problems = checkStrategy(modelInfo(spec), layout);
      if (spec.heads % layout.tp !== 0) problems.unshift(`tp=${layout.tp} does not divide the ${spec.heads} attention heads`);
      else if ((spec.kvHeads ?? spec.heads) % layout.tp !== 0) problems.unshift(`tp=${layout.tp} does not divide the ${spec.kvHeads} key/value heads`);
      if (problems.length) throw new CallRejected('unsupported', `layout dp=${layout.dp} tp=${layout.tp} pp=${layout.pp} does not fit the model: ${problems.join('; ')}`);
    }
    // A user's loss modules, checked against the digests the supervisor planned with, before any work.
    for (const m of body.losses ?? []) await loadLossModule(m);
    const previous = this.hosted.get(model);
    // From a checkpoint, only what it lacks (a value head) is drawn from the seed.
    const shard = spec.kind === 'rule' ? new RuleShard(spec) : new GptRank(spec, layout, rank, body.from === undefined ? body.seed : undefined, body.optim, this.comm);
    if (body.from !== undefined && shard instanceof GptRank) {
      try {
        const loaded = readHfWeights(body.from, shard.spec, shard.parameterNames());
        shard.importWhole(loaded);
        const have = new Set(loaded.map((t) => t.name));
        if (body.seed !== undefined)
          shard.seedParameters(
            body.seed,
            shard.parameterNames().filter((n) => !have.has(n)),
          );
      } catch (e) {
        shard.dispose();
        throw e instanceof HfError || e instanceof SafetensorsError ? new CallRejected('malformed', e.message) : e;
      }
    }
    if (previous) await this.drop(previous);
    const hosted: Hosted = { role: body.role, layout, rank, shard, ledger: [] };
    this.hosted.set(model, hosted);
    if (body.serve !== undefined) {
      // A learned reward model answers the reward protocol like any reward actor on the bus.
      const rm = shard as GptRank;
      let scored = 0;
      hosted.serving = await serveReward({
        nats: this.bus,
        name: body.serve,
        instance: `d${this.index}-${randomUUID().slice(0, 6)}`,
        score: async (items) => {
          const width = items[0] ? items[0].prompt.length + items[0].response.length : 0;
          const tokens = new Int32Array(items.length * width);
          items.forEach((it, b) => {
            if (it.prompt.length + it.response.length !== width) throw new Error(`item ${it.id} has ${it.prompt.length + it.response.length} tokens, the others ${width}`);
            tokens.set([...it.prompt, ...it.response], b * width);
          });
          const bad = shapeProblem({ fn: 'inference', tokens, batch: items.length, promptLen: items[0]?.prompt.length ?? 1, responseLen: items[0]?.response.length ?? 1 }, rm.spec);
          if (bad) throw new Error(bad);
          return Array.from(await rm.sequenceScores(`serve-${model}-${scored++}`, tokens, items.length));
        },
      });
    }
    const tensors = shard instanceof RuleShard ? [] : shard.exportTensors();
    return { parameters: tensors.reduce((n, t) => n + t.data.length, 0), digest: modelDigest(tensors) };
  }

  /** The slice of each parameter a hosted model holds, by name. */
  private slicesOf(h: Hosted): Map<string, Slice> {
    const shard = h.shard as ModelShard;
    return new Map(shardSlices(modelInfo(shard.spec), h.layout, h.rank).map((s) => [s.name, s]));
  }

  /**
   * One device's part of a reallocation: subscribe to what it receives and to the go signal, say
   * ready, send its pieces on go, and place each chunk as it arrives, checked, straight into the
   * new slices' memory in the backend. The target's weights change only once every piece is in and
   * verified. Pieces to send are cut one parameter at a time, so a device holds its old shard, its
   * new shard and the chunks in flight, not copies of everything.
   */
  private async realloc(model: string, body: CallOf<'realloc'>): Promise<ResultOf<'realloc'>> {
    const timeout = this.options.transferTimeoutMs ?? 300_000;
    const t0 = performance.now();
    const times = noTimes();
    const sourceHost = body.sends.length || body.locals.length ? this.hosted.get(body.source)! : undefined;
    const sourceSlices = sourceHost ? this.slicesOf(sourceHost) : new Map<string, Slice>();
    const targetHost = body.recvs.length || body.locals.length ? this.hosted.get(model)! : undefined;
    const targetSlices = targetHost ? this.slicesOf(targetHost) : new Map<string, Slice>();
    // Refuse a request that does not fit before anything moves.
    for (const p of [...body.sends.flatMap((x) => x.pieces), ...body.locals]) {
      if (!sourceSlices.has(p.name)) throw new CallRejected('invalid_state', `'${body.source}' on device ${this.index} holds no '${p.name}' to ${body.locals.includes(p) ? 'copy' : 'send'}`);
    }
    const incomingPieces = [...body.recvs.flatMap((x) => x.pieces), ...body.locals];
    for (const p of incomingPieces) {
      if (!targetSlices.has(p.name)) throw new CallRejected('invalid_state', `'${model}' on device ${this.index} holds no '${p.name}' to fill`);
    }
    // One parameter of the source at a time (pieces of one parameter come together).
    let cached: { name: string; data: Float32Array } | undefined;
    const sourceData = (name: string) => {
      if (cached?.name !== name) cached = { name, data: (sourceHost!.shard as ModelShard).exportTensor(name) };
      return cached.data;
    };
    // What this exchange makes the device hold beyond what it held before: sampled as chunks are placed.
    const held0 = heldBytes();
    let heldPeak = 0;
    const sampleHeld = () => (heldPeak = Math.max(heldPeak, heldBytes() - held0));
    const target = targetHost?.shard as ModelShard | undefined;
    const staging = target?.stage(new Set(incomingPieces.map((p) => p.name)));
    const filled = new Map<string, number>();
    const put = (part: Slice, offset: number, data: Float32Array) => {
      pasteRange(staging!.view(part.name), targetSlices.get(part.name)!, part, offset, data);
      filled.set(part.name, (filled.get(part.name) ?? 0) + data.length);
      sampleHeld();
    };
    const byKey = new Map(body.recvs.flatMap((r) => r.pieces.map((p) => [sliceKey(p), p] as const)));
    const incoming = receiveTensors(
      this.bus,
      this.subj,
      body.recvs.map((r) => ({ transfer: r.transfer, from: r.from, expected: r.pieces.map((p) => ({ name: sliceKey(p), shape: sliceShape(p) })) })),
      timeout,
      { place: (key, offset, data) => put(byKey.get(key)!, offset, data) },
      { times, me: this.index, warn: this.options.warn },
    );
    // Each send: its pieces cut one parameter at a time for the first publish, and a piece cut again
    // from the source (which nothing changes during the call), bit for bit, when a receiver asks.
    const outgoing = body.sends.map((s) => {
      const byName = new Map(s.pieces.map((p) => [sliceKey(p), p]));
      const piece = (p: Slice, data: Float32Array): NamedTensor => ({ name: sliceKey(p), shape: sliceShape(p), data: cut(data, sourceSlices.get(p.name)!, p) });
      return offerTensors(
        this.bus,
        this.subj,
        {
          transfer: s.transfer,
          from: this.index,
          to: s.to,
          tensors: function* () {
            for (const p of s.pieces) yield timed(times, 'export', () => piece(p, sourceData(p.name)));
          },
          tensor: (key) => {
            const p = byName.get(key);
            return p && piece(p, (sourceHost!.shard as ModelShard).exportTensor(p.name));
          },
        },
        body.chunkBytes,
        { times, timeoutMs: timeout, warn: this.options.warn },
      );
    });
    const signal = this.awaitGo(body.realloc, timeout);
    let committed = false;
    try {
      await signal.ready();
      await signal.go;
      const started = performance.now();
      incoming.arm();
      let sent = 0;
      let chunks = 0;
      for (const o of outgoing) {
        const r = await o.send();
        sent += r.bytes;
        chunks += r.chunks;
      }
      let copied = 0;
      for (const l of body.locals) {
        const data = timed(times, 'export', () => cut(sourceData(l.name), sourceSlices.get(l.name)!, l));
        timed(times, 'place', () => put(l, 0, data));
        copied += data.byteLength;
      }
      sampleHeld();
      cached = undefined;
      // Done once this device holds what it receives and every receiver of what it sent has said so.
      await Promise.race([Promise.all([incoming.done, ...outgoing.map((o) => o.received)]), signal.aborted]);
      sampleHeld();
      const wall = { ready_ms: started - t0, wall_ms: performance.now() - started };
      const held_mb = heldPeak / (1 << 20);
      if (!target) return { sent_bytes: sent, received_bytes: 0, copied_bytes: 0, chunks, times: { ...times, ...wall }, held_mb };
      for (const name of staging!.names) {
        const want = sliceElements(targetSlices.get(name)!);
        if (filled.get(name) !== want) throw new CallRejected('invalid_state', `reallocation ${body.realloc}: '${name}' of '${model}' got ${filled.get(name) ?? 0} of ${want} elements`);
      }
      timed(times, 'place', () => target.commit(staging!));
      committed = true;
      return {
        sent_bytes: sent,
        received_bytes: incoming.bytes(),
        copied_bytes: copied,
        chunks: chunks + incoming.chunks(),
        times: { ...times, ...wall, wall_ms: performance.now() - started },
        held_mb,
      };
    } finally {
      if (!committed) staging?.dispose();
      signal.close();
      incoming.close();
      outgoing.forEach((o) => o.close());
    }
  }

  /**
   * Listens for an exchange's go (or abort) and says ready. Every device of the exchange listens,
   * receivers too: an abort must reach them.
   */
  private awaitGo(id: string, transferTimeout: number) {
    // Devices of an exchange may be ready long before the others have finished the calls queued
    // ahead of it; the wait for go gets a longer limit than a transfer.
    const timeout = transferTimeout * 4;
    let stop = () => {};
    let timer: NodeJS.Timeout | undefined;
    let aborted!: (e: Error) => void;
    const abort = new Promise<never>((_, reject) => (aborted = reject));
    abort.catch(() => {});
    const go = new Promise<void>((resolve, reject) => {
      timer = setTimeout(() => reject(new CallRejected('timeout', `exchange ${id}: no go within ${timeout} ms`)), timeout);
      stop = subscribe(
        this.bus,
        this.subj.go(id),
        Go,
        (m) => {
          clearTimeout(timer);
          if (m.abort) {
            const e = new CallRejected('interrupted', `exchange ${id} was aborted: another device failed`);
            reject(e);
            aborted(e);
          } else resolve();
        },
        () => {},
      );
    });
    go.catch(() => {});
    return {
      go,
      aborted: abort,
      ready: async () => {
        await this.bus.flush();
        this.bus.publish(this.subj.ready(id), encode({ type: 'ready', v: PROTOCOL_VERSION, realloc: id, device: this.index }));
      },
      close: () => {
        clearTimeout(timer);
        stop();
      },
    };
  }

  /** Raw bytes on the same subjects a reallocation would use: the bus's own speed, for benchmarks. */
  private async probe(body: CallOf<'probe'>): Promise<ResultOf<'probe'>> {
    const timeout = this.options.transferTimeoutMs ?? 300_000;
    let received = 0;
    const want = body.recvs.reduce((n, r) => n + r.bytes, 0);
    let arrived!: () => void;
    const all = new Promise<void>((resolve) => (arrived = resolve));
    if (want === 0) arrived();
    const subs = body.recvs.map((r) =>
      this.bus.subscribe(this.subj.transferChunks(r.transfer), {
        callback: (_e, msg) => {
          received += msg.data.length;
          if (received >= want) arrived();
        },
      }),
    );
    const signal = this.awaitGo(body.realloc, timeout);
    try {
      await signal.ready();
      await signal.go;
      let sent = 0;
      const chunk = new Uint8Array(Math.min(body.chunkBytes, this.bus.info?.max_payload ?? body.chunkBytes)).fill(7);
      // The same flow control as a reallocation's sends.
      for (const s of body.sends) {
        const pace = pacer(this.bus);
        for (let left = s.bytes; left > 0; ) {
          const size = Math.min(left, chunk.length);
          this.bus.publish(this.subj.chunks(s.transfer, this.index), chunk.subarray(0, size));
          left -= size;
          sent += size;
          await pace.published();
        }
        await pace.end();
      }
      await Promise.race([all, signal.aborted]);
      return { sent_bytes: sent, received_bytes: received };
    } finally {
      signal.close();
      subs.forEach((s) => s.unsubscribe());
    }
  }

  private async runOnShard(h: Hosted, body: CallBody, group: string): Promise<Body> {
    const s = h.shard;
    if (s instanceof RuleShard) {
      if (body.fn === 'inference') return { scores: s.scores(body.tokens, body.batch, body.promptLen, body.answers) };
      return { manifest: [], digest: modelDigest([]) };
    }
    if (body.fn === 'checkpoint') return this.checkpoint(h, body);
    if (body.fn === 'restore') return this.restore(h, body);
    return this.runRank(h, s, body, group);
  }

  /** A call on one rank of the model's layout; every rank of the mesh runs it together. */
  private async runRank(h: Hosted, s: GptRank, body: CallBody, group: string): Promise<Body> {
    switch (body.fn) {
      case 'preference':
        return s.preference(group, body.chosen, body.rejected, body.batch, body.steps, body.minibatch, body.lr, body.seed);
      case 'sft':
        return s.sft(group, body.tokens, body.batch, body.promptLen, body.steps, body.minibatch, body.lr, body.seed, body.eos);
      case 'generate': {
        if (body.episodes) return this.playEpisodes(s, body, group);
        const out = await s.generate(group, body.prompts, body.batch, body.promptLen, body.responseLen, body.seeds, { ...body, memoryBytes: this.options.memoryBytes });
        return { tokens: out.tokens, logprobs: out.logprobs };
      }
      case 'inference': {
        const out = await s.infer(group, body.tokens, body.batch, body.promptLen);
        return s.spec.kind === 'policy' ? { logprobs: out } : { values: out };
      }
      case 'train': {
        const st = await s.train(group, body.tokens, body.batch, body.promptLen, body.responseLen, body.loss, body.data, body.epochs, body.minibatches, body.seed);
        return { loss: st.loss, grad_norm: st.gradNorm, stats: st.stats };
      }
      default:
        return this.onWeights(h, body);
    }
  }

  /** Clients of the environments this device has played episodes against, kept for its life (they track presence). */
  private readonly environments = new Map<string, EnvClient>();
  /** The call this device runs now (the last one given to run()). */
  private running?: Call;

  /**
   * A generate call's episodes of several turns: this replica's rows, each played against the
   * environment on the bus (engine/episodes), then their log-probabilities as training will
   * compute them, 0 at observations and after each end.
   */
  private async playEpisodes(s: GptRank, body: CallOf<'generate'>, group: string): Promise<ResultOf<'generate'>> {
    const e = body.episodes!;
    const [lo, hi] = replicaRows(body.batch, s.layout.dp, s.coords.dp);
    const P = body.promptLen;
    let client = this.environments.get(e.environment);
    if (!client) {
      client = new EnvClient(this.bus, e.environment, { run: this.subj.root.slice('ferry.'.length), timeoutMs: e.timeout_ms, retries: e.retries, waitMs: e.wait_ms, say: this.options.warn });
      this.environments.set(e.environment, client);
    }
    // Chaos reaches a generation of episodes in its middle: after the first step the environment answers.
    const call = this.running;
    const mid = this.options.midEpisode;
    let reached = false;
    const env = {
      reset: client.reset.bind(client),
      end: client.end.bind(client),
      step: async (episode: string, action: string) => {
        const out = await client.step(episode, action);
        if (mid && call && !reached) {
          reached = true;
          await mid(call);
        }
        return out;
      },
    };
    const played = await playEpisodes(env, turnCodec(e.codec, e.stop[0]), {
      prompts: body.prompts.subarray(lo * P, hi * P),
      tasks: e.tasks.slice(lo, hi),
      ids: e.ids.slice(lo, hi),
      seeds: body.seeds.subarray(lo, hi),
      promptLen: P,
      responseLen: body.responseLen,
      budget: { maxTurns: e.max_turns, turnTokens: e.turn_tokens, stop: e.stop, ...(e.stop_strings ? { stopStrings: e.stop_strings } : {}) },
      groupSize: e.group_size,
      fill: e.fill,
      vocab: s.spec.vocab,
      temperature: body.temperature,
      ...(body.greedy ? { greedy: true } : {}),
      ...(body.topK !== undefined ? { topK: body.topK } : {}),
      ...(body.topP !== undefined ? { topP: body.topP } : {}),
      decoder: (rows, capacity) => s.decoder(group, rows, capacity, { memoryBytes: this.options.memoryBytes }),
    });
    const logprobs = masked(await s.infer(`${group}/logp`, played.tokens, hi - lo, P), played.mask);
    return { tokens: played.tokens, logprobs, mask: played.mask, rewards: played.rewards, episodes: played.episodes, busy_seconds: played.busySeconds, seconds: played.seconds };
  }

  /** Calls about a shard's weights and state, the same whatever its layout. */
  private onWeights(h: Hosted, body: CallBody): Body {
    const s = h.shard as ModelShard;
    switch (body.fn) {
      case 'manifest': {
        const tensors = s.exportTensors();
        return { manifest: manifestOf(tensors), digest: modelDigest(tensors), ledger: h.ledger };
      }
      case 'weights':
        return { tensors: s.exportTensors() };
      default:
        throw new CallRejected('unsupported', `'${body.fn}' cannot run on a shard`);
    }
  }

  /** Streams the shard's weights (and optimizer moments) on go; see the protocol's `checkpoint`. */
  private async checkpoint(h: Hosted, body: CallOf<'checkpoint'>): Promise<ResultOf<'checkpoint'>> {
    const s = h.shard as ModelShard;
    const timeout = this.options.transferTimeoutMs ?? 300_000;
    const tensors = s.exportTensors();
    const state = s.optimizerState();
    const out: NamedTensor[] = tensors.map((t) => ({ ...t, name: `w:${t.name}` }));
    if (state) {
      // A parameter never stepped has zero moments, exactly what a fresh slot would hold.
      const moments = new Map(state.moments.map((m) => [m.name, m]));
      for (const t of tensors) {
        const m = moments.get(t.name);
        out.push({ name: `m:${t.name}`, shape: t.shape, data: m?.m ?? new Float32Array(t.data.length) });
        out.push({ name: `v:${t.name}`, shape: t.shape, data: m?.v ?? new Float32Array(t.data.length) });
      }
    }
    // Kept until the supervisor says it holds them all, to answer its requests to send a chunk again.
    const byName = new Map(out.map((t) => [t.name, t]));
    const outgoing = offerTensors(this.bus, this.subj, { transfer: body.transfer, from: this.index, to: ['supervisor'], tensors: () => out, tensor: (name) => byName.get(name) }, body.chunkBytes, {
      timeoutMs: timeout,
      warn: this.options.warn,
    });
    const signal = this.awaitGo(body.realloc, timeout);
    try {
      await signal.ready();
      await signal.go;
      const sent = await outgoing.send();
      await Promise.race([outgoing.received, signal.aborted]);
      return { step: state?.step ?? 0, optimizer: state !== undefined, bytes: sent.bytes, ledger: [...h.ledger] };
    } finally {
      signal.close();
      outgoing.close();
    }
  }

  /** Receives a streamed checkpoint and puts it back whole, or changes nothing. */
  private async restore(h: Hosted, body: CallOf<'restore'>): Promise<ResultOf<'restore'>> {
    const s = h.shard as ModelShard;
    const slices = shardSlices(modelInfo(s.spec), h.layout, h.rank);
    const expected = slices.flatMap((sl) => {
      const shape = sliceShape(sl);
      return [`w:${sl.name}`, ...(body.optimizer ? [`m:${sl.name}`, `v:${sl.name}`] : [])].map((name) => ({ name, shape }));
    });
    const got = new Map<string, NamedTensor>();
    const incoming = receiveTensors(this.bus, this.subj, [{ transfer: body.transfer, expected, from: 'supervisor' }], this.options.transferTimeoutMs ?? 300_000, (t) => got.set(t.name, t), {
      me: this.index,
      warn: this.options.warn,
    });
    const signal = this.awaitGo(body.realloc, this.options.transferTimeoutMs ?? 300_000);
    try {
      await signal.ready();
      incoming.arm();
      await Promise.race([incoming.done, signal.aborted]);
      s.importTensors(slices.map((sl) => ({ ...got.get(`w:${sl.name}`)!, name: sl.name })));
      if (body.optimizer) {
        s.loadOptimizerState({ step: body.step, moments: slices.map((sl) => ({ name: sl.name, m: got.get(`m:${sl.name}`)!.data, v: got.get(`v:${sl.name}`)!.data })) });
      }
      h.ledger = [...body.ledger];
      return {};
    } finally {
      signal.close();
      incoming.close();
    }
  }
}
