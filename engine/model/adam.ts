// Adam, with its state in the open: the moments of every parameter and the step count can be
// read out and put back, so a checkpoint restores training exactly (the bias corrections are
// computed from the step count, not accumulated, so a restored run takes bit-identical steps).
import * as tf from '@tensorflow/tfjs';

export interface AdamState {
  step: number;
  moments: Array<{ name: string; m: Float32Array; v: Float32Array }>;
}

export class Adam {
  step = 0;
  private readonly m = new Map<string, tf.Variable>();
  private readonly v = new Map<string, tf.Variable>();

  constructor(
    readonly lr: number,
    readonly beta1: number,
    readonly beta2: number,
    readonly eps: number,
  ) {}

  private slot(slots: Map<string, tf.Variable>, name: string, like: tf.Variable): tf.Variable {
    let s = slots.get(name);
    if (!s) {
      const zeros = tf.zerosLike(like);
      slots.set(name, (s = tf.variable(zeros, false)));
      zeros.dispose();
    }
    return s;
  }

  /** One step: m ← β₁m + (1−β₁)g, v ← β₂v + (1−β₂)g², θ ← θ − lr·m̂/(√v̂ + ε), in the order given. */
  apply(updates: ReadonlyArray<{ name: string; variable: tf.Variable; gradient: tf.Tensor }>): void {
    this.step += 1;
    const c1 = 1 - this.beta1 ** this.step;
    const c2 = 1 - this.beta2 ** this.step;
    for (const { name, variable, gradient } of updates) {
      const m = this.slot(this.m, name, variable);
      const v = this.slot(this.v, name, variable);
      tf.tidy(() => {
        m.assign(tf.add(tf.mul(m, this.beta1), tf.mul(gradient, 1 - this.beta1)));
        v.assign(tf.add(tf.mul(v, this.beta2), tf.mul(tf.square(gradient), 1 - this.beta2)));
        variable.assign(tf.sub(variable, tf.div(tf.mul(m, this.lr / c1), tf.add(tf.sqrt(tf.div(v, c2)), this.eps))));
      });
    }
  }

  state(): AdamState {
    return {
      step: this.step,
      moments: [...this.m.keys()].map((name) => ({
        name,
        m: (this.m.get(name)!.dataSync() as Float32Array).slice(),
        v: (this.v.get(name)!.dataSync() as Float32Array).slice(),
      })),
    };
  }

  /** Puts a state back; `shapeOf` gives each parameter's shape. */
  load(state: AdamState, shapeOf: (name: string) => number[]): void {
    this.dispose();
    this.step = state.step;
    for (const { name, m, v } of state.moments) {
      const shape = shapeOf(name);
      for (const [slots, data] of [
        [this.m, m],
        [this.v, v],
      ] as const) {
        const t = tf.tensor(data, shape);
        slots.set(name, tf.variable(t, false));
        t.dispose();
      }
    }
  }

  dispose(): void {
    for (const s of [...this.m.values(), ...this.v.values()]) s.dispose();
    this.m.clear();
    this.v.clear();
  }
}
