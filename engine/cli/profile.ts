// npm run profile [-- --out FILE]
// Fits the `local` device profile from timings of this machine's own worker processes: model
// calls of several sizes on one worker (their device-side times), small requests for the bus's
// latency, and a raw exchange between two workers for its bandwidth. The cost model's own
// formulas give each call's FLOPs and layer passes; a least-squares fit of the measured times on
// them gives the sustained FLOP/s, the cost per layer pass and the cost per call.
import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus, totalmem } from 'node:os';
import { dirname } from 'node:path';
import type { Layout } from '../../mesh/parallel/index.ts';
import { UsageError, args, runMain } from '../../actors/host.ts';
import { runExchange } from '../runtime/index.ts';
import { median } from '../runtime/index.ts';
import { localShape, type DeviceProfile } from '../runtime/index.ts';
import { callCost, type CallKind, type Workload } from '../runtime/index.ts';
import { LOCAL_PROFILE } from '../runtime/index.ts';
import { withWorkers } from './workers.ts';

const USAGE = 'usage: npm run profile [-- --out FILE] [--json]';

/** A call's features under the cost model: FLOPs (at 1 FLOP/s) and layer passes (at 1 s each). */
function features(kind: CallKind, shape: ReturnType<typeof localShape>, wl: Workload): [number, number] {
  const one: Layout = { devices: [0], dp: 1, tp: 1, pp: 1 };
  // trainFactor 1: a training call's features are those of its forward passes; its own factor is fitted apart.
  const base = {
    name: 'unit',
    memBandwidth: 1e30,
    memoryBytes: 1e15,
    intraBandwidth: 1e30,
    interBandwidth: 1e30,
    latency: 0,
    trainFactor: 1,
    trainPassFactor: 1,
    recomputeDecode: false, // generation decodes with a KV cache (engine/model/kv-cache.ts)
    source: 'fit',
  };
  const flops = callCost(shape, kind, one, wl, { ...base, flops: 1, layerOverhead: 0 }, 4, { owner: true, trainable: true }).compute;
  const passes = callCost(shape, kind, one, wl, { ...base, flops: 1e30, layerOverhead: 1 }, 4, { owner: true, trainable: true }).compute;
  return [flops, passes];
}

/** Least squares for t ≈ a·x + b·y + c (normal equations, 3×3). */
export function fit3(rows: Array<[number, number, number]>): [number, number, number] {
  const s = Array.from({ length: 3 }, () => new Array<number>(4).fill(0));
  for (const [x, y, t] of rows) {
    const v = [x, y, 1];
    for (let i = 0; i < 3; i++) {
      for (let j = 0; j < 3; j++) s[i]![j]! += v[i]! * v[j]!;
      s[i]![3]! += v[i]! * t;
    }
  }
  for (let i = 0; i < 3; i++) {
    const p = s[i]![i]!;
    for (let j = i; j < 4; j++) s[i]![j]! /= p;
    for (let k = 0; k < 3; k++) {
      if (k === i) continue;
      const f = s[k]![i]!;
      for (let j = i; j < 4; j++) s[k]![j]! -= f * s[i]![j]!;
    }
  }
  return [s[0]![3]!, s[1]![3]!, s[2]![3]!];
}

/** Least squares for t ≈ a·x + b·y (no intercept). */
export function fit2(rows: Array<[number, number, number]>): [number, number] {
  let xx = 0,
    xy = 0,
    yy = 0,
    xt = 0,
    yt = 0;
  for (const [x, y, t] of rows) {
    xx += x * x;
    xy += x * y;
    yy += y * y;
    xt += x * t;
    yt += y * t;
  }
  const det = xx * yy - xy * xy;
  return [(xt * yy - yt * xy) / det, (yt * xx - xt * xy) / det];
}

export async function profileLocal(log: (line: string) => void): Promise<DeviceProfile & { fit: object }> {
  return withWorkers(2, 'profile', async ({ nc, subj, d }) => {
    const timed = async <T>(f: () => Promise<T>) => {
      const before = d.stats();
      await f();
      const after = d.stats();
      return { device: after.device_seconds - before.device_seconds, trip: after.round_trip_seconds - before.round_trip_seconds };
    };
    // Compute: calls of several shapes and sizes on one worker.
    const rows: Array<[number, number, number]> = [];
    const trainRows: Array<[number, number, number]> = [];
    const samples: Array<{ shape: string; kind: CallKind; batch: number; seconds: number }> = [];
    const tripOverhead: number[] = [];
    for (const [layers, width] of [
      [1, 32],
      [2, 64],
      [4, 64],
      [2, 128],
    ] as const) {
      const shape = localShape('p', 11, layers, width, 4);
      const spec = { kind: 'policy' as const, vocab: 11, context: 9, layers, width, heads: 4 };
      await d.call(0, 'm', 0, {
        fn: 'load',
        role: 'actor',
        spec,
        layout: { devices: [0], dp: 1, tp: 1, pp: 1 },
        rank: 0,
        seed: 1,
        optim: { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, clipNorm: 1 },
      });
      for (const batch of [16, 64]) {
        const wl: Workload = { batch, promptLen: 5, responseLen: 4, epochs: 2, minibatches: 2 };
        const tokens = Int32Array.from({ length: batch * 9 }, (_, i) => i % 10);
        const body = { tokens, batch, promptLen: 5, responseLen: 4 };
        const calls: Array<[CallKind, () => Promise<unknown>]> = [
          ['inference', () => d.call(0, 'm', 0, { fn: 'inference', ...body })],
          [
            'train',
            () =>
              d.call(0, 'm', 0, {
                fn: 'train',
                ...body,
                seed: 1,
                epochs: 2,
                minibatches: 2,
                loss: { name: 'clip_policy', params: { clip: 0.2 } },
                data: { old: new Float32Array(batch * 4), advantages: new Float32Array(batch * 4).fill(0.1) },
              }),
          ],
          ['generate', () => d.call(0, 'm', 0, { fn: 'generate', prompts: tokens.subarray(0, batch * 5), batch, promptLen: 5, responseLen: 4, seeds: new Uint32Array(batch), temperature: 1 })],
        ];
        for (const [kind, call] of calls) {
          await call(); // warm
          const times = [];
          for (let r = 0; r < 3; r++) {
            const t = await timed(call);
            times.push(t.device);
            tripOverhead.push(t.trip - t.device);
          }
          const seconds = median(times)!;
          const [flops, passes] = features(kind, shape, wl);
          (kind === 'train' ? trainRows : rows).push([flops, passes, seconds]);
          samples.push({ shape: `${layers}x${width}`, kind, batch, seconds });
        }
      }
      await d.call(0, 'm', 0, { fn: 'release' });
    }
    // Forward work (inference, generation) fixes FLOP/s, the cost per layer pass and per call;
    // training then fits its factors over forward work: t ≈ u·a·F + v·b·P + w.
    let [a, b, c] = fit3(rows);
    if (c < 0) {
      // A negative cost per call means nothing; fit through zero instead.
      [a, b] = fit2(rows);
      c = 0;
    }
    const fwd = (x: number, y: number) => a * x + b * y;
    // The cost per call is shared with forward calls; training's factors explain the rest.
    const [u, v] = fit2(trainRows.map(([x, y, t]) => [a * x, b * y, t - c]));
    // The errors of the profile as it is saved.
    const residuals = [...rows.map(([x, y, t]) => Math.abs(fwd(x, y) + c - t) / t), ...trainRows.map(([x, y, t]) => Math.abs(u * a * x + v * b * y + c - t) / t)];
    log(
      `compute: ${(1 / a / 1e9).toFixed(2)} GFLOP/s sustained, ${(b * 1e6).toFixed(0)} µs per layer pass, ${(c * 1e3).toFixed(2)} ms per call; ` +
        `training: ${u.toFixed(1)}× the FLOP cost and ${v.toFixed(1)}× the per-layer cost of a forward pass; median fit error ${(100 * median(residuals)!).toFixed(1)}%`,
    );
    // The bus: small round trips, and raw bytes between the two workers.
    const pings: number[] = [];
    for (let i = 0; i < 30; i++) pings.push((await timed(() => d.call(1, '*', 0, { fn: 'stats' }))).trip);
    const latency = median(pings)! / 2;
    const bytes = 32 << 20;
    const t0 = performance.now();
    await runExchange<'probe'>(
      nc,
      subj,
      (dev, m, it, body) => d.call(dev, m, it, body),
      'bw',
      0,
      '*',
      [0, 1],
      (dev) => ({
        fn: 'probe',
        realloc: 'bw',
        sends: dev === 0 ? [{ transfer: 'bw-0', bytes }] : [],
        recvs: dev === 1 ? [{ transfer: 'bw-0', bytes }] : [],
        chunkBytes: nc.info?.max_payload ?? 1 << 20,
      }),
    );
    const bandwidth = bytes / ((performance.now() - t0) / 1000);
    log(`bus: ${(latency * 1e3).toFixed(2)} ms one way, ${(bandwidth / 1e6).toFixed(0)} MB/s between workers`);
    // Calls across two workers (tensor- and data-parallel): their collectives cost more than a
    // ping — each step encodes, crosses the bus, decodes and sums — so the cost of one collective
    // step is fitted to them: measured = prediction without it + α·(steps the model counts).
    const partial: DeviceProfile = {
      name: 'local',
      flops: 1 / a,
      memBandwidth: 1e30,
      memoryBytes: 1e15,
      intraBandwidth: bandwidth,
      interBandwidth: bandwidth,
      latency: 0,
      layerOverhead: Math.max(0, b),
      callOverhead: Math.max(0, c) + median(tripOverhead)!,
      trainFactor: u,
      trainPassFactor: v,
      recomputeDecode: false, // generation decodes with a KV cache (engine/model/kv-cache.ts)
      source: 'fit',
    };
    const alphaRows: Array<[number, number]> = []; // [collective steps, seconds left to explain]
    let g = 0; // groups name one call each: never reused
    const shape = localShape('p', 11, 2, 64, 4);
    const spec = { kind: 'policy' as const, vocab: 11, context: 9, layers: 2, width: 64, heads: 4 };
    for (const s of [
      { dp: 1, tp: 2, pp: 1 },
      { dp: 2, tp: 1, pp: 1 },
      { dp: 1, tp: 1, pp: 2 },
    ]) {
      const layout: Layout = { devices: [0, 1], ...s };
      const load = (rank: number) =>
        d.call(layout.devices[rank]!, 'mesh', 0, { fn: 'load', role: 'actor', spec, layout, rank, seed: 1, optim: { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, clipNorm: 1 } });
      await Promise.all([load(0), load(1)]);
      const batch = 64;
      const wl: Workload = { batch, promptLen: 5, responseLen: 4, epochs: 2, minibatches: 2 };
      const tokens = Int32Array.from({ length: batch * 9 }, (_, i) => i % 10);
      const body = { tokens, batch, promptLen: 5, responseLen: 4 };
      const both = async (make: () => Parameters<typeof d.call>[3]) => {
        const group = `profile-${g++}`;
        const t0 = performance.now();
        await Promise.all([0, 1].map((dev) => d.call(dev, 'mesh', 0, make(), group)));
        return (performance.now() - t0) / 1000;
      };
      for (const [kind, make] of [
        ['inference', () => ({ fn: 'inference', ...body })],
        [
          'train',
          () => ({
            fn: 'train',
            ...body,
            seed: 1,
            epochs: 2,
            minibatches: 2,
            loss: { name: 'clip_policy', params: { clip: 0.2 } },
            data: { old: new Float32Array(batch * 4), advantages: new Float32Array(batch * 4).fill(0.1) },
          }),
        ],
      ] as Array<[CallKind, () => Parameters<typeof d.call>[3]]>) {
        await both(make);
        const times = [await both(make), await both(make), await both(make)];
        const measured = median(times)!;
        const without = callCost(shape, kind, layout, wl, partial, 4, { owner: true, trainable: true }).seconds;
        const withOne = callCost(shape, kind, layout, wl, { ...partial, latency: 1 }, 4, { owner: true, trainable: true }).seconds;
        alphaRows.push([withOne - without, measured - without]);
      }
      await Promise.all([0, 1].map((dev) => d.call(dev, 'mesh', 0, { fn: 'release' })));
    }
    const stepCost = Math.max(latency, alphaRows.reduce((n, [x, y]) => n + x * y, 0) / alphaRows.reduce((n, [x]) => n + x * x, 0));
    log(`collectives: ${(stepCost * 1e3).toFixed(2)} ms per step, fitted to ${alphaRows.length} calls across two workers`);
    return {
      name: 'local',
      flops: 1 / a,
      memBandwidth: 1e30, // a worker's reads are not what bounds it; compute and overheads are
      memoryBytes: totalmem() / 4,
      intraBandwidth: bandwidth,
      interBandwidth: bandwidth,
      latency: stepCost,
      layerOverhead: Math.max(0, b),
      callOverhead: Math.max(0, c) + median(tripOverhead)!,
      trainFactor: u,
      trainPassFactor: v,
      recomputeDecode: false, // generation decodes with a KV cache (engine/model/kv-cache.ts)
      sharedCores: cpus().length,
      source: `npm run profile on ${new Date().toISOString()}: ${rows.length + trainRows.length} calls of 4 shapes on one worker, ${alphaRows.length} across two, a ping and a 32 MiB exchange`,
      fit: { samples, median_relative_error: median(residuals) },
    };
  });
}

if (import.meta.url === `file://${process.argv[1]}`) {
  runMain(async () => {
    const { values } = args(USAGE, { out: { type: 'string', default: LOCAL_PROFILE }, json: { type: 'boolean', default: false } });
    if (values.help) {
      console.log(USAGE);
      return 0;
    }
    if (!values.out) throw new UsageError(USAGE);
    const profile = await profileLocal(values.json ? () => {} : (l) => console.log(l));
    mkdirSync(dirname(values.out), { recursive: true });
    writeFileSync(values.out, `${JSON.stringify(profile, null, 2)}\n`);
    if (values.json) console.log(JSON.stringify(profile));
    else console.log(`wrote ${values.out}`);
    return 0;
  });
}
