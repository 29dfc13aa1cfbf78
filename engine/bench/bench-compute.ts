// The compute benchmark: how close the model's forward pass and training step come to what the
// backend does on a plain matrix product, in one run. The reference is the product of a
// 2048×256 by 256×1024 matrix (the shape of a width-256 model's MLP on 2048 tokens); the model is
// a 4-layer, width-256 GPT on 16 × 128 tokens, on one device and on a tp=2 layout (both ranks in
// this process over an in-memory bus, so the tp=2 figure shows what the sharded program costs
// on top of the arithmetic, not a speed-up). The machine is shared: the reference, the forward
// passes and the training steps are timed in interleaved rounds, and each figure is a median over
// the rounds, so that a slow spell weighs on all of them alike.
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

/**
 * Multiply-adds counted twice, as FLOP/s figures are: a forward pass of the GPT on `batch` rows of
 * `T` tokens. The embedding is a lookup and counts nothing.
 */
export function forwardFlops(spec: GptSpec, batch: number, T: number): number {
  const D = spec.width;
  const perLayer = 2 * batch * T * (3 * D * D + D * D + 8 * D * D) + 2 * 2 * batch * T * T * D; // QKV, out, MLP; scores and mixing
  const head = 2 * batch * T * D * (spec.kind === 'policy' ? spec.vocab : 1);
  return spec.layers * perLayer + head;
}

/** Seconds per call of each of `fs`: one warm-up call each, then `repeats` rounds calling each once; medians. */
async function timeRounds(repeats: number, fs: Array<() => Promise<unknown>>): Promise<number[]> {
  for (const f of fs) await f();
  const xs = fs.map(() => [] as number[]);
  for (let r = 0; r < repeats; r++) {
    for (const [i, f] of fs.entries()) {
      const t0 = performance.now();
      await f();
      xs[i]!.push((performance.now() - t0) / 1000);
    }
  }
  return xs.map((x) => median(x)!);
}

export async function computeBench(o: ComputeBenchOptions) {
  // The reference: a plain product, no transposes, on the backend in use.
  const [M, K, N] = [2048, 256, 1024];
  const a = tf.randomNormal([M, K], 0, 1, 'float32', 1);
  const b = tf.randomNormal([K, N], 0, 1, 'float32', 2);
  const matmul = async () => {
    const c = tf.matMul(a, b);
    c.dataSync();
    c.dispose();
  };

  const spec: GptSpec = { kind: 'policy', vocab: o.vocab, context: o.tokens, layers: o.layers, width: o.width, heads: o.heads };
  const P = o.tokens / 2;
  const R = o.tokens - P;
  const tokens = Int32Array.from({ length: o.batch * o.tokens }, (_, i) => (i * 7919) % o.vocab);
  const data = { old: new Float32Array(o.batch * R).fill(-Math.log(o.vocab)), advantages: Float32Array.from({ length: o.batch * R }, (_, i) => Math.sin(i)) };
  const loss: LossSpec = { name: 'clip_policy', params: { clip: 0.2 } };
  const optim = { lr: 1e-4, beta1: 0.9, beta2: 0.999, eps: 1e-8, clipNorm: 1 };
  const flops = forwardFlops(spec, o.batch, o.tokens);

  /** The model on `tp` ranks of one process: a forward pass and a training step, each a function to time. */
  const model = (tp: number) => {
    const bus = new MemoryBus();
    const subj = subjects(`compute-tp${tp}`);
    const layout = { devices: Array.from({ length: tp }, (_, i) => i), dp: 1, tp, pp: 1 };
    const comms = layout.devices.map((d) => new Comm(bus, subj, d));
    const ranks = layout.devices.map((_, rank) => new GptRank(spec, layout, rank, 1, optim, comms[rank]!));
    let n = 0;
    // Every rank of one call shares its group: that is how their collectives find each other.
    return {
      forward: () => {
        const group = `f${n++}`;
        return Promise.all(ranks.map((r) => r.infer(group, tokens, o.batch, P)));
      },
      train: () => {
        const group = `t${n++}`;
        return Promise.all(ranks.map((r) => r.train(group, tokens, o.batch, P, R, loss, data, 1, 1, 1)));
      },
      dispose: () => {
        for (const r of ranks) r.dispose();
        for (const c of comms) c.close();
      },
    };
  };
  const one = model(1);
  const two = model(2);
  let seconds: number[];
  try {
    seconds = await timeRounds(o.repeats, [matmul, one.forward, one.train, two.forward, two.train]);
  } finally {
    one.dispose();
    two.dispose();
    tf.dispose([a, b]);
  }
  const [matmulSeconds, oneForward, oneTrain, twoForward, twoTrain] = seconds as [number, number, number, number, number];
  const reference = (2 * M * K * N) / matmulSeconds / 1e9;
  o.log(`reference: ${M}×${K} by ${K}×${N} matrix product, ${reference.toFixed(2)} GFLOP/s (${(matmulSeconds * 1000).toFixed(1)} ms) on ${tf.getBackend()}`);
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
  const oneFig = figures({ forward: oneForward, train: oneTrain });
  o.log(
    `one device: forward ${oneFig.forward_gflops.toFixed(2)} GFLOP/s (${(100 * oneFig.forward_share).toFixed(0)}% of the reference), training step ${oneFig.train_gflops.toFixed(2)} GFLOP/s (${(100 * oneFig.train_share).toFixed(0)}%), step / forward ${oneFig.train_over_forward.toFixed(1)}×`,
  );
  const tp2 = figures({ forward: twoForward, train: twoTrain });
  o.log(
    `tp=2:       forward ${tp2.forward_gflops.toFixed(2)} GFLOP/s (${(100 * tp2.forward_share).toFixed(0)}%), training step ${tp2.train_gflops.toFixed(2)} GFLOP/s (${(100 * tp2.train_share).toFixed(0)}%)`,
  );
  return {
    backend: tf.getBackend(),
    model: { layers: o.layers, width: o.width, heads: o.heads, vocab: o.vocab, batch: o.batch, tokens: o.tokens, forward_gflop: flops / 1e9 },
    reference_gflops: reference,
    repeats: o.repeats,
    forward_gflops: oneFig.forward_gflops,
    train_gflops: oneFig.train_gflops,
    forward_share: oneFig.forward_share,
    train_share: oneFig.train_share,
    train_over_forward: oneFig.train_over_forward,
    tp2,
  };
}
