// What every training program of the model shares: seeded epochs over mini-batches, picking rows,
// copying a tensor out, and letting the event loop breathe between steps.
import * as tf from '@tensorflow/tfjs';
import { Rng, Stream, seedOf } from './rng.ts';

export class ShardError extends Error {
  override name = 'ShardError';
}

export interface TrainStats {
  loss: number;
  /** The loss's statistics (clip fraction and what else it reports), each as the loss is: the last epoch's mean. */
  stats: Record<string, number>;
  gradNorm: number;
}

/**
 * Lets the event loop run between steps: a long call must not silence the device's heartbeats
 * or keep it from answering "busy" to other callers.
 */
export const yieldToLoop = () => new Promise<void>((resolve) => setImmediate(resolve));

/**
 * A tensor's values as an array the caller owns. The cpu backend's dataSync() hands out the
 * tensor's own storage; the others already return a fresh copy, which is not copied again.
 */
export function ownCopy(t: tf.Tensor): Float32Array {
  const data = t.dataSync() as Float32Array;
  return tf.getBackend() === 'cpu' ? data.slice() : data;
}

/**
 * Epochs over seeded mini-batches of `batch` items, the same items in the same order wherever the
 * model lives: `step` trains on one mini-batch and returns its mean loss, its statistics (each a
 * mini-batch mean, as the loss) and the gradient norm. Returns the last epoch's loss and
 * statistics (means over its mini-batches, weighted by their items) and its last norm.
 */
export async function trainEpochs(
  batch: number,
  epochs: number,
  minibatches: number,
  seed: number,
  step: (rows: number[], tag: string) => Promise<{ loss: number; stats?: Record<string, number>; gradNorm: number }>,
): Promise<TrainStats> {
  const size = Math.ceil(batch / minibatches);
  let result: TrainStats = { loss: 0, stats: {}, gradNorm: 0 };
  for (let epoch = 0; epoch < epochs; epoch++) {
    const order = new Rng(seedOf(seed, Stream.shuffle, epoch)).permutation(batch);
    let lossSum = 0;
    const statSums: Record<string, number> = {};
    let norm = 0;
    for (let m = 0; m < minibatches; m++) {
      const rows = order.slice(m * size, (m + 1) * size);
      if (rows.length === 0) continue;
      await yieldToLoop();
      const st = await step(rows, `e${epoch}/m${m}`);
      lossSum += st.loss * rows.length;
      for (const [k, v] of Object.entries(st.stats ?? {})) statSums[k] = (statSums[k] ?? 0) + v * rows.length;
      norm = st.gradNorm;
    }
    result = { loss: lossSum / batch, stats: Object.fromEntries(Object.entries(statSums).map(([k, v]) => [k, v / batch])), gradNorm: norm };
  }
  return result;
}

/** Rows `rows` of a row-major array of rows `width` long, gathered in that order. */
export function pickRows<T extends Int32Array | Float32Array>(data: T, width: number, rows: readonly number[]): T {
  const out = new (data.constructor as { new (n: number): T })(rows.length * width);
  rows.forEach((r, i) => out.set(data.subarray(r * width, (r + 1) * width), i * width));
  return out;
}
