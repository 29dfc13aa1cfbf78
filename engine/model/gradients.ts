// A training step's gradients once its backward pass has made them, on one rank: summed over the
// ranks that hold partial or replicated copies of them (in rank order, so repeated runs are
// bit-identical), measured by the global norm over the whole model, and clipped.
import * as tf from '@tensorflow/tfjs';
import type { Comm, Slice } from '../../mesh/parallel/index.ts';
import { isAdapter } from '../adapters/index.ts';

/** Sums the named gradients over `ranks` (in rank order), as one flat message, in place in `grads`. */
export async function allReduceNamed(comm: Comm, group: string, ranks: number[], tag: string, names: readonly string[], grads: Map<string, tf.Tensor>): Promise<void> {
  const flat = new Float32Array(names.reduce((n, name) => n + grads.get(name)!.size, 0));
  let at = 0;
  for (const n of names) {
    flat.set(grads.get(n)!.dataSync() as Float32Array, at);
    at += grads.get(n)!.size;
  }
  const sum = await comm.allReduce(group, ranks, tag, flat);
  at = 0;
  for (const n of names) {
    const g = grads.get(n)!;
    grads.set(n, tf.tensor(sum.subarray(at, at + g.size), g.shape));
    at += g.size;
    g.dispose();
  }
}

export interface RankGroups {
  /** This rank's tensor, data-parallel and model-parallel (pipeline × tensor) groups, devices in rank order. */
  tp: number[];
  dp: number[];
  mp: number[];
  /** This rank's tensor coordinate: replicated slices count on tensor rank 0 only. */
  tpRank: number;
}

/**
 * The gradients of `slices` that train, reduced: an adapter's half that every tensor rank holds
 * whole (A of a column-parallel matrix, B of a row-parallel one) has a partial gradient on each,
 * summed over the tensor group; every gradient then over the data-parallel replicas, one message a
 * replica. Then the global norm over the whole model (split slices count on every tensor rank,
 * replicated ones once, summed over the pipeline and tensor ranks) and the clipping scale.
 * Returns the trained names in parameter order, the norm and the scale; `grads` is reduced in place.
 */
export async function reduceGradients(
  comm: Comm,
  group: string,
  tag: string,
  o: { slices: readonly Slice[]; trainable: (name: string) => boolean; grads: Map<string, tf.Tensor>; groups: RankGroups; clipNorm: number },
): Promise<{ names: string[]; gradNorm: number; scale: number }> {
  const { slices, trainable, grads, groups } = o;
  const partial = slices.filter((x) => x.axis === null && isAdapter(x.name) && trainable(x.name)).map((x) => x.name);
  if (groups.tp.length > 1 && partial.length) await allReduceNamed(comm, group, groups.tp, `${tag}/tp-adapters`, partial, grads);
  const names = slices.map((s) => s.name).filter(trainable);
  if (groups.dp.length > 1) await allReduceNamed(comm, group, groups.dp, `${tag}/dp`, names, grads);
  let sq = 0;
  for (const s of slices) {
    if (!trainable(s.name)) continue;
    if (s.axis === null && groups.tpRank !== 0 && groups.tp.length > 1) continue;
    const t = tf.tidy(() => tf.sum(tf.square(grads.get(s.name)!)));
    sq += t.dataSync()[0]!;
    t.dispose();
  }
  const total = groups.mp.length > 1 ? (await comm.allReduce(group, groups.mp, `${tag}/norm`, new Float32Array([sq])))[0]! : sq;
  const gradNorm = Math.sqrt(total);
  const scale = o.clipNorm > 0 && gradNorm > o.clipNorm ? o.clipNorm / (gradNorm + 1e-6) : 1;
  return { names, gradNorm, scale };
}
