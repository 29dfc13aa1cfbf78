// A device: what one worker process hosts. It holds the shards of the models that the plan puts
// on it and answers calls about them. The worker process's machine (worker.machine.ts) decides when
// a call may run; this module decides whether the device's contents allow it and runs it. A
// shard's state to and from the supervisor (checkpoint, restore) is state-transfers.ts's; the
// wait for an exchange's go, exchange.ts's.
import type { Bus } from '../../mesh/wire/index.ts';
import { baseDigest, readSnapshot, stateOf, writeSnapshot, type HeldShard, type KnownBases } from './snapshot.ts';
import { checkStrategy, shardSlices, sliceElements, sliceKey, sliceShape, type Slice } from '../../mesh/parallel/index.ts';
import type { Checkpoint, LedgerEntry, Call, CallBody, CallFn, CallOf, Layout, ResultOf, SampleLog } from '../../mesh/wire/index.ts';
import { PROTOCOL_VERSION, encode } from '../../mesh/wire/index.ts';
import { cut, layoutKey, pasteRange } from '../../mesh/parallel/index.ts';
import type { Shelf, Subjects } from '../../mesh/wire/index.ts';
import { manifestOf, modelDigest, stateDigest, noTimes, offerTensors, pacer, receiveTensors, timed, type NamedTensor } from '../../mesh/wire/index.ts';
import { randomUUID } from 'node:crypto';
import { serveReward, type RewardActor } from '../../mesh/wire/index.ts';
import { EnvCallError } from '../../mesh/wire/index.ts';
import { CodecError } from '../episodes/index.ts';
import { DeviceEpisodes } from './episodes.ts';
import { RuleShard } from './rule.ts';
import { CallRejected, lossProblem, shapeProblem } from './checks.ts';
import { besideProblem, modelsOf } from './beside.ts';
import { awaitGo } from './exchange.ts';
import { restoreShard, sendCheckpoint } from './state-transfers.ts';
import { KeptBases, frozenTensors } from './kept-bases.ts';
import { modelInfo } from '../model/index.ts';
import { tokensDigest } from './ledger.ts';
import { Comm } from '../../mesh/parallel/index.ts';
import { LossError, loadLossModule } from '../model/index.ts';
import { GptRank, ShardError, heldBytes, kvCacheProblem } from '../model/index.ts';
import { HfError, SafetensorsError, readHfWeights, readPeftAdapter } from '../model/index.ts';
import { PeftError } from '../adapters/index.ts';
import { Switchboard, generateRows } from '../generation/index.ts';

export { CallRejected } from './checks.ts';

/** How often a reallocation's receiver samples what it holds while chunks are placed. */
const HELD_SAMPLE_MS = 50;

/** A model's shard: one rank of its layout (the whole model, on a one-device layout). */
export type ModelShard = GptRank;

export interface Hosted {
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
  /** Called once in each generation of episodes, after their first round of steps (chaos: a kill mid-episode). */
  midEpisode?: (call: Call) => Promise<void>;
  /** Where this device writes its snapshots (its own bucket of the run's; mesh/wire/transfer/shelf.ts). */
  shelf?: Shelf;
}

export class Device {
  private readonly hosted = new Map<string, Hosted>();
  /** Listens for peers' activations and partial sums from the start, so none is missed. */
  private readonly comm: Comm;

  constructor(
    readonly index: number,
    readonly bus: Bus,
    readonly subj: Subjects,
    readonly options: DeviceOptions = {},
  ) {
    this.comm = new Comm(bus, subj, index, options.transferTimeoutMs);
    this.episodes = new DeviceEpisodes(bus, subj, index, options.warn);
  }

  /** Highest RSS sampled since the last `stats` call: the memory a call needed at most. */
  private rssPeak = process.memoryUsage.rss();
  private readonly sampler = setInterval(() => {
    this.rssPeak = Math.max(this.rssPeak, process.memoryUsage.rss());
  }, 10).unref();

  close(): void {
    this.episodes.close();
    this.switchboard.clear(`device ${this.index} closed`);
    for (const h of this.hosted.values()) void this.drop(h);
    this.comm.close();
    clearInterval(this.sampler);
  }

  /**
   * Drops every shard and ends every collective in flight, so that a call still running on this
   * device (abandoned by a reset) fails at its next step instead of changing anything that stays.
   * `keep`: models whose shards stay (as they are, where they are), each with its state's digest
   * in the answer. One that a call is still running on is `busy`: neither kept nor dropped yet (an
   * abandoned call waiting on a collective fails at once, and the next reset finds it idle).
   */
  reset(why: string, keep: readonly string[] = [], epoch = 0): ResultOf<'reset'> {
    this.resetEpoch = Math.max(this.resetEpoch, epoch);
    const kept: ResultOf<'reset'>['kept'] = [];
    const busy: string[] = [];
    for (const model of keep) {
      const h = this.hosted.get(model);
      if (!h || h.shard instanceof RuleShard) continue;
      if (this.inProgress.has(model)) {
        busy.push(model);
        continue;
      }
      h.shard.forgetCalls();
      const state = this.stateOf(h);
      const base = baseDigest(h.shard.spec, state.optimizer !== undefined, state.tensors);
      kept.push({ model, layout: h.layout, rank: h.rank, state: stateDigest(state), parameters: state.tensors.reduce((n, t) => n + t.data.length, 0), ...(base ? { base } : {}) });
    }
    const staying = new Set([...kept.map((k) => k.model), ...busy]);
    const dropped = this.models().filter((m) => !staying.has(m));
    for (const m of dropped) void this.drop(this.hosted.get(m)!);
    for (const m of dropped) this.hosted.delete(m);
    this.keptBases.clear();
    this.switchboard.clear(why);
    this.comm.endAll(why);
    return { dropped, kept, busy };
  }

  /**
   * The epoch of the last reset: a call of an earlier one is abandoned work, refused even when it
   * reaches the device after the reset (the worker may have let it through just before).
   */
  private resetEpoch = 0;

  /** Models with a call still running on them (a reallocation's target and its source). */
  private readonly inProgress = new Map<string, number>();
  /** The calls running now: one, or one and one beside it. */
  private readonly running = new Set<Call>();

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
      policy: ['sft', 'generate', 'inference', 'train', 'manifest', 'weights', 'checkpoint', 'snapshot', 'restore', 'reload', 'release', 'switch'],
      value: ['inference', 'train', 'preference', 'manifest', 'weights', 'checkpoint', 'snapshot', 'restore', 'reload', 'release'],
      rule: ['inference', 'manifest', 'release'],
    };
    if (!allowed[kind]!.includes(body.fn)) {
      return new CallRejected('unsupported', `'${body.fn}' is not a call of a ${kind} model ('${model}' on device ${this.index})`);
    }
    if (body.fn === 'preference' && h.layout.devices.length > 1) {
      return new CallRejected('unsupported', `'preference' trains a reward model on a one-device layout; '${model}' on device ${this.index} is one rank of ${h.layout.devices.length}`);
    }
    if ((body.fn === 'train' || body.fn === 'sft' || body.fn === 'preference') && !(h.shard as ModelShard).weights.trainable) {
      return new CallRejected('invalid_state', `'${model}' on device ${this.index} is not on its training layout (no optimizer); '${body.fn}' is refused`);
    }
    if ((body.fn === 'checkpoint' || body.fn === 'snapshot') && body.optimizer !== (h.shard as ModelShard).weights.trainable) {
      const has = (h.shard as ModelShard).weights.trainable ? 'one' : 'none';
      return new CallRejected('invalid_state', `'${model}' on device ${this.index}: expected ${body.optimizer ? 'an' : 'no'} optimizer state, the shard has ${has}`);
    }
    if ((body.fn === 'restore' || body.fn === 'reload') && body.optimizer && !(h.shard as ModelShard).weights.trainable) {
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
    if (call.epoch !== undefined && call.epoch < this.resetEpoch && call.body.fn !== 'reset') {
      throw new CallRejected('interrupted', `call ${call.id} belongs to epoch ${call.epoch}; device ${this.index} was reset for epoch ${this.resetEpoch}`);
    }
    const group = call.group ?? call.id;
    // Two calls at once only as the worker lets them (engine/device/beside.ts): in one process,
    // with no worker machine in between, the device refuses a clash itself.
    if (call.body.fn !== 'reset') {
      for (const other of this.running) {
        const clash = call.beside || other.beside ? besideProblem(other, call) : undefined;
        if (clash) throw new CallRejected('busy', `device ${this.index} is running call ${other.id} (${other.body.fn} of ${other.model}): ${clash}`);
      }
    }
    // Every model the call reads or changes is in progress (a reallocation's source too).
    const models = modelsOf(call);
    for (const m of models) this.inProgress.set(m, (this.inProgress.get(m) ?? 0) + 1);
    this.running.add(call);
    try {
      const refused = this.check(call);
      if (refused) throw refused;
      const out = await this.dispatch(call, group);
      if (call.body.fn === 'train') {
        this.hosted
          .get(call.model)
          ?.ledger.push({ iteration: call.iteration, rows: call.body.batch, sha256: tokensDigest(call.body.tokens), ...(call.body.version !== undefined ? { version: call.body.version } : {}) });
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
      this.running.delete(call);
      for (const m of models) {
        const n = (this.inProgress.get(m) ?? 0) - 1;
        if (n > 0) this.inProgress.set(m, n);
        else this.inProgress.delete(m);
      }
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
        return this.reset(`device ${this.index} was reset (recovery ${body.epoch})`, body.keep, body.epoch);
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
      case 'switch':
        return this.switchCall(call.model, body);
      case 'snapshot':
        return this.snapshot(this.hosted.get(call.model)!, call.model, call.iteration, body);
      case 'reload':
        return this.reload(this.hosted.get(call.model)!, call.model, body);
      case 'release': {
        const h = this.hosted.get(call.model)!;
        if (body.keep !== undefined && h.shard instanceof GptRank) this.keptBases.keep(call.model, h.shard, h.layout, h.rank, body.keep);
        await this.drop(h);
        this.hosted.delete(call.model);
        return {};
      }
      default:
        return this.runOnShard(this.hosted.get(call.model)!, call, group);
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
        const loaded = readHfWeights(body.from, shard.spec, shard.weights.parameterNames());
        // A PEFT adapter's tensors, whole: each rank keeps its slices of those it holds.
        const held = new Set(shard.weights.parameterNames());
        if (body.adapter !== undefined) loaded.push(...readPeftAdapter(body.adapter, shard.spec).filter((t) => held.has(t.name)));
        const byName = new Map(loaded.map((t) => [t.name, t]));
        shard.weights.importWhole([...byName.values()]);
        const have = new Set(byName.keys());
        if (body.seed !== undefined)
          shard.weights.seed(
            body.seed,
            shard.weights.parameterNames().filter((n) => !have.has(n)),
          );
      } catch (e) {
        shard.dispose();
        throw e instanceof HfError || e instanceof SafetensorsError || e instanceof PeftError ? new CallRejected('malformed', e.message) : e;
      }
    }
    if (previous) await this.drop(previous);
    // A view of a model with adapters: the base kept from its last fill, if it is still that base.
    const baseKept = body.base !== undefined && shard instanceof GptRank ? this.keptBases.give(model, shard, layout, rank, body.base) : undefined;
    if (body.base === undefined) this.keptBases.drop(model);
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
    const tensors = shard instanceof RuleShard ? [] : shard.weights.exportTensors();
    return { parameters: tensors.reduce((n, t) => n + t.data.length, 0), digest: modelDigest(tensors), ...(baseKept === undefined ? {} : { base_kept: baseKept }) };
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
    // One parameter of the source at a time (pieces of one parameter come together), read where
    // the backend holds it. A call running beside this one (a generation, engine/device/beside.ts)
    // may allocate meanwhile, and the wasm heap moves when it grows: a view that went empty is
    // taken again for the next piece. A piece that is a whole parameter is itself such a view: if
    // it goes empty while its chunks are sent, the rest of them are not, or go out empty, and
    // receivers ask for them again (refusing any by its digest), answered from a copy — the same
    // bytes, later.
    let cached: { name: string; data: Float32Array } | undefined;
    const sourceData = (name: string) => {
      if (cached?.name !== name || cached.data.byteLength === 0) cached = { name, data: (sourceHost!.shard as ModelShard).weights.viewTensor(name) };
      return cached.data;
    };
    // What this exchange makes the device hold beyond what it held before: sampled as chunks are placed.
    const held0 = heldBytes();
    let heldPeak = 0;
    let sampledAt = 0;
    const sampleHeld = () => {
      sampledAt = performance.now();
      heldPeak = Math.max(heldPeak, heldBytes() - held0);
    };
    // As chunks are placed, at most every HELD_SAMPLE_MS: process.memoryUsage() walks the heap's
    // spaces, and once a chunk it cost as much as hashing the chunk.
    const sampleHeldNow = () => {
      if (performance.now() - sampledAt >= HELD_SAMPLE_MS) sampleHeld();
    };
    const target = targetHost?.shard as ModelShard | undefined;
    const staging = target?.weights.stage(new Set(incomingPieces.map((p) => p.name)));
    const filled = new Map<string, number>();
    const put = (part: Slice, offset: number, data: Float32Array) => {
      pasteRange(staging!.view(part.name), targetSlices.get(part.name)!, part, offset, data);
      filled.set(part.name, (filled.get(part.name) ?? 0) + data.length);
      sampleHeldNow();
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
            return p && piece(p, (sourceHost!.shard as ModelShard).weights.exportTensor(p.name));
          },
        },
        body.chunkBytes,
        { times, timeoutMs: timeout, warn: this.options.warn },
      );
    });
    const signal = awaitGo(this, body.realloc, timeout);
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
      timed(times, 'place', () => target.weights.commit(staging!));
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
    const signal = awaitGo(this, body.realloc, timeout);
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

  private async runOnShard(h: Hosted, call: Call, group: string): Promise<Body> {
    const { body } = call;
    const s = h.shard;
    if (s instanceof RuleShard) {
      if (body.fn === 'inference') return { scores: s.scores(body.tokens, body.batch, body.promptLen, body.answers) };
      return { manifest: [], digest: modelDigest([]) };
    }
    if (body.fn === 'checkpoint') return sendCheckpoint(this, h, body);
    if (body.fn === 'restore') return restoreShard(this, h, body, (from, next) => this.replace(from, next));
    return this.runRank(h, s, call, group);
  }

  /** A call on one rank of the model's layout; every rank of the mesh runs it together. */
  private async runRank(h: Hosted, s: GptRank, call: Call, group: string): Promise<Body> {
    const { body } = call;
    switch (body.fn) {
      case 'preference':
        return s.preference(group, body.chosen, body.rejected, body.batch, body.steps, body.minibatch, body.lr, body.seed);
      case 'sft':
        return s.sft(group, body.tokens, body.batch, body.promptLen, body.steps, body.minibatch, body.lr, body.seed, body.eos, body.mask);
      case 'generate': {
        if (body.episodes) return this.episodes.play(s, body, group, { call, midEpisode: this.options.midEpisode, memoryBytes: this.options.memoryBytes });
        if (body.slots !== undefined) return this.generateContinuous(s, call as Call & { body: CallOf<'generate'> }, group);
        const out = await s.generate(group, body.prompts, body.batch, body.promptLen, body.responseLen, body.seeds, { ...body, memoryBytes: this.options.memoryBytes });
        return { tokens: out.tokens, logprobs: out.logprobs };
      }
      case 'inference': {
        const out = await s.infer(group, body.tokens, body.batch, body.promptLen, body.base === true);
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

  /**
   * A generate call's rows generated continuously (engine/generation/): each row as it ends goes
   * to the supervisor on this device's `samples` subject when the call names a stage for them.
   */
  private async generateContinuous(s: GptRank, call: Call & { body: CallOf<'generate'> }, group: string): Promise<ResultOf<'generate'>> {
    const { body } = call;
    const stage = body.samples;
    const onSample =
      stage === undefined
        ? undefined
        : (row: number, tokens: Int32Array, logprobs: Float32Array, versions?: Int32Array) => {
            const log: SampleLog = { type: 'sample', v: PROTOCOL_VERSION, epoch: call.epoch ?? 0, iteration: call.iteration, stage, row, tokens, logprobs, ...(versions ? { versions } : {}) };
            this.bus.publish(this.subj.samples(this.index), encode(log));
          };
    const inflight = body.inflight ? this.openInflight(s, call, group) : undefined;
    try {
      const out = await generateRows(s, group, { ...body, slots: body.slots! }, { memoryBytes: this.options.memoryBytes, ...(onSample ? { onSample } : {}), ...(inflight ? { inflight } : {}) });
      return { tokens: out.tokens, logprobs: out.logprobs, ...(out.versions ? { versions: out.versions, switches: [out.switches ?? []] } : {}) };
    } finally {
      inflight?.close();
    }
  }

  /** Running continuous generations that take new versions in flight (engine/generation/inflight.ts). */
  private readonly switchboard = new Switchboard();

  /** A generate call's gate for new versions in flight: a model it switches to is another copy of its own, on the same layout and rank. */
  private openInflight(s: GptRank, call: Call & { body: CallOf<'generate'> }, group: string) {
    const spec = call.body.inflight!;
    if (s.layout.pp !== 1)
      throw new CallRejected(
        'unsupported',
        `'generate' of '${call.model}' on device ${this.index}: new versions in flight are taken by replicas of one stage (pp = 1); this layout has pp = ${s.layout.pp}`,
      );
    // The decisions name a pass for each rank of the layout (its devices in order).
    const planned = (spec.switches ?? []).flatMap((x) => (x.steps[s.rank] === null || x.steps[s.rank] === undefined ? [] : [{ step: x.steps[s.rank]!, version: x.version }]));
    return this.switchboard.open(
      { iteration: call.iteration, model: call.model },
      {
        version: spec.version,
        kv: spec.kv,
        planned,
        ...(s.layout.tp > 1 ? { agree: (step: number, mine: boolean) => s.anyOfTensorGroup(group, `inflight/${step}`, mine) } : {}),
        rankOf: async (model) => {
          const h = this.hosted.get(model);
          const next = h?.shard;
          if (!(next instanceof GptRank))
            throw new ShardError(`the generation on '${call.model}' was to go on with '${model}', which device ${this.index} ${h ? 'holds as no policy' : 'no longer holds'}`);
          if (layoutKey(h!.layout) !== layoutKey(s.layout) || h!.rank !== s.rank)
            throw new ShardError(`the generation on '${call.model}' (rank ${s.rank} of ${JSON.stringify(s.layout)}) cannot go on with '${model}', rank ${h!.rank} of ${JSON.stringify(h!.layout)}`);
          return next.decodingRank(group, { tensorParallel: true, what: 'continuous generations' });
        },
      },
    );
  }

  /** `switch`: asks the running generation to go on with `model` from its next pass, or says from which pass it does (engine/generation/inflight.ts). */
  private async switchCall(model: string, body: CallOf<'switch'>): Promise<ResultOf<'switch'>> {
    if (body.at === undefined) {
      const step = await this.switchboard.ask(body.generation, model, body.version);
      return step === undefined ? {} : { step };
    }
    this.switchboard.decide(body.generation, model, body.version, body.at);
    return {};
  }

  /** The environments this device plays episodes against. */
  private readonly episodes: DeviceEpisodes;
  /** Base objects this device wrote into its bucket or read (snapshot.ts): a frozen base is written once, and read again only where a shard does not hold it. */
  private readonly knownBases: KnownBases = new Map();
  /** Frozen bases of released views of models with adapters, for their next load (kept-bases.ts). */
  private readonly keptBases = new KeptBases();

  /** Calls about a shard's weights and state, the same whatever its layout. */
  private onWeights(h: Hosted, body: CallBody): Body {
    const s = h.shard as ModelShard;
    switch (body.fn) {
      case 'manifest': {
        const tensors = body.base && s instanceof GptRank ? frozenTensors(s) : s.weights.exportTensors();
        return { manifest: manifestOf(tensors), digest: modelDigest(tensors), ledger: h.ledger };
      }
      case 'weights':
        return { tensors: s.weights.exportTensors() };
      default:
        throw new CallRejected('unsupported', `'${body.fn}' cannot run on a shard`);
    }
  }

  /** Puts `next` where `h` is hosted (a shard moved onto another layout); false where `h` was dropped meanwhile. */
  private replace(h: Hosted, next: Hosted): boolean {
    const model = [...this.hosted].find(([, x]) => x === h)?.[0];
    if (model === undefined) return false;
    this.hosted.set(model, next);
    return true;
  }

  /** The shard's state as a checkpoint holds it (snapshot.ts's stateOf). */
  private stateOf(h: Hosted): Checkpoint {
    return stateOf(h as HeldShard);
  }

  /** The device's snapshot buckets, or a refusal naming what could not be done without them. */
  private shelf(what: string): Shelf {
    if (!this.options.shelf) throw new CallRejected('unsupported', `device ${this.index} has no snapshot buckets to ${what}`);
    return this.options.shelf;
  }

  /** Writes the shard's state into this device's own bucket; its bytes go from here to the store, not through the supervisor. */
  private snapshot(h: Hosted, model: string, iteration: number, body: CallOf<'snapshot'>): Promise<ResultOf<'snapshot'>> {
    return writeSnapshot(this.shelf(`write '${model}' into`), this.index, h as HeldShard, model, iteration, body, this.knownBases);
  }

  /** Puts the rank's state back from a snapshot's object; changes nothing unless the object is whole and this rank's. */
  private async reload(h: Hosted, model: string, body: CallOf<'reload'>): Promise<ResultOf<'reload'>> {
    const { tensors, checkpoint, bytes, baseKeptBytes } = await readSnapshot(this.shelf(`read '${model}' from`), h as HeldShard, model, body, this.knownBases);
    const s = h.shard as ModelShard;
    s.weights.importTensors(tensors);
    if (checkpoint.optimizer) s.weights.loadOptimizerState(checkpoint.optimizer);
    h.ledger = [...(checkpoint.ledger ?? [])];
    return { bytes, ...(baseKeptBytes ? { base_kept_bytes: baseKeptBytes } : {}) };
  }
}
