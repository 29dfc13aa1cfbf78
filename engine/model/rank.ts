// GptRank: one rank of a GPT model split over a mesh under a dp × tp × pp strategy, and the SPMD programs that the
// ranks of a mesh run together: each rank holds only its slices (its pipeline stage's layers;
// its tensor-parallel block of QKV, the attention output, and the MLP), activations go forward
// and gradients back between stages, partial sums are all-reduced inside a tensor group, and
// gradients are all-reduced across data-parallel replicas — all through Comm, over the bus.
//
// Backward runs layer by layer through the written-out backward passes of blocks.ts, from what the
// forward pass of a training step kept; automatic differentiation is left only the loss on the
// head's output. Every sum across ranks runs in rank order, so repeated runs are bit-identical.
import * as tf from '@tensorflow/tfjs';
import { rankCoords, rankOf, shardSlices, stageBounds, type Coords, type Layout } from '../../mesh/parallel/index.ts';
import type { LossSpec, Optim } from '../../mesh/wire/index.ts';
import type { Comm } from '../../mesh/parallel/index.ts';
import { LossError, checkedValue, evaluateLoss, itemRows, lossOf, lossParams, preferenceLoss, type Loss, type LossNorm, type LossParams } from './losses/index.ts';
import { causalMask, logprobsOf, paddedMask, valuesOf } from './gpt.ts';
import {
  attention,
  attentionBackward,
  attentionCached,
  embedBackward,
  embedRows,
  layerNorm,
  layerNormBackward,
  linear,
  linearBackward,
  weightGrad,
  mlp,
  mlpBackward,
  rmsNorm,
  rmsNormBackward,
  ropeTables,
  ropeTablesRows,
  sumRows,
  swiglu,
  swigluBackward,
  type AttnCache,
  type AttnDims,
  type AttnWeights,
  type GluCache,
  type MlpCache,
  type NormCache,
} from './blocks.ts';
import { archOf, isTied, modelInfo, specProblem, trains, type Arch, type GptSpec } from './params.ts';
import { isAdapter } from '../adapters/index.ts';
import { LayerAdapters } from './layer-adapters.ts';
import { reduceGradients } from './gradients.ts';
import { Rng, Stream, sampleToken, samplingProblem, seedOf, type Sampling } from './rng.ts';
import { leftPadding, masked, responseMask } from './mask.ts';
import { Adam } from './adam.ts';
import { ShardWeights } from './weights.ts';
import { KvCache, kvCacheBytes, kvCacheProblem } from './kv-cache.ts';
import { openRowDecoder, type DecodingRank, type RowDecoder } from './row-decoder.ts';
import { ShardError, pickRows, trainEpochs, yieldToLoop, type TrainStats } from './steps.ts';

/** How `generate` draws tokens and when a response ends. */
export interface GenerateOptions extends Sampling {
  /** The end-of-sequence token: a row stops after it (none: every row runs to the budget). */
  eos?: number;
  /** Decode with a KV cache (default) or run the whole prefix again for every token. */
  cache?: boolean;
  /** The bytes this device may hold in tensors (default: its backend's limit; see kvCacheProblem). */
  memoryBytes?: number;
}

/** What one layer's backward pass reads, kept by the forward pass of a training step. */
interface LayerCache {
  ln1: NormCache;
  attn: AttnCache;
  ln2: NormCache;
  mlp: MlpCache | GluCache;
}

function disposeLayerCache(c: LayerCache): void {
  tf.dispose([...Object.values(c.ln1), ...Object.values(c.attn), ...Object.values(c.ln2), ...Object.values(c.mlp)]);
}

/** Frees an attention call's rotary tables, if it had any. */
function disposeRope(d: AttnDims): void {
  if (d.rope) tf.dispose([d.rope.cos, d.rope.sin]);
}

/** The value head after each row's last token, from a head output [b, T, 1]: [b]. */
function lastValuesOf(out: tf.Tensor): tf.Tensor1D {
  const [b, T] = out.shape as [number, number, number];
  return tf.reshape(tf.slice(out, [0, T - 1, 0], [b, 1, 1]), [b]) as tf.Tensor1D;
}

/** Rows [lo, hi) of `n` that data-parallel replica `d` of `dp` takes: contiguous, in order. */
export function replicaRows(n: number, dp: number, d: number): [number, number] {
  return [Math.floor((d * n) / dp), Math.floor(((d + 1) * n) / dp)];
}

/** What a step minimises: the warm-up's cross-entropy, or a named loss over its per-token arrays. */
type Objective =
  /** Cross-entropy of the response tokens `mask` keeps ([rows, R]; all of them without one). */
  | { kind: 'sft'; mask?: Float32Array }
  | { kind: 'loss'; fn: Loss; params: LossParams; data: Record<string, Float32Array>; responseLen: number }
  /** Bradley–Terry on whole sequences: `items` pairs, every chosen row, then every rejected one. */
  | { kind: 'preference'; items: number };

export class GptRank {
  readonly coords: Coords;
  /** This rank's slices of the parameters, and its optimizer on the training layout. */
  readonly weights: ShardWeights;
  private readonly layers: number[];
  private readonly first: boolean;
  private readonly last: boolean;
  /** Devices of this rank's tensor group, data-parallel group and model-parallel group, in rank order. */
  private readonly tpGroup: number[];
  private readonly dpGroup: number[];
  private readonly mpGroup: number[];
  private readonly prev: number | undefined;
  private readonly next: number | undefined;
  private readonly arch: Arch;
  /** This replica's first and last stage (same tensor rank): a tied head's two ends. */
  private readonly firstOfReplica: number;
  private readonly lastOfReplica: number;
  /**
   * A tied head on a pipeline (Megatron's way): the first stage owns wte; the last stage holds a
   * copy for the head, sent to it whenever wte changed (a step, an import), and sends the head's
   * gradient of wte back, where it is added to the embedding's before the optimizer step.
   */
  private readonly tiedCopy: boolean;
  private headWte?: tf.Tensor;
  /** Whether wte changed since the last stage's copy was sent: the same on both ends, which see the same calls. */
  private headStale = true;
  /** Its LoRA adapters, as its blocks read them (none without). */
  private readonly adapters: LayerAdapters;

  constructor(
    readonly spec: GptSpec,
    readonly layout: Layout,
    readonly rank: number,
    seed: number | undefined,
    private readonly optim: Optim | undefined,
    private readonly comm: Comm,
  ) {
    const bad = specProblem(spec);
    if (bad) throw new ShardError(`the model cannot be built: ${bad}`);
    this.arch = archOf(spec);
    if (this.arch.kvHeads % layout.tp !== 0) throw new ShardError(`tp = ${layout.tp} must divide the model's ${this.arch.kvHeads} key/value heads: each tensor rank takes whole heads`);
    const c = (this.coords = rankCoords(layout, rank));
    const info = modelInfo(spec);
    const bounds = stageBounds(info, layout.pp);
    this.weights = new ShardWeights(spec, shardSlices(info, layout, rank, bounds), rank, optim, () => (this.headStale = true));
    this.adapters = new LayerAdapters(spec, this.weights);
    this.layers = [];
    for (let l = bounds[c.pp]!; l < bounds[c.pp + 1]!; l++) this.layers.push(l);
    this.first = c.pp === 0;
    this.last = c.pp === layout.pp - 1;
    const dev = (x: Partial<Coords>) => layout.devices[rankOf(layout, { ...c, ...x })]!;
    this.tpGroup = Array.from({ length: layout.tp }, (_, tp) => dev({ tp }));
    this.dpGroup = Array.from({ length: layout.dp }, (_, dp) => dev({ dp }));
    this.mpGroup = Array.from({ length: layout.pp * layout.tp }, (_, i) => dev({ pp: Math.floor(i / layout.tp), tp: i % layout.tp }));
    this.prev = this.first ? undefined : dev({ pp: c.pp - 1 });
    this.next = this.last ? undefined : dev({ pp: c.pp + 1 });
    this.firstOfReplica = dev({ pp: 0 });
    this.lastOfReplica = dev({ pp: layout.pp - 1 });
    this.tiedCopy = isTied(spec) && layout.pp > 1;
    // A view that a reallocation will fill holds nothing until then: no zeros to replace.
    if (seed !== undefined) this.weights.seed(seed, this.weights.parameterNames());
  }

  /** Whether this rank returns its replica's outputs (the last stage's first tensor rank). */
  get speaks(): boolean {
    return this.last && this.coords.tp === 0;
  }

  /** A rank of the same model, optimizer settings and collectives on another layout, holding nothing yet: what a shard moved in place is built into. */
  sibling(layout: Layout, rank: number): GptRank {
    return new GptRank(this.spec, layout, rank, undefined, this.optim, this.comm);
  }

  dispose(): void {
    this.weights.dispose();
    this.headWte?.dispose();
    this.headT?.dispose();
  }

  /**
   * Drops what calls left beside the weights: the tied head's copy and its transpose, the decoding
   * sessions' count. A shard kept through a reset (its state digest covers only weights,
   * optimizer and ledger) starts as a fresh one would: every rank of its replica, reset too,
   * agrees that the copy is to be sent again.
   */
  forgetCalls(): void {
    this.headStale = true;
    this.headWte?.dispose();
    this.headWte = undefined;
    this.headT?.dispose();
    this.headT = undefined;
    this.decoders = 0;
  }

  /**
   * Whether any rank of this rank's tensor group says `flag` (every rank of the group asks, with the
   * same `tag`): what lets the tensor ranks of a replica decide one thing at the same pass.
   */
  async anyOfTensorGroup(group: string, tag: string, flag: boolean): Promise<boolean> {
    if (this.tpGroup.length === 1) return flag;
    const sum = await this.comm.allReduce(group, this.tpGroup, tag, Float32Array.of(flag ? 1 : 0));
    return sum[0]! > 0;
  }

  /** Sends (first stage) or takes (last stage) the tied head's copy of wte, when wte changed since. */
  private async syncTiedHead(group: string, tag: string): Promise<void> {
    if (!this.tiedCopy || !this.headStale) return;
    this.headStale = false;
    if (this.first) this.sendTensor(group, this.lastOfReplica, `${tag}/wte`, this.weights.get('wte'));
    else if (this.last) {
      this.headWte?.dispose();
      this.headWte = await this.recvTensor(group, this.firstOfReplica, `${tag}/wte`, [this.spec.vocab, this.spec.width]);
    }
  }

  /** The token embedding as the head reads it: this stage's wte, or (a pipeline's last stage) its copy. */
  private get headEmbedding(): tf.Tensor {
    return this.tiedCopy ? this.headWte! : this.weights.get('wte');
  }

  // ---- communication helpers ------------------------------------------------------------------

  private async allReduceTp(group: string, tag: string, t: tf.Tensor): Promise<tf.Tensor> {
    if (this.layout.tp === 1) return t;
    const sum = await this.comm.allReduce(group, this.tpGroup, tag, t.dataSync() as Float32Array);
    const out = tf.tensor(sum, t.shape);
    t.dispose();
    return out;
  }

  private async recvTensor(group: string, from: number, tag: string, shape: number[]): Promise<tf.Tensor> {
    return tf.tensor(await this.comm.recv(group, from, tag), shape, 'float32');
  }

  private sendTensor(group: string, to: number, tag: string, t: tf.Tensor): void {
    this.comm.send(group, to, tag, t.dataSync() as Float32Array);
  }

  // ---- forward ----------------------------------------------------------------------------------

  private attn(l: number): AttnWeights {
    const g = (n: string) => this.weights.get(`h${l}.attn.${n}`);
    const w: AttnWeights = { wq: g('wq'), wk: g('wk'), wv: g('wv'), wo: g('wo') };
    const lora = this.adapters.attn(l);
    if (lora) w.lora = lora;
    return this.arch.qkvBias ? { ...w, bq: g('bq'), bk: g('bk'), bv: g('bv') } : w;
  }

  private get localHeads(): number {
    return this.spec.heads / this.layout.tp;
  }

  private get localKvHeads(): number {
    return this.arch.kvHeads / this.layout.tp;
  }

  private get gpt2(): boolean {
    return this.arch.family === 'gpt2';
  }

  /** The shape of this rank's attention over b rows of T positions starting at `start`. */
  private dims(b: number, T: number, start: number | Int32Array = 0): AttnDims {
    const rope = this.gpt2 ? undefined : typeof start === 'number' ? ropeTables(this.arch.ropeTheta, this.arch.headSize, start, T) : ropeTablesRows(this.arch.ropeTheta, this.arch.headSize, start, T);
    return { B: b, T, heads: this.localHeads, kvHeads: this.localKvHeads, ...(rope ? { rope } : {}) };
  }

  /** The norm named `prefix` (ln1, ln2, lnf) over rows x: layer norm (gpt2) or RMSNorm (llama). */
  private norm(prefix: string, x: tf.Tensor, keep: boolean): { y: tf.Tensor; cache?: NormCache } {
    if (this.gpt2) return layerNorm(x, this.weights.get(`${prefix}.g`), this.weights.get(`${prefix}.b`), keep);
    return rmsNorm(x, this.weights.get(`${prefix}.g`), this.arch.normEps, keep);
  }

  /** The norm's backward pass, its gradients added under their names; returns dx. */
  private normBackward(prefix: string, c: NormCache, dy: tf.Tensor, add: (name: string, g: tf.Tensor) => void): tf.Tensor {
    if (!this.gpt2) {
      const r = rmsNormBackward(c, this.weights.get(`${prefix}.g`), dy);
      add(`${prefix}.g`, r.dg);
      return r.dx;
    }
    const r = layerNormBackward(c, this.weights.get(`${prefix}.g`), dy);
    add(`${prefix}.g`, r.dg);
    add(`${prefix}.b`, r.db);
    return r.dx;
  }

  /** Adds a bias the family has (gpt2's output biases), or nothing; disposes x when it adds. */
  private bias(x: tf.Tensor, name: string): tf.Tensor {
    if (!this.gpt2) return x;
    const out = tf.add(x, this.weights.get(name));
    x.dispose();
    return out;
  }

  /**
   * Layer `l` over the residual stream x [b·T, D], which it disposes: x1 = x + Σtp attend(LN1(x)) + bo,
   * then x1 + Σtp MLP(LN2(x1)) + b2. With `keep`, also what the layer's backward pass reads.
   */
  private async layer(group: string, tag: string, l: number, x: tf.Tensor, attend: (h: tf.Tensor) => { out: tf.Tensor; cache?: AttnCache }, keep: boolean) {
    const W = (n: string) => this.weights.get(`h${l}.${n}`);
    const n1 = this.norm(`h${l}.ln1`, x, keep);
    const at = attend(n1.y);
    const a = await this.allReduceTp(group, `${tag}/l${l}/attn`, at.out);
    const x1 = this.bias(tf.add(x, a), `h${l}.attn.bo`);
    tf.dispose([a, n1.y, x]); // the norm's cache is all its backward pass reads
    const n2 = this.norm(`h${l}.ln2`, x1, keep);
    const ad = this.adapters.mlp(l);
    const mm = this.gpt2 ? mlp(n2.y, W('mlp.w1'), W('mlp.b1'), W('mlp.w2'), keep, ad) : swiglu(n2.y, W('mlp.w1'), W('mlp.w3'), W('mlp.w2'), keep, ad);
    const m = await this.allReduceTp(group, `${tag}/l${l}/mlp`, mm.out);
    const x2 = this.bias(tf.add(x1, m), `h${l}.mlp.b2`);
    tf.dispose([m, n2.y, x1]);
    const cache: LayerCache | undefined = keep ? { ln1: n1.cache!, attn: at.cache!, ln2: n2.cache!, mlp: mm.cache! } : undefined;
    return { x: x2, cache };
  }

  /**
   * This stage's part of a forward pass over `tokens` [b, T] (this replica's rows). Returns the
   * head output [b, T, V or 1] on the last stage (undefined elsewhere, after sending the
   * activations on), and with `keep`, what each layer's and the head's backward passes read.
   */
  /** Each row's left padding among its first `limit` tokens (a prompt's), for a model with a pad token. */
  private padsOf(tokens: Int32Array, b: number, T: number, limit: number): Int32Array | undefined {
    return leftPadding(tokens, b, T, limit, this.spec.pad);
  }

  private async forwardStage(group: string, tag: string, tokens: Int32Array, b: number, T: number, keep: boolean, pads?: Int32Array) {
    await this.syncTiedHead(group, tag);
    const D = this.spec.width;
    const saved: LayerCache[] = [];
    let x: tf.Tensor; // the residual stream as rows, [b·T, D]
    let tokensT: tf.Tensor2D | undefined;
    if (this.first) {
      tokensT = tf.tensor2d(tokens, [b, T], 'int32');
      x = embedRows(tokensT, this.weights.get('wte'), this.positions, 0, pads);
    } else {
      x = await this.recvTensor(group, this.prev!, `${tag}/act`, [b * T, D]);
    }
    const mask = pads ? paddedMask(pads, T, T) : causalMask(T);
    const dims = this.dims(b, T);
    for (const l of this.layers) {
      const done = await this.layer(group, tag, l, x, (h) => attention(h, this.attn(l), dims, mask, keep), keep);
      x = done.x;
      if (keep) saved.push(done.cache!);
    }
    mask.dispose();
    // A training step's backward pass turns its gradients back with the same tables.
    if (!keep) disposeRope(dims);
    if (!keep && tokensT) {
      tokensT.dispose();
      tokensT = undefined;
    }
    if (!this.last) {
      this.sendTensor(group, this.next!, `${tag}/act`, x);
      x.dispose();
      return { out: undefined, saved, head: undefined, tokensT, dims };
    }
    const n = this.norm('lnf', x, keep);
    x.dispose();
    const out = tf.tidy(() => {
      const logits = this.headRows(n.y);
      return tf.reshape(logits, [b, T, logits.shape[1]!]);
    });
    if (!keep) n.y.dispose();
    return { out, saved, head: keep ? { ln: n.cache!, y: n.y } : undefined, tokensT, dims };
  }

  /** Position embeddings (gpt2's wpe), or none (llama turns queries and keys instead). */
  private get positions(): tf.Tensor | undefined {
    return this.gpt2 ? this.weights.get('wpe') : undefined;
  }

  // ---- calls ------------------------------------------------------------------------------------

  /**
   * Log-probabilities (policy) or values (value model) of the response tokens, [b, R] per replica;
   * `base`: the base model's, the adapters off (a reference that is this policy's base).
   */
  async infer(group: string, tokens: Int32Array, batch: number, promptLen: number, base = false): Promise<Float32Array> {
    const T = tokens.length / batch;
    const [lo, hi] = replicaRows(batch, this.layout.dp, this.coords.dp);
    const mine = tokens.subarray(lo * T, hi * T);
    const { out } = await this.adapters.withBase(base, () => this.forwardStage(group, 'inf', mine, hi - lo, T, false, this.padsOf(mine, hi - lo, T, promptLen)));
    if (!out) return new Float32Array(0);
    const t = tf.tidy(() => (this.spec.kind === 'policy' ? logprobsOf(out, tf.tensor2d(mine, [hi - lo, T], 'int32'), promptLen, this.spec.vocab) : valuesOf(out, promptLen)));
    out.dispose();
    const res = t.dataSync() as Float32Array;
    t.dispose();
    return this.speaks ? res : new Float32Array(0);
  }

  /** wteᵀ for the length of one generate call (a tied head's decoding steps would each transpose it). */
  private headT?: tf.Tensor;
  /** Decoding sessions open (decoder()): they share headT. */
  private decoders = 0;

  /** The head over rows y [N, D]: y·head.w + head.b, or y·wteᵀ for a tied head ([N, V] or [N, 1]). */
  private headRows(y: tf.Tensor): tf.Tensor {
    if (!isTied(this.spec)) return linear(y, this.weights.get('head.w'), this.gpt2 ? this.weights.get('head.b') : undefined);
    // Transposed explicitly: a product with a transposed operand is slow on wasm (blocks.ts).
    if (this.headT) return tf.matMul(y as tf.Tensor2D, this.headT as tf.Tensor2D);
    return tf.tidy(() => tf.matMul(y as tf.Tensor2D, tf.transpose(this.headEmbedding) as tf.Tensor2D));
  }

  /**
   * This stage's part of one decoding pass: positions [start, start + T) of `b` rows (`tokens`
   * [b, T] on the first stage), attending through `cache`. Returns, on the last stage, the
   * logits of each row's last position [b, V]; elsewhere undefined, after sending the activations on.
   */
  private async decodeStage(
    group: string,
    tag: string,
    tokens: Int32Array,
    b: number,
    T: number,
    start: number | Int32Array,
    cache: KvCache,
    pads?: Int32Array,
    lastCols?: Int32Array,
  ): Promise<tf.Tensor | undefined> {
    const D = this.spec.width;
    let x: tf.Tensor;
    if (this.first) {
      const tokensT = tf.tensor2d(tokens, [b, T], 'int32');
      x = embedRows(tokensT, this.weights.get('wte'), this.positions, start, pads);
      tokensT.dispose();
    } else {
      x = await this.recvTensor(group, this.prev!, `${tag}/act`, [b * T, D]);
    }
    const dims = this.dims(b, T, start);
    for (const l of this.layers) {
      x = (await this.layer(group, tag, l, x, (h) => ({ out: attentionCached(h, this.attn(l), dims, start, cache, l, pads) }), false)).x;
    }
    disposeRope(dims);
    if (!this.last) {
      this.sendTensor(group, this.next!, `${tag}/act`, x);
      x.dispose();
      return undefined;
    }
    // The head only where a token is sampled: each row's last position (or the one `lastCols` names).
    const logits = tf.tidy(() => {
      const pick = lastCols
        ? tf.tensor1d(
            Int32Array.from(lastCols, (c, i) => i * T + c),
            'int32',
          )
        : undefined;
      const last = pick ? tf.gather(x, pick) : T === 1 ? x : tf.reshape(tf.slice(tf.reshape(x, [b, T, D]), [0, T - 1, 0], [b, 1, D]), [b, D]);
      return this.headRows(this.norm('lnf', last, false).y);
    });
    x.dispose();
    return logits;
  }

  /**
   * A decoding session for sequences that grow by passes of their own (episodes of several turns,
   * continuous generation): `rows` sequences of up to `capacity` positions, each pass feeding
   * tokens [rows, n] at each row's own start and returning the logits [rows, V] at each row's
   * column `last`. A row with nothing to feed feeds anything at its next free position: what it
   * writes there is written over by its next real pass, and no query of it sees past its own
   * position. For a replica on one stage (pp = 1: every rank has the logits), on one device unless
   * `tensorParallel` (every tensor rank of the replica then makes the same passes, in the same
   * order); the caller disposes the session.
   */
  async decoder(group: string, rows: number, capacity: number, opts: { memoryBytes?: number; pads?: Int32Array; tensorParallel?: boolean; what?: string } = {}): Promise<RowDecoder> {
    const what = opts.what ?? 'episodes of several turns';
    this.decodingProblem(what, opts.tensorParallel);
    const problem = kvCacheProblem(kvCacheBytes(rows * this.localKvHeads, this.arch.headSize, capacity, this.layers.length), opts.memoryBytes);
    if (problem) throw new ShardError(`generating ${rows} ${what} of up to ${capacity} positions: ${problem}`);
    return openRowDecoder(await this.decodingRank(group, opts), rows, capacity, opts.pads);
  }

  /** Refuses a decoding session where this layout cannot hold one (decoder()). */
  private decodingProblem(what: string, tensorParallel?: boolean): void {
    if (this.layout.pp !== 1 || (this.layout.tp !== 1 && !tensorParallel))
      throw new ShardError(
        `${what} are generated by a replica on ${tensorParallel ? 'one stage (pp = 1)' : 'one device (tp = pp = 1)'}; this layout has tp = ${this.layout.tp}, pp = ${this.layout.pp}`,
      );
  }

  /**
   * What a decoding session needs of this rank (RowDecoder): its passes, for a session it opens or
   * for one that goes on with these weights (RowDecoder.switchTo, another version of the model on
   * the same layout). Closed by the session.
   */
  async decodingRank(group: string, opts: { tensorParallel?: boolean; what?: string } = {}): Promise<DecodingRank> {
    this.decodingProblem(opts.what ?? 'episodes of several turns', opts.tensorParallel);
    // Sessions share the tied head's transpose (episodes play in several at once): the last one out frees it.
    if (this.decoders++ === 0) {
      await this.syncTiedHead(group, 'ep');
      if (isTied(this.spec)) this.headT = tf.transpose(this.headEmbedding);
    }
    const V = this.spec.vocab;
    return {
      heads: this.localKvHeads,
      headSize: this.arch.headSize,
      pass: async (tag, tokens, b, T, start, cache, pads, last) => {
        const logits = (await this.decodeStage(group, tag, tokens, b, T, start, cache, pads, last))!;
        const out = (logits.dataSync() as Float32Array).slice(0, b * V);
        logits.dispose();
        return out;
      },
      padsOf: (tokens, b, T, limit) => this.padsOf(tokens, b, T, limit),
      logprobs: async (tag, tokens, b, promptLen, eos) => (await this.sequenceLogprobs(group, tag, tokens, b, promptLen, eos))!,
      closed: () => {
        if (--this.decoders === 0) {
          this.headT?.dispose();
          this.headT = undefined;
        }
      },
    };
  }

  /**
   * The log-probabilities of `b` whole sequences' sampled tokens [b, T] (prompts of `promptLen`),
   * as training reads them, 0 after each `eos`: [b, T − promptLen] on the last stage (computed
   * only where `compute`), undefined elsewhere.
   */
  private async sequenceLogprobs(
    group: string,
    tag: string,
    tokens: Int32Array,
    b: number,
    promptLen: number,
    eos: number | undefined,
    pads = this.padsOf(tokens, b, tokens.length / b, promptLen),
    compute = true,
  ): Promise<Float32Array | undefined> {
    const T = tokens.length / b;
    const { out } = await this.forwardStage(group, tag, tokens, b, T, false, pads);
    if (!out || !compute) {
      out?.dispose();
      return undefined;
    }
    const lp = tf.tidy(() => logprobsOf(out, tf.tensor2d(tokens, [b, T], 'int32'), promptLen, this.spec.vocab));
    const res = masked(lp.dataSync() as Float32Array, responseMask(tokens, promptLen, T - promptLen, eos));
    tf.dispose([out, lp]);
    return res;
  }

  /** Bytes of the KV cache this rank would hold to generate `batch` sequences of `capacity` positions. */
  cacheBytes(batch: number, capacity: number): number {
    const [lo, hi] = replicaRows(batch, this.layout.dp, this.coords.dp);
    return kvCacheBytes((hi - lo) * this.localKvHeads, this.arch.headSize, capacity, this.layers.length);
  }

  /**
   * Samples responses for this replica's prompts: the prompts in one pass, then one position per
   * step, with each layer's keys and values cached (this rank's heads, this stage's layers, this
   * replica's rows). A row stops at its first `eos` (the positions after it are `eos` again, with
   * log-probability 0) or at `responseLen`; once every row of the replica has stopped, so does
   * the decoding. `cache: false` runs the whole prefix again for every token instead (what the
   * generation benchmark compares with; same tokens). The last stage samples; earlier stages get
   * each new token from it. Speaking ranks return their rows' tokens and log-probabilities.
   */
  async generate(group: string, prompts: Int32Array, batch: number, promptLen: number, responseLen: number, seeds: Uint32Array, opts: GenerateOptions) {
    const { eos, cache = true } = opts;
    const bad = samplingProblem(opts);
    if (bad) throw new ShardError(bad);
    const [lo, hi] = replicaRows(batch, this.layout.dp, this.coords.dp);
    const b = hi - lo;
    const width = promptLen + responseLen;
    if (width > this.spec.context) throw new ShardError(`a prompt of ${promptLen} and a response of ${responseLen} tokens exceed the context of ${this.spec.context}`);
    if (eos !== undefined && !(Number.isInteger(eos) && eos >= 0 && eos < this.spec.vocab))
      throw new ShardError(`the end-of-sequence token ${eos} is not a token of a vocabulary of ${this.spec.vocab}`);
    if (cache) {
      const problem = kvCacheProblem(this.cacheBytes(batch, width), opts.memoryBytes);
      if (problem) throw new ShardError(`generating ${b} sequences of ${promptLen} + ${responseLen} tokens: ${problem}`);
    }
    const tokens = new Int32Array(b * width);
    for (let i = 0; i < b; i++) tokens.set(prompts.subarray((lo + i) * promptLen, (lo + i + 1) * promptLen), i * width);
    const rngs = Array.from(seeds.subarray(lo, hi), (s) => new Rng(s));
    const kv = cache ? new KvCache(b * this.localKvHeads, this.arch.headSize, width) : undefined;
    const pads = this.padsOf(tokens, b, width, promptLen);
    // With the cache, the rows it holds (by index in this replica's batch): once half of them have
    // ended, the cache keeps only the others, and each step decodes those alone. Every rank of the
    // replica sees the same tokens, so they all shrink alike; a row's arithmetic is the same in any
    // batch (tested: engine/model/batch-invariance.test.ts), so its tokens are too.
    let live = Int32Array.from({ length: b }, (_, i) => i);
    let livePads = pads;
    /** The logits [live rows, V] that predict position `len` (last stage), from the tokens up to it. */
    const logitsAt = async (t: number, len: number, next?: Int32Array): Promise<tf.Tensor | undefined> => {
      if (kv) return this.decodeStage(group, `gen/${t}`, next ?? prompts.subarray(lo * promptLen, hi * promptLen), live.length, next ? 1 : promptLen, next ? len - 1 : 0, kv, livePads);
      const prefix = new Int32Array(b * len);
      for (let i = 0; i < b; i++) prefix.set(tokens.subarray(i * width, i * width + len), i * len);
      const { out } = await this.forwardStage(group, `gen/${t}`, prefix, b, len, false, pads);
      if (!out) return undefined;
      const last = tf.tidy(() => tf.reshape(tf.slice(out, [0, len - 1, 0], [b, 1, this.spec.vocab]), [b, this.spec.vocab]));
      out.dispose();
      return last;
    };
    const done = new Uint8Array(b);
    let finished = 0;
    let steps = 0;
    let logits: tf.Tensor | undefined;
    // The weights do not change during the call: a tied head's transpose is made once for it.
    await this.syncTiedHead(group, 'gen');
    if (isTied(this.spec) && this.last) this.headT = tf.transpose(this.headEmbedding);
    const dropHeadT = () => {
      this.headT?.dispose();
      this.headT = undefined;
    };
    try {
      logits = await logitsAt(0, promptLen);
      for (let t = 0; t < responseLen; t++) {
        await yieldToLoop();
        steps += 1;
        let next: Int32Array;
        if (this.last) {
          const values = logits!.dataSync() as Float32Array;
          logits!.dispose();
          logits = undefined;
          next = new Int32Array(live.length);
          for (let j = 0; j < live.length; j++) {
            const i = live[j]!;
            // A finished row draws nothing more: its stream stays where its response ended.
            next[j] = done[i] ? eos! : sampleToken(values.subarray(j * this.spec.vocab, (j + 1) * this.spec.vocab), opts, opts.greedy ? 0 : rngs[i]!.uniform());
          }
          // Earlier stages of this replica, same tensor rank, need the new tokens for the next step.
          for (let s = 0; s < this.layout.pp - 1; s++) {
            this.comm.send(group, this.layout.devices[rankOf(this.layout, { ...this.coords, pp: s })]!, `gen/${t}/tok`, next);
          }
        } else {
          const fromLast = this.layout.devices[rankOf(this.layout, { ...this.coords, pp: this.layout.pp - 1 })]!;
          next = (await this.comm.recv(group, fromLast, `gen/${t}/tok`)) as Int32Array;
        }
        for (let j = 0; j < live.length; j++) {
          const i = live[j]!;
          tokens[i * width + promptLen + t] = next[j]!;
          if (!done[i] && next[j] === eos) {
            done[i] = 1;
            finished += 1;
          }
        }
        // Every rank of the replica sees the same tokens, so they all stop at the same step.
        if (finished === b) {
          for (let i = 0; i < b; i++) tokens.fill(eos!, i * width + promptLen + t + 1, (i + 1) * width);
          break;
        }
        if (kv && b - finished <= live.length / 2) {
          const keep = Int32Array.from(live.keys()).filter((j) => !done[live[j]!]);
          // A row that leaves has ended: its stream stays at the end token.
          for (const i of live) if (done[i]) tokens.fill(eos!, i * width + promptLen + t + 1, (i + 1) * width);
          kv.keep(keep, this.localKvHeads);
          next = Int32Array.from(keep, (j) => next[j]!);
          livePads = livePads ? Int32Array.from(keep, (j) => livePads![j]!) : undefined;
          live = Int32Array.from(keep, (j) => live[j]!);
        }
        logits = t + 1 < responseLen ? await logitsAt(t + 1, promptLen + t + 1, next) : undefined;
      }
    } catch (e) {
      // A call that fails here (abandoned by a reset) must not leave the transpose for later calls.
      dropHeadT();
      throw e;
    } finally {
      logits?.dispose();
      kv?.dispose();
    }
    // Log-probabilities of the sampled tokens, as training will compute them; 0 after each end.
    let logprobs: Float32Array | undefined;
    try {
      logprobs = await this.sequenceLogprobs(group, 'gen/logp', tokens, b, promptLen, eos, pads, this.speaks);
    } finally {
      dropHeadT();
    }
    if (!logprobs) return { tokens: new Int32Array(0), logprobs: new Float32Array(0), steps };
    /** `steps`: the positions decoded (fewer than `responseLen` when every row ended early). */
    return { tokens, logprobs, steps };
  }

  /** A reward model's score of each whole sequence: the value head after its last token, [b] per replica (speaking ranks). */
  async sequenceScores(group: string, tokens: Int32Array, batch: number): Promise<Float32Array> {
    this.expect('value', 'sequence scores');
    const T = tokens.length / batch;
    const [lo, hi] = replicaRows(batch, this.layout.dp, this.coords.dp);
    const mine = tokens.subarray(lo * T, hi * T);
    const { out } = await this.forwardStage(group, 'score', mine, hi - lo, T, false, this.padsOf(mine, hi - lo, T, T - 1));
    if (!out) return new Float32Array(0);
    const t = tf.tidy(() => lastValuesOf(out));
    out.dispose();
    const res = (t.dataSync() as Float32Array).slice();
    t.dispose();
    return this.speaks ? res : new Float32Array(0);
  }

  /**
   * A reward model from preference pairs, by the Bradley–Terry loss −log σ(r(chosen) − r(rejected))
   * over seeded mini-batches of pairs, with an optimizer of its own (as the warm-up has). Returns
   * the first and last losses and the share of pairs ordered rightly after training.
   */
  async preference(group: string, chosen: Int32Array, rejected: Int32Array, batch: number, steps: number, minibatch: number, lr: number, seed: number) {
    this.expect('value', 'preference training');
    if (!this.optim) throw new ShardError('this shard holds no optimizer: it is not on the training layout');
    const width = chosen.length / batch;
    const both = new Int32Array(chosen.length + rejected.length);
    both.set(chosen, 0);
    both.set(rejected, chosen.length);
    const optimizer = new Adam(lr, this.optim.beta1, this.optim.beta2, this.optim.eps);
    let first = 0;
    let loss = 0;
    for (let step = 0; step < steps; step++) {
      await yieldToLoop();
      const rows = new Rng(seedOf(seed, Stream.shuffle, step)).permutation(batch).slice(0, Math.min(minibatch, batch));
      const st = await this.step(group, `pref/${step}`, { kind: 'preference', items: batch }, both, width, rows, 0, optimizer);
      if (step === 0) first = st.loss;
      loss = st.loss;
    }
    optimizer.dispose();
    const scores = await this.sequenceScores(`${group}/acc`, both, 2 * batch);
    let right = 0;
    for (let b = 0; b < batch; b++) if (scores[b]! > scores[batch + b]!) right += 1;
    return { loss, first_loss: first, accuracy: right / batch };
  }

  private expect(kind: GptSpec['kind'], what: string) {
    if (this.spec.kind !== kind) throw new ShardError(`${what} needs a ${kind} model; this shard is a ${this.spec.kind} model`);
  }

  /** Supervised steps on demonstrations, with a warm-up optimizer of its own; a response counts up to its first `eos`, or where `given` is 1. */
  async sft(group: string, tokens: Int32Array, batch: number, promptLen: number, steps: number, minibatch: number, lr: number, seed: number, eos?: number, given?: Float32Array) {
    if (!this.optim) throw new ShardError('this shard holds no optimizer: it is not on the training layout');
    const width = tokens.length / batch;
    const mask = given ?? (eos === undefined ? undefined : responseMask(tokens, promptLen, width - promptLen, eos));
    const optimizer = new Adam(lr, this.optim.beta1, this.optim.beta2, this.optim.eps);
    let first = 0;
    let loss = 0;
    for (let step = 0; step < steps; step++) {
      await yieldToLoop();
      const rows = new Rng(seedOf(seed, Stream.shuffle, step)).permutation(batch).slice(0, Math.min(minibatch, batch));
      const st = await this.step(group, `sft/${step}`, { kind: 'sft', ...(mask ? { mask } : {}) }, tokens, width, rows, promptLen, optimizer);
      if (step === 0) first = st.loss;
      loss = st.loss;
    }
    optimizer.dispose();
    return { loss, first_loss: first };
  }

  /** Epochs of the named loss over seeded mini-batches; the same items and order as the unsharded model. */
  async train(
    group: string,
    tokens: Int32Array,
    batch: number,
    promptLen: number,
    responseLen: number,
    loss: LossSpec,
    data: Record<string, Float32Array>,
    epochs: number,
    minibatches: number,
    seed: number,
  ): Promise<TrainStats> {
    const fn = lossOf(loss.name);
    if (fn.head !== this.spec.kind) throw new ShardError(`the loss '${loss.name}' needs a ${fn.head} model; this shard is a ${this.spec.kind} model`);
    const params = lossParams(fn, loss.params);
    const width = promptLen + responseLen;
    // Speaking ranks return their replica's share of each mini-batch's loss and statistics; the caller sums them.
    return trainEpochs(batch / fn.rowsPerItem, epochs, minibatches, seed, (items, tag) => this.step(group, tag, { kind: 'loss', fn, params, data, responseLen }, tokens, width, items, promptLen));
  }

  /** The head's prediction a loss reads, from the last stage's output: response log-probs or values. */
  private predict(fn: Loss, out: tf.Tensor, tokens: tf.Tensor2D, promptLen: number): tf.Tensor {
    return fn.head === 'policy' ? logprobsOf(out, tokens, promptLen, this.spec.vocab) : valuesOf(out, promptLen);
  }

  /**
   * One optimizer step over mini-batch `rows`: forward through the pipeline, the loss on the last
   * stage, backward through the pipeline, gradient all-reduce across replicas, global-norm
   * clipping, Adam. Returns the mini-batch loss and clipped-token count (speaking ranks' share).
   */
  private async step(
    group: string,
    tag: string,
    objective: Objective,
    tokens: Int32Array,
    width: number,
    rows: number[],
    promptLen: number,
    optimizer?: Adam,
  ): Promise<{ loss: number; stats: Record<string, number>; gradNorm: number }> {
    const opt = optimizer ?? this.weights.optimizer;
    if (!opt || !this.optim) throw new ShardError('this shard holds no optimizer: it is not on the training layout');
    const R = width - promptLen;
    // Replicas split the mini-batch's items; a loss over pairs takes both rows of each of its items.
    const [lo, hi] = replicaRows(rows.length, this.layout.dp, this.coords.dp);
    const perItem = objective.kind === 'loss' ? objective.fn.rowsPerItem : objective.kind === 'preference' ? 2 : 1;
    // The call's items, from its rows (a loss need read no port at all).
    const items = objective.kind === 'loss' ? tokens.length / width / perItem : objective.kind === 'preference' ? objective.items : 0;
    const mine = perItem === 1 ? rows.slice(lo, hi) : itemRows(rows.slice(lo, hi), items, perItem);
    const b = mine.length;
    const share = (hi - lo) / rows.length; // this replica's part of the mini-batch mean
    // Losses over tokens divide by the whole mini-batch's real tokens and rows, whichever replica holds them.
    const allRows = perItem === 1 ? rows : itemRows(rows, items, perItem);
    const maskAll = objective.kind === 'loss' ? objective.data.mask : objective.kind === 'sft' ? objective.mask : undefined;
    const norm: LossNorm = { tokens: maskAll ? allRows.reduce((n, r) => n + maskAll.subarray(r * R, (r + 1) * R).reduce((a, m) => a + m, 0), 0) : allRows.length * R, rows: allRows.length };
    const myTokens = pickRows(tokens, width, mine);
    // Whole sequences (preference pairs) have no prompt length: their padding is what leads them.
    const pads = this.padsOf(myTokens, b, width, promptLen > 0 ? promptLen : width - 1);
    const fwd = await this.forwardStage(group, `${tag}/f`, myTokens, b, width, true, pads);
    // With adapters, a loss trains them (and a value model's head) alone; the warm-up and
    // preference training, which stand for the base's own training, train the base alone.
    const trainable = (name: string) => (objective.kind === 'loss' ? trains(this.spec, name) : !isAdapter(name));
    const frozen = objective.kind === 'loss' && this.spec.lora !== undefined;
    const grads = new Map<string, tf.Tensor>();
    const add = (name: string, g: tf.Tensor) => {
      if (!trainable(name)) {
        g.dispose();
        return;
      }
      const prev = grads.get(name);
      grads.set(name, prev ? tf.add(prev, g) : g);
      if (prev) tf.dispose([prev, g]);
    };
    let loss = 0;
    let stats: Record<string, number> = {};
    let dx: tf.Tensor; // the gradient of the residual stream, rows [b·width, D]
    if (this.last) {
      const tokensT = fwd.tokensT ?? tf.tensor2d(myTokens, [b, width], 'int32');
      const ports = objective.kind === 'loss' ? [...objective.fn.ports(objective.params), ...(maskAll ? ['mask'] : [])] : [];
      const data = objective.kind === 'loss' ? Object.fromEntries(ports.map((port) => [port, tf.tensor2d(pickRows(objective.data[port]!, R, mine), [b, R])])) : {};
      const sftMask = objective.kind === 'sft' && maskAll ? tf.tensor2d(pickRows(maskAll, R, mine), [b, R]) : undefined;
      // The loss's statistics, kept out of the gradient computation's scope to be read after it.
      let statTensors: Record<string, tf.Scalar> = {};
      const lossOf = (out: tf.Tensor): tf.Scalar => {
        if (objective.kind === 'sft') {
          const lp = logprobsOf(out, tokensT, promptLen, this.spec.vocab);
          return tf.div(tf.neg(tf.sum(sftMask ? tf.mul(lp, sftMask) : lp)), Math.max(norm.tokens, 1)) as tf.Scalar;
        }
        if (objective.kind === 'preference') {
          const v = lastValuesOf(out); // [2n]: chosen, then rejected
          const n = v.shape[0]! / 2;
          return tf.mul(preferenceLoss(tf.slice(v, [0], [n]), tf.slice(v, [n], [n])), share) as tf.Scalar;
        }
        const ev = evaluateLoss(objective.fn, this.predict(objective.fn, out, tokensT, promptLen), data, objective.params, norm);
        statTensors = ev.stats;
        for (const t of Object.values(statTensors)) tf.keep(t);
        return ev.loss;
      };
      // Automatic differentiation only for the loss itself (elementwise work on the head's output);
      // the head and the layers below run the written-out backward passes.
      let vg: { value: tf.Scalar; grads: tf.Tensor[] };
      try {
        vg = tf.valueAndGrads(lossOf)([fwd.out!]);
      } catch (e) {
        // A loss whose value does not depend on the prediction, or that throws: the loss's fault, every time.
        if (objective.kind !== 'loss' || e instanceof LossError) throw e;
        throw new LossError(`the loss '${objective.fn.name}' has no gradient: ${(e as Error).message}`, { cause: e });
      }
      const { value, grads: g } = vg;
      loss = value.dataSync()[0]!;
      if (objective.kind === 'loss') {
        // Read before anything moves: a loss that is not finite is refused, the weights untouched.
        stats = Object.fromEntries(Object.entries(statTensors).map(([k, t]) => [k, t.dataSync()[0]!]));
        tf.dispose(Object.values(statTensors));
        try {
          checkedValue(objective.fn, loss, `on mini-batch ${tag}`);
        } catch (e) {
          tf.dispose([value, g[0]!, fwd.out!, ...Object.values(data)]);
          for (const c of fwd.saved) disposeLayerCache(c);
          throw e;
        }
      }
      const head = fwd.head!;
      const tied = isTied(this.spec);
      const gh: { dx: tf.Tensor; dw?: tf.Tensor; db?: tf.Tensor } = tf.tidy(() => {
        const dy = tf.reshape(g[0]!, [b * width, -1]);
        if (!tied) return linearBackward(head.y, this.weights.get('head.w'), dy, { frozen: !trainable('head.w') });
        // logits = y·wteᵀ: dy·wte back into the rows, dyᵀ·y into the embedding.
        return { dx: tf.matMul(dy as tf.Tensor2D, this.headEmbedding as tf.Tensor2D), ...(trainable('wte') ? { dw: weightGrad(dy, head.y) } : {}) };
      });
      if (this.tiedCopy && gh.dw) {
        // The embedding is the first stage's: its gradient from the head goes there.
        this.sendTensor(group, this.firstOfReplica, `${tag}/dwte`, gh.dw);
        gh.dw.dispose();
      } else if (gh.dw) add(tied ? 'wte' : 'head.w', gh.dw);
      if (gh.db && this.gpt2) add('head.b', gh.db);
      else gh.db?.dispose();
      dx = this.normBackward('lnf', head.ln, gh.dx, add);
      tf.dispose([value, g[0]!, gh.dx, head.y, ...Object.values(head.ln)]);
      tf.dispose([fwd.out!, ...Object.values(data), ...(sftMask ? [sftMask] : [])]);
      if (!fwd.tokensT) tokensT.dispose();
    } else {
      dx = await this.recvTensor(group, this.next!, `${tag}/grad`, [b * width, this.spec.width]);
    }
    // Backward through this stage's layers, last first.
    for (let i = this.layers.length - 1; i >= 0; i--) {
      const l = this.layers[i]!;
      const c = fwd.saved[i]!;
      const W = (n: string) => this.weights.get(`h${l}.${n}`);
      // MLP: x2 = x1 + Σtp M(h2) (+ b2), h2 = N2(x1)
      const ad = this.adapters.mlp(l);
      if (this.gpt2 && !frozen) add(`h${l}.mlp.b2`, sumRows(dx));
      const gm = this.gpt2 ? mlpBackward(c.mlp as MlpCache, W('mlp.w1'), W('mlp.w2'), dx, ad, frozen) : swigluBackward(c.mlp as GluCache, W('mlp.w1'), W('mlp.w3'), W('mlp.w2'), dx, ad, frozen);
      for (const [n, t] of Object.entries(gm.grads)) add(`h${l}.mlp.${n}`, t);
      for (const [n, t] of Object.entries(gm.adapters)) add(n, t);
      const dh2 = await this.allReduceTp(group, `${tag}/b/l${l}/mlp`, gm.dh);
      const dn2 = this.normBackward(`h${l}.ln2`, c.ln2, dh2, add);
      const dx1 = tf.add(dx, dn2);
      tf.dispose([dh2, dn2, dx]);
      // Attention: x1 = x + Σtp A(h1) (+ bo), h1 = N1(x)
      if (this.gpt2 && !frozen) add(`h${l}.attn.bo`, sumRows(dx1));
      const ga = attentionBackward(c.attn, this.attn(l), fwd.dims, dx1, frozen);
      for (const [n, t] of Object.entries(ga.grads)) add(`h${l}.attn.${n}`, t);
      for (const [n, t] of Object.entries(ga.adapters)) add(n, t);
      const dh1 = await this.allReduceTp(group, `${tag}/b/l${l}/attn`, ga.dh);
      const dn1 = this.normBackward(`h${l}.ln1`, c.ln1, dh1, add);
      dx = tf.add(dx1, dn1);
      tf.dispose([dh1, dn1, dx1]);
      disposeLayerCache(c);
    }
    disposeRope(fwd.dims);
    if (this.first && !trainable('wte')) tf.dispose([dx, fwd.tokensT!]);
    else if (this.first) {
      const ge = embedBackward(myTokens, width, this.spec.vocab, this.gpt2 ? this.spec.context : undefined, dx, pads);
      if (this.tiedCopy) add('wte', await this.recvTensor(group, this.lastOfReplica, `${tag}/dwte`, [this.spec.vocab, this.spec.width]));
      add('wte', ge.dwte);
      if (ge.dwpe) add('wpe', ge.dwpe);
      tf.dispose([dx, fwd.tokensT!]);
    } else {
      this.sendTensor(group, this.prev!, `${tag}/grad`, dx);
      dx.dispose();
    }
    // Summed over the ranks that share them, the global norm, the clipping (gradients.ts).
    const groups = { tp: this.tpGroup, dp: this.dpGroup, mp: this.mpGroup, tpRank: this.coords.tp };
    const { names, gradNorm, scale } = await reduceGradients(this.comm, group, tag, { slices: this.weights.slices, trainable, grads, groups, clipNorm: this.optim.clipNorm });
    const list = names.map((n) => ({ name: n, variable: this.weights.get(n), gradient: scale === 1 ? grads.get(n)! : tf.mul(grads.get(n)!, scale) }));
    opt.apply(list);
    this.headStale = true; // wte moved (on the first stage): a tied head's copy is sent again before it is read
    tf.dispose([...grads.values(), ...(scale === 1 ? [] : list.map((x) => x.gradient))]);
    // The loss and clip count are the speaking ranks' shares; the caller sums over replicas.
    return { loss: this.speaks ? loss : 0, stats: this.speaks ? stats : Object.fromEntries(Object.keys(stats).map((k) => [k, 0])), gradNorm };
  }
}
