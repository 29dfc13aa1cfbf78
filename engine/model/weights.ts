// What one rank of a model holds: its slices of the parameters, as backend variables, and, on the
// training layout, its optimizer. Reading them out (checkpoints, reallocations), taking new ones
// in (restores, staged reallocations, checkpoints from Hugging Face) and the optimizer's state.
// The computation over them — forward, decoding, backward, with their collectives — is rank.ts.
import * as tf from '@tensorflow/tfjs';
import { cut, sliceShape, type Slice } from '../../mesh/parallel/index.ts';
import type { NamedTensor, Optim } from '../../mesh/wire/index.ts';
import { initialParameter } from './gpt.ts';
import { parameterShapes, type GptSpec } from './params.ts';
import { Adam, type AdamState } from './adam.ts';
import { Staging, hostView } from './backend/staging.ts';
import { ShardError, ownCopy } from './steps.ts';

let shardCount = 0;

export class ShardWeights {
  private readonly vars = new Map<string, tf.Variable>();
  private readonly prefix = `sharded${shardCount++}`;
  private adam: Adam | undefined;

  /**
   * `changed`: called whenever the weights are replaced (an import, a commit), as a rank's own
   * optimizer step does too: a tied head's copy must then be sent again.
   */
  constructor(
    private readonly spec: GptSpec,
    readonly slices: readonly Slice[],
    private readonly rank: number,
    private readonly optim: Optim | undefined,
    private readonly changed: () => void,
  ) {
    this.adam = this.freshOptimizer();
  }

  private freshOptimizer(): Adam | undefined {
    return this.optim ? new Adam(this.optim.lr, this.optim.beta1, this.optim.beta2, this.optim.eps) : undefined;
  }

  /** The optimizer, on the training layout. */
  get optimizer(): Adam | undefined {
    return this.adam;
  }

  get trainable(): boolean {
    return this.adam !== undefined;
  }

  private slice(name: string): Slice {
    const s = this.slices.find((x) => x.name === name);
    if (!s) throw new ShardError(`rank ${this.rank} holds no parameter '${name}'`);
    return s;
  }

  private create(s: Slice, data: Float32Array): tf.Variable {
    const value = tf.tensor(data, sliceShape(s));
    const v = tf.variable(value, true, `${this.prefix}/${s.name}`);
    value.dispose();
    this.vars.set(s.name, v);
    return v;
  }

  /** Draws the named parameters (this rank's slices of them) from the seed, as a new model starts. */
  seed(seed: number, names: readonly string[]): void {
    const shapes = new Map(parameterShapes(this.spec).map(([n, s], i) => [n, { shape: s, index: i }]));
    for (const name of names) {
      const s = this.slice(name);
      const { shape, index } = shapes.get(name)!;
      // Each parameter has its own random stream, so a rank draws only what it holds.
      this.create(s, cut(initialParameter(this.spec, seed, name, shape, index).data, { ...s, axis: null, start: 0, end: shape[0]! }, s));
    }
  }

  /** This rank's slice of a parameter; one never filled starts at zero. */
  get(name: string): tf.Variable {
    const v = this.vars.get(name);
    if (v) return v;
    const s = this.slice(name);
    return this.create(s, new Float32Array(sliceShape(s).reduce((a, b) => a * b, 1)));
  }

  exportTensors(): NamedTensor[] {
    return this.slices.map((s) => ({ name: s.name, shape: sliceShape(s), data: ownCopy(this.get(s.name)) }));
  }

  /** The parameters this rank holds (slices of them), in the canonical order. */
  parameterNames(): string[] {
    return this.slices.map((s) => s.name);
  }

  /** Whole parameters (a checkpoint's), cut to this rank's slices and taken as its weights. */
  importWhole(tensors: readonly NamedTensor[]): void {
    this.importTensors(
      tensors.map((t) => {
        const s = this.slice(t.name);
        return { name: t.name, shape: sliceShape(s), data: cut(t.data, { ...s, axis: null, start: 0, end: s.shape[0]! }, s) };
      }),
    );
  }

  /** One parameter (this shard's slice of it), copied out. */
  exportTensor(name: string): Float32Array {
    return ownCopy(this.get(name));
  }

  /**
   * One parameter (this shard's slice of it) to read at once: a view of the backend's own memory
   * where the backend keeps it in the host's reach (wasm, cpu), else a copy. A view is valid until
   * the backend next allocates (the wasm heap moves when it grows and an earlier view goes empty)
   * or the parameter changes: read it before either, or check `byteLength` first.
   */
  viewTensor(name: string): Float32Array {
    const v = this.get(name);
    return hostView(v) ?? ownCopy(v);
  }

  importTensors(tensors: readonly NamedTensor[]): void {
    for (const t of tensors) {
      const shape = sliceShape(this.slice(t.name));
      if (shape.join('x') !== t.shape.join('x') || t.data.length !== shape.reduce((a, b) => a * b, 1)) {
        throw new ShardError(`parameter '${t.name}': expected a slice of shape [${shape}], got [${t.shape}] with ${t.data.length} values`);
      }
    }
    for (const t of tensors) {
      const v = this.vars.get(t.name);
      if (!v) {
        this.create(this.slice(t.name), t.data);
        continue;
      }
      const value = tf.tensor(t.data, t.shape);
      v.assign(value);
      value.dispose();
    }
    this.replaced();
  }

  /** Fresh slices for `names`, to fill in place (a reallocation's receiver) and then `commit`. */
  stage(names: Iterable<string>): Staging {
    const shapes = new Map<string, number[]>();
    for (const name of names) shapes.set(name, sliceShape(this.slice(name)));
    return new Staging(shapes);
  }

  /**
   * Makes staged slices this rank's weights, as importTensors does (the optimizer starts afresh),
   * without a copy: each variable takes over the staged tensor's memory.
   */
  commit(staging: Staging): void {
    for (const [name, t] of staging.take()) {
      const v = this.vars.get(name);
      if (v) v.assign(t);
      else this.vars.set(name, tf.variable(t, true, `${this.prefix}/${name}`));
      t.dispose();
    }
    this.replaced();
  }

  /** New weights: the optimizer starts afresh, and whoever keeps a copy of them is told. */
  private replaced(): void {
    this.changed();
    this.adam?.dispose();
    this.adam = this.freshOptimizer();
  }

  /** The optimizer's state (moments and step), for a checkpoint; undefined off the training layout. */
  optimizerState(): AdamState | undefined {
    return this.adam?.state();
  }

  /** Puts an optimizer state back (after importTensors, which starts a fresh one). */
  loadOptimizerState(state: AdamState): void {
    if (!this.adam) throw new ShardError('this shard holds no optimizer: it is not on the training layout');
    this.adam.load(state, (name) => sliceShape(this.slice(name)));
  }

  dispose(): void {
    for (const v of this.vars.values()) v.dispose();
    this.adam?.dispose();
  }
}
