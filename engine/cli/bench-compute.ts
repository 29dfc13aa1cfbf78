// The compute benchmark: how close the model's forward pass and training step come to what the
// backend does on a plain matrix product, in one run. The reference is the product of a
// 2048×256 by 256×1024 matrix (the shape of a width-256 model's MLP on 2048 tokens); the model is
// a 4-layer, width-256 GPT on 16 × 128 tokens, on one device and on a tp=2 layout (both ranks in
// this process over an in-memory bus, so the tp=2 figure shows what the sharded program costs
// on top of the arithmetic, not a speed-up).
import * as tf from '@tensorflow/tfjs';
import { Comm } from '../../mesh/parallel/index.ts';
import { MemoryBus, subjects, type LossSpec } from '../../mesh/wire/index.ts';
import { GptRank, type GptSpec } from '../model/index.ts';
import { median } from '../runtime/index.ts';

export interface ComputeBenchOptions {
  layers: number;
  width: number;
  heads: number;
  vocab: number;
  batch: number;
  tokens: number;
  repeats: number;
  log: (line: string) => void;
}

/** Multiply-adds counted twice, as FLOP/s figures are: a forward pass of the GPT on `batch` rows of `T` tokens. */
export function forwardFlops(spec: GptSpec, batch: number, T: number): number {
  const D = spec.width;
  const perLayer = 2 * batch * T * (3 * D * D + D * D + 8 * D * D) + 2 * 2 * batch * T * T * D; // QKV, out, MLP; scores and mixing
  const head = 2 * batch * T * D * (spec.kind === 'policy' ? spec.vocab : 1);
  const embed = 2 * batch * T * spec.vocab * D; // the one-hot matmul that serves as the lookup
  return spec.layers * perLayer + head + embed;
}

/** Seconds per run of `f`: the median of `repeats` after one warm-up. */
async function time(repeats: number, f: () => Promise<unknown>): Promise<number> {
  await f();
  const xs: number[] = [];
  for (let i = 0; i < repeats; i++) {
    const t0 = performance.now();
    await f();
    xs.push((performance.now() - t0) / 1000);
  }
  return median(xs)!;
}

export async function computeBench(o: ComputeBenchOptions) {
  // The reference: a plain product, no transposes, on the backend in use.
  const [M, K, N] = [2048, 256, 1024];
  const a = tf.randomNormal([M, K], 0, 1, 'float32', 1);
  const b = tf.randomNormal([K, N], 0, 1, 'float32', 2);
  const matmul = await time(o.repeats, async () => {
    const c = tf.matMul(a, b);
    c.dataSync();
    c.dispose();
  });
  tf.dispose([a, b]);
  const reference = (2 * M * K * N) / matmul / 1e9;
  o.log(`reference: ${M}×${K} by ${K}×${N} matrix product, ${reference.toFixed(2)} GFLOP/s (${(matmul * 1000).toFixed(1)} ms) on ${tf.getBackend()}`);

  const spec: GptSpec = { kind: 'policy', vocab: o.vocab, context: o.tokens, layers: o.layers, width: o.width, heads: o.heads };
  const P = o.tokens / 2;
  const R = o.tokens - P;
  const tokens = Int32Array.from({ length: o.batch * o.tokens }, (_, i) => (i * 7919) % o.vocab);
  const data = { old: new Float32Array(o.batch * R).fill(-Math.log(o.vocab)), advantages: Float32Array.from({ length: o.batch * R }, (_, i) => Math.sin(i)) };
  const loss: LossSpec = { name: 'clip_policy', params: { clip: 0.2 } };
  const optim = { lr: 1e-4, beta1: 0.9, beta2: 0.999, eps: 1e-8, clipNorm: 1 };
  const flops = forwardFlops(spec, o.batch, o.tokens);

  /** Forward and training-step seconds of the model on `tp` ranks of one process. */
  const measure = async (tp: number) => {
    const bus = new MemoryBus();
    const subj = subjects(`compute-tp${tp}`);
    const layout = { devices: Array.from({ length: tp }, (_, i) => i), dp: 1, tp, pp: 1 };
    const comms = layout.devices.map((d) => new Comm(bus, subj, d));
    const ranks = layout.devices.map((_, rank) => new GptRank(spec, layout, rank, 1, optim, comms[rank]!));
    let n = 0;
    try {
      // Every rank of one call shares its group: that is how their collectives find each other.
      const forward = await time(o.repeats, () => {
        const group = `f${n++}`;
        return Promise.all(ranks.map((r) => r.infer(group, tokens, o.batch, P)));
      });
      const train = await time(o.repeats, () => {
        const group = `t${n++}`;
        return Promise.all(ranks.map((r) => r.train(group, tokens, o.batch, P, R, loss, data, 1, 1, 1)));
      });
      return { forward, train };
    } finally {
      for (const r of ranks) r.dispose();
      for (const c of comms) c.close();
    }
  };
  const figures = (s: { forward: number; train: number }) => {
    const forward_gflops = flops / s.forward / 1e9;
    // A training step is counted as three forward passes (forward, and backward's two products).
    const train_gflops = (3 * flops) / s.train / 1e9;
    return {
      forward_seconds: s.forward,
      train_seconds: s.train,
      forward_gflops,
      train_gflops,
      forward_share: forward_gflops / reference,
      train_share: train_gflops / reference,
      train_over_forward: s.train / s.forward,
    };
  };
  const one = figures(await measure(1));
  o.log(
    `one device: forward ${one.forward_gflops.toFixed(2)} GFLOP/s (${(100 * one.forward_share).toFixed(0)}% of the reference), training step ${one.train_gflops.toFixed(2)} GFLOP/s (${(100 * one.train_share).toFixed(0)}%), step / forward ${one.train_over_forward.toFixed(1)}×`,
  );
  const tp2 = figures(await measure(2));
  o.log(
    `tp=2:       forward ${tp2.forward_gflops.toFixed(2)} GFLOP/s (${(100 * tp2.forward_share).toFixed(0)}%), training step ${tp2.train_gflops.toFixed(2)} GFLOP/s (${(100 * tp2.train_share).toFixed(0)}%)`,
  );
  return {
    backend: tf.getBackend(),
    model: { layers: o.layers, width: o.width, heads: o.heads, vocab: o.vocab, batch: o.batch, tokens: o.tokens, forward_gflop: flops / 1e9 },
    reference_gflops: reference,
    forward_gflops: one.forward_gflops,
    train_gflops: one.train_gflops,
    forward_share: one.forward_share,
    train_share: one.train_share,
    train_over_forward: one.train_over_forward,
    tp2,
  };
}
