// The reference the model's programs are checked against: the whole GPT on one device, trained
// by TensorFlow.js's automatic differentiation (no layer-by-layer backward, no collectives). ferry
// runs GptRank everywhere, a one-device layout being its one-rank case; this class exists so that
// tests can compare GptRank, on every layout, with an independent computation of the same math.
import * as tf from '@tensorflow/tfjs';
import type { LossSpec, NamedTensor, Optim } from '../mesh/wire/index.ts';
import { isAdapter } from '../engine/adapters/index.ts';
import {
  Adam,
  argmax,
  masked,
  responseMask,
  forward,
  initialWeights,
  itemRows,
  lastValues,
  lossOf,
  lossParams,
  evaluateLoss,
  parameterShapes,
  pickRows,
  preferenceLoss,
  responseLogprobs,
  responseValues,
  Rng,
  sampleToken,
  seedOf,
  ShardError,
  Stream,
  trainEpochs,
  trains,
  yieldToLoop,
  ownCopy,
  type AdamState,
  type GptSpec,
  type Loss,
  type TrainStats,
  type Weights,
} from '../engine/model/index.ts';

/** A trainable variable holding `t`; the temporary tensor it was made from is freed. */
function toVariable(t: NamedTensor, name: string): tf.Variable {
  const value = tf.tensor(t.data, t.shape);
  const v = tf.variable(value, true, name);
  value.dispose();
  return v;
}

/** tfjs registers variables by a process-wide name, so every shard gets its own prefix. */
let shardCount = 0;

export class ReferenceGpt {
  private readonly vars: Map<string, tf.Variable>;
  private optimizer: Adam | undefined;
  private optim: Optim | undefined;

  /** `seed` draws the initial weights; without one they start at zero (a view to be filled). */
  constructor(
    readonly spec: GptSpec,
    seed: number | undefined,
    optim?: Optim,
  ) {
    this.prefix = `shard${shardCount++}`;
    this.shapes = new Map(parameterShapes(spec));
    // A view that a reallocation will fill holds nothing until then: no zeros to replace.
    const initial = seed === undefined ? [] : initialWeights(spec, seed);
    this.vars = new Map(initial.map((t) => [t.name, toVariable(t, `${this.prefix}/${t.name}`)]));
    this.setOptimizer(optim);
  }

  private readonly prefix: string;
  private readonly shapes: Map<string, number[]>;

  /** A parameter's variable; one never filled starts at zero. */
  private v(name: string): tf.Variable {
    let v = this.vars.get(name);
    if (!v) {
      const shape = this.shapes.get(name);
      if (!shape) throw new ShardError(`no parameter '${name}' in a ${this.spec.kind} model`);
      v = toVariable({ name, shape, data: new Float32Array(shape.reduce((a, b) => a * b, 1)) }, `${this.prefix}/${name}`);
      this.vars.set(name, v);
    }
    return v;
  }

  private setOptimizer(optim: Optim | undefined) {
    this.optimizer?.dispose();
    this.optim = optim;
    this.optimizer = optim ? new Adam(optim.lr, optim.beta1, optim.beta2, optim.eps) : undefined;
  }

  get trainable(): boolean {
    return this.optimizer !== undefined;
  }

  /** Every variable, in canonical order. */
  private weights(): Weights {
    return Object.fromEntries([...this.shapes.keys()].map((name) => [name, this.v(name)]));
  }

  /** The weights as plain arrays, in canonical order. */
  exportTensors(): NamedTensor[] {
    return [...this.shapes].map(([name, shape]) => ({ name, shape, data: ownCopy(this.v(name)) }));
  }

  /** One parameter (this shard's slice of it), copied out. */
  exportTensor(name: string): Float32Array {
    return ownCopy(this.v(name));
  }

  /**
   * Overwrites the named weights (all of them, or a subset such as the shared body). Shapes are
   * checked first, so a bad set changes nothing. A fresh optimizer state goes with new weights.
   */
  importTensors(tensors: readonly NamedTensor[]): void {
    for (const t of tensors) {
      const shape = this.shapes.get(t.name);
      if (!shape) throw new ShardError(`no parameter '${t.name}' in a ${this.spec.kind} model`);
      const size = shape.reduce((a, b) => a * b, 1);
      if (shape.join('x') !== t.shape.join('x')) {
        throw new ShardError(`parameter '${t.name}': expected shape [${shape}], got [${t.shape}]`);
      }
      if (t.data.length !== size) {
        throw new ShardError(`parameter '${t.name}': shape [${t.shape}] needs ${size} values, got ${t.data.length}`);
      }
    }
    for (const t of tensors) {
      const v = this.vars.get(t.name);
      if (!v) {
        this.vars.set(t.name, toVariable(t, `${this.prefix}/${t.name}`));
        continue;
      }
      // A variable keeps a reference to the data it is given; the temporary tensor is ours to free.
      const value = tf.tensor(t.data, t.shape);
      v.assign(value);
      value.dispose();
    }
    this.setOptimizer(this.optim);
  }

  /** The optimizer's state (moments and step), for a checkpoint; undefined off the training layout. */
  optimizerState(): AdamState | undefined {
    return this.optimizer?.state();
  }

  /** Puts an optimizer state back (after importTensors, which starts a fresh one). */
  loadOptimizerState(state: AdamState): void {
    if (!this.optimizer) throw new ShardError('this shard holds no optimizer: it is not on the training layout');
    this.optimizer.load(state, (name) => this.shapes.get(name)!);
  }

  dispose(): void {
    for (const v of this.vars.values()) v.dispose();
    this.optimizer?.dispose();
  }

  /**
   * Samples `responseLen` tokens after each prompt (or takes the likeliest, `greedy`); one seeded
   * stream per row. With `eos`, a row stops at its first end token and the rest is that token
   * again, with log-probability 0.
   */
  async generate(prompts: Int32Array, batch: number, promptLen: number, responseLen: number, seeds: Uint32Array, temperature: number, greedy = false, eos?: number) {
    this.expect('policy', 'generate');
    const width = promptLen + responseLen;
    const tokens = new Int32Array(batch * width);
    for (let b = 0; b < batch; b++) tokens.set(prompts.subarray(b * promptLen, (b + 1) * promptLen), b * width);
    const rngs = Array.from(seeds, (s) => new Rng(s));
    const done = new Array<boolean>(batch).fill(false);
    const w = this.weights();
    for (let t = 0; t < responseLen; t++) {
      await yieldToLoop();
      const len = promptLen + t;
      const prefix = new Int32Array(batch * len);
      for (let b = 0; b < batch; b++) prefix.set(tokens.subarray(b * width, b * width + len), b * len);
      const last = tf.tidy(() => {
        const out = forward(this.spec, w, tf.tensor2d(prefix, [batch, len], 'int32')); // [B, len, V]
        return tf.slice(out, [0, len - 1, 0], [batch, 1, this.spec.vocab]);
      });
      const logits = last.dataSync() as Float32Array;
      last.dispose();
      for (let b = 0; b < batch; b++) {
        const row = logits.subarray(b * this.spec.vocab, (b + 1) * this.spec.vocab);
        tokens[b * width + len] = done[b] ? eos! : greedy ? argmax(row) : sampleToken(row, temperature, rngs[b]!.uniform());
        if (tokens[b * width + len] === eos) done[b] = true;
      }
    }
    const logprobs = this.logprobs(tokens, batch, promptLen);
    return { tokens, logprobs: masked(logprobs, responseMask(tokens, promptLen, responseLen, eos)) };
  }

  /** Log-probabilities of the response tokens, row-major [batch, responseLen]. */
  logprobs(tokens: Int32Array, batch: number, promptLen: number): Float32Array {
    this.expect('policy', 'log-probabilities');
    const t = tf.tidy(() => responseLogprobs(this.spec, this.weights(), this.input(tokens, batch), promptLen));
    const out = t.dataSync() as Float32Array;
    t.dispose();
    return out;
  }

  /** Values before each response token, row-major [batch, responseLen]. */
  values(tokens: Int32Array, batch: number, promptLen: number): Float32Array {
    this.expect('value', 'values');
    const t = tf.tidy(() => responseValues(this.spec, this.weights(), this.input(tokens, batch), promptLen));
    const out = t.dataSync() as Float32Array;
    t.dispose();
    return out;
  }

  /** A reward model's score of each whole sequence: the value head after its last token. */
  sequenceScores(tokens: Int32Array, batch: number): Float32Array {
    this.expect('value', 'sequence scores');
    const t = tf.tidy(() => lastValues(this.spec, this.weights(), this.input(tokens, batch)));
    const out = t.dataSync() as Float32Array;
    t.dispose();
    return out;
  }

  /**
   * A reward model from preference pairs, by the Bradley–Terry loss −log σ(r(chosen) − r(rejected))
   * over seeded mini-batches, with an optimizer of its own (as the warm-up has). Returns the first
   * and last losses and the share of pairs ordered rightly after training.
   */
  async preference(chosen: Int32Array, rejected: Int32Array, batch: number, steps: number, minibatch: number, lr: number, seed: number) {
    this.expect('value', 'preference training');
    const width = chosen.length / batch;
    const losses = await this.ownSteps(batch, steps, minibatch, lr, seed, (rows) => {
      const c = tf.tensor2d(pickRows(chosen, width, rows), [rows.length, width], 'int32');
      const r = tf.tensor2d(pickRows(rejected, width, rows), [rows.length, width], 'int32');
      return { loss: () => preferenceLoss(lastValues(this.spec, this.weights(), c), lastValues(this.spec, this.weights(), r)), inputs: [c, r] };
    });
    const rc = this.sequenceScores(chosen, batch);
    const rr = this.sequenceScores(rejected, batch);
    let right = 0;
    for (let b = 0; b < batch; b++) if (rc[b]! > rr[b]!) right += 1;
    return { ...losses, accuracy: right / batch };
  }

  /** Supervised fine-tuning on whole demonstrations: cross-entropy of the response tokens. */
  async sft(tokens: Int32Array, batch: number, promptLen: number, steps: number, minibatch: number, lr: number, seed: number) {
    this.expect('policy', 'sft');
    const width = tokens.length / batch;
    return this.ownSteps(batch, steps, minibatch, lr, seed, (rows) => {
      const input = tf.tensor2d(pickRows(tokens, width, rows), [rows.length, width], 'int32');
      return { loss: () => tf.neg(tf.mean(responseLogprobs(this.spec, this.weights(), input, promptLen))) as tf.Scalar, inputs: [input] };
    });
  }

  /**
   * `steps` optimizer steps on seeded mini-batches of `batch` rows, with an Adam of their own (the
   * warm-up and a reward model's training leave the shard's own optimizer as it was). `prepare` turns a
   * mini-batch's rows into its loss and the input tensors to free after the step.
   */
  private async ownSteps(
    batch: number,
    steps: number,
    minibatch: number,
    lr: number,
    seed: number,
    prepare: (rows: number[]) => { loss: () => tf.Scalar; inputs: tf.Tensor[] },
  ): Promise<{ loss: number; first_loss: number }> {
    if (!this.optim) throw new ShardError('this shard holds no optimizer: it is not on the training layout');
    const losses: number[] = [];
    const optimizer = new Adam(lr, this.optim.beta1, this.optim.beta2, this.optim.eps);
    for (let step = 0; step < steps; step++) {
      await yieldToLoop();
      const rows = new Rng(seedOf(seed, Stream.shuffle, step)).permutation(batch).slice(0, Math.min(minibatch, batch));
      const { loss, inputs } = prepare(rows);
      losses.push(this.step(loss, optimizer).loss);
      tf.dispose(inputs);
    }
    optimizer.dispose();
    return { loss: losses.at(-1) ?? 0, first_loss: losses[0] ?? 0 };
  }

  /**
   * Epochs of the named loss over shuffled mini-batches. `data` holds the loss's per-token arrays
   * by port, row for row with `tokens` (for a loss over pairs: chosen rows, then rejected rows).
   */
  async train(
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
    this.expect(fn.head, `the loss '${loss.name}'`);
    const params = lossParams(fn, loss.params);
    const width = promptLen + responseLen;
    const items = batch / fn.rowsPerItem;
    const ports = [...fn.ports(params), ...(data.mask ? ['mask'] : [])];
    return trainEpochs(items, epochs, minibatches, seed, async (picked) => {
      const rows = itemRows(picked, items, fn.rowsPerItem);
      const mbTokens = tf.tensor2d(pickRows(tokens, width, rows), [rows.length, width], 'int32');
      const mbData = Object.fromEntries(ports.map((port) => [port, tf.tensor2d(pickRows(data[port]!, responseLen, rows), [rows.length, responseLen])]));
      let stats: Record<string, number> = {};
      const { loss: value, gradNorm } = this.step(
        () => {
          const ev = evaluateLoss(fn, this.predict(fn, mbTokens, promptLen), mbData, params);
          stats = Object.fromEntries(Object.entries(ev.stats).map(([k, t]) => [k, t.dataSync()[0]!]));
          return ev.loss;
        },
        this.optimizer,
        (name) => trains(this.spec, name),
      );
      tf.dispose([mbTokens, ...Object.values(mbData)]);
      return { loss: value, stats, gradNorm };
    });
  }

  /** The head's prediction a loss reads: response log-probs or values, [rows, R]. */
  private predict(fn: Loss, tokens: tf.Tensor2D, promptLen: number): tf.Tensor2D {
    return fn.head === 'policy' ? responseLogprobs(this.spec, this.weights(), tokens, promptLen) : responseValues(this.spec, this.weights(), tokens, promptLen);
  }

  /**
   * One optimizer step of the parameters that train (with adapters: a loss trains them and a value
   * model's head, the warm-up the base), the gradient clipped to the configured global norm.
   */
  private step(lossFn: () => tf.Scalar, optimizer = this.optimizer, trainable = (name: string) => !isAdapter(name)): { loss: number; gradNorm: number } {
    if (!optimizer || !this.optim) throw new ShardError('this shard holds no optimizer: it is not on the training layout');
    const params = [...this.shapes.keys()].filter(trainable);
    const all = this.weights();
    const varList = params.map((p) => all[p]!) as tf.Variable[];
    const { value, grads } = tf.variableGrads(lossFn, varList);
    const names = varList.map((v) => v.name);
    // Global norm with a fixed summation order (parameter order), so it is reproducible.
    const normT = tf.tidy(() => tf.sqrt(tf.addN(names.map((n) => tf.sum(tf.square(grads[n]!))))));
    const gradNorm = normT.dataSync()[0]!;
    const scale = this.optim.clipNorm > 0 && gradNorm > this.optim.clipNorm ? this.optim.clipNorm / (gradNorm + 1e-6) : 1;
    const scaled = scale === 1 ? grads : Object.fromEntries(names.map((n) => [n, tf.mul(grads[n]!, scale)]));
    optimizer.apply(params.map((param, i) => ({ name: param, variable: varList[i]!, gradient: scaled[names[i]!]! })));
    const loss = value.dataSync()[0]!;
    tf.dispose([value, normT, ...Object.values(grads), ...(scale === 1 ? [] : Object.values(scaled))]);
    return { loss, gradNorm };
  }

  private expect(kind: GptSpec['kind'], what: string) {
    if (this.spec.kind !== kind) throw new ShardError(`${what} needs a ${kind} model; this shard is a ${this.spec.kind} model`);
  }

  private input(tokens: Int32Array, batch: number): tf.Tensor2D {
    return tf.tensor2d(tokens, [batch, tokens.length / batch], 'int32');
  }
}
