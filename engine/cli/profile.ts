// npm run profile [-- --out FILE]
// Fits the `local` device profile from timings of this machine's own worker processes: model
// calls of several sizes on one worker (their device-side times), small requests for the bus's
// latency, and a raw exchange between two workers for its bandwidth. The cost model's own
// formulas give each call's FLOPs, layer passes and decoding steps; least-squares fits of the
// measured times on them give the sustained FLOP/s, the cost per layer pass and per call,
// training's factors over a forward pass, and a decoding step's fixed costs. Two calls at once
// against one alone give the slowdown of sharing the cores.
import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus, totalmem } from 'node:os';
import { dirname } from 'node:path';
import type { Layout } from '../../mesh/parallel/index.ts';
import { UsageError, args, runMain } from '../../actors/host.ts';
import { runExchange } from '../runtime/index.ts';
import { median } from '../runtime/index.ts';
import { localShape, type DeviceProfile, type ModelShape } from '../runtime/index.ts';
import { callCost, callLoad, segmentSpeed, type CallKind, type Workload } from '../runtime/index.ts';
import { LOCAL_PROFILE } from '../runtime/index.ts';
import { TRAINING_OPTIM, withWorkers, type Workers } from './workers.ts';
import { storeProbe } from './profile-store.ts';
import { envProbe } from './profile-env.ts';

const USAGE = 'usage: npm run profile [-- --out FILE] [--json]';

/** The unit profile: every rate infinite and every overhead 0, for reading a call's features off the cost model. */
const UNIT: DeviceProfile = {
  name: 'unit',
  flops: 1e30,
  memBandwidth: 1e30,
  memoryBytes: 1e15,
  intraBandwidth: 1e30,
  interBandwidth: 1e30,
  latency: 0,
  layerOverhead: 0,
  decodeLayerOverhead: 0,
  decodeStepOverhead: 0,
  trainFactor: 1, // a training call's features are those of its forward passes; its own factors are fitted apart
  trainPassFactor: 1,
  elementSeconds: 0,
  trainElementFactor: 1,
  recomputeDecode: false, // generation decodes with a KV cache (engine/model/kv-cache.ts)
  source: 'fit',
};

const ONE: Layout = { devices: [0], dp: 1, tp: 1, pp: 1 };

/** A call's time under `dev` on one device, by the cost model. */
function modelled(kind: CallKind, shape: ModelShape, wl: Workload, dev: DeviceProfile): number {
  return callCost(shape, kind, ONE, wl, dev, 4, { owner: true, trainable: true }).compute;
}

/**
 * A call's features under the cost model: its time when one of the profile's terms is 1 and the
 * rest are free. FLOPs (at 1 FLOP/s), layer passes, activation elements, decoding steps' layers
 * and decoding steps.
 */
function features(kind: CallKind, shape: ModelShape, wl: Workload) {
  return {
    flops: modelled(kind, shape, wl, { ...UNIT, flops: 1 }),
    passes: modelled(kind, shape, wl, { ...UNIT, layerOverhead: 1 }), // UNIT's decodeLayerOverhead 0 keeps decoding steps out
    elements: modelled(kind, shape, wl, { ...UNIT, elementSeconds: 1 }),
    decodeLayers: modelled(kind, shape, wl, { ...UNIT, decodeLayerOverhead: 1 }),
    decodeSteps: modelled(kind, shape, wl, { ...UNIT, decodeStepOverhead: 1 }),
  };
}

/** Least squares for t ≈ Σ βⱼ·xⱼ (normal equations, Gauss–Jordan with partial pivoting). */
export function leastSquares(rows: ReadonlyArray<{ x: readonly number[]; t: number }>): number[] {
  const n = rows[0]!.x.length;
  const s = Array.from({ length: n }, () => new Array<number>(n + 1).fill(0));
  for (const { x, t } of rows) {
    for (let i = 0; i < n; i++) {
      for (let j = 0; j < n; j++) s[i]![j]! += x[i]! * x[j]!;
      s[i]![n]! += x[i]! * t;
    }
  }
  for (let i = 0; i < n; i++) {
    let best = i;
    for (let k = i + 1; k < n; k++) if (Math.abs(s[k]![i]!) > Math.abs(s[best]![i]!)) best = k;
    [s[i], s[best]] = [s[best]!, s[i]!];
    const p = s[i]![i]!;
    if (p === 0) throw new Error(`least squares: feature ${i} is a combination of the others`);
    for (let j = i; j <= n; j++) s[i]![j]! /= p;
    for (let k = 0; k < n; k++) {
      if (k === i) continue;
      const f = s[k]![i]!;
      for (let j = i; j <= n; j++) s[k]![j]! -= f * s[i]![j]!;
    }
  }
  return s.map((r) => r[n]!);
}

/**
 * Least squares with every coefficient ≥ 0: a negative cost means nothing, so a term that comes
 * out negative is dropped (held at 0) and the rest fitted again.
 */
export function nonNegative(rows: ReadonlyArray<{ x: readonly number[]; t: number }>): number[] {
  const n = rows[0]!.x.length;
  // A feature that is 0 in every row says nothing: held at 0 from the start.
  const kept = Array.from({ length: n }, (_, i) => i).filter((i) => rows.some((r) => r.x[i] !== 0));
  while (kept.length > 0) {
    const beta = leastSquares(rows.map((r) => ({ x: kept.map((i) => r.x[i]!), t: r.t })));
    const worst = beta.reduce((w, b, i) => (b < (beta[w] ?? 0) ? i : w), -1);
    if (worst < 0 || beta[worst]! >= 0) {
      const out = new Array<number>(n).fill(0);
      kept.forEach((i, k) => {
        out[i] = beta[k]!;
      });
      return out;
    }
    kept.splice(worst, 1);
  }
  return new Array<number>(n).fill(0);
}

/** A clipped-policy training call over `body`'s sequences (`response` response tokens in all). */
function trainBody(body: { tokens: Int32Array; batch: number; promptLen: number; responseLen: number }, response: number, steps = { epochs: 2, minibatches: 2 }) {
  return {
    fn: 'train' as const,
    ...body,
    seed: 1,
    ...steps,
    loss: { name: 'clip_policy', params: { clip: 0.2 } },
    data: { old: new Float32Array(response), advantages: new Float32Array(response).fill(0.1) },
  };
}

/**
 * The speed probe: a fixed set of calls (a training step, an inference pass and a generation of
 * 25 tokens on a 2-layer, width-64 model, 64 rows) on one worker, the median of three after one
 * to warm up, in device seconds. Timed when a profile is fitted and again before a measured run,
 * its ratio says how much faster or slower the machine is now.
 */
export async function speedProbe(d: Workers['d'], device = 0): Promise<number> {
  const spec = { kind: 'policy' as const, vocab: 11, context: 28, layers: 2, width: 64, heads: 4 };
  const layout: Layout = { devices: [device], dp: 1, tp: 1, pp: 1 };
  await d.call(device, 'probe', 0, { fn: 'load', role: 'probe', spec, layout, rank: 0, seed: 1, optim: TRAINING_OPTIM });
  const batch = 64;
  const tokens = Int32Array.from({ length: batch * 28 }, (_, i) => i % 10);
  const body = { tokens, batch, promptLen: 3, responseLen: 25 };
  const once = async () => {
    const before = d.stats().device_seconds;
    await d.call(device, 'probe', 0, trainBody(body, batch * 25, { epochs: 1, minibatches: 1 }));
    await d.call(device, 'probe', 0, { fn: 'inference', ...body });
    await d.call(device, 'probe', 0, { fn: 'generate', prompts: tokens.subarray(0, batch * 3), batch, promptLen: 3, responseLen: 25, seeds: new Uint32Array(batch), temperature: 1 });
    return d.stats().device_seconds - before;
  };
  await once();
  const times = [await once(), await once(), await once()];
  await d.call(device, 'probe', 0, { fn: 'release' });
  return median(times)!;
}

/** Timings per call and size, after one to warm up. */
const REPEATS = 5;

const mean = (xs: readonly number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;

/** The sequences the compute calls are timed on: short, and long with most of it generated. */
const WORKLOADS = [
  { promptLen: 5, responseLen: 4 },
  { promptLen: 3, responseLen: 25 },
] as const;

export async function profileLocal(log: (line: string) => void): Promise<DeviceProfile & { fit: object }> {
  return withWorkers(2, 'profile', async ({ nc, subj, d, run }) => {
    const timed = async <T>(f: () => Promise<T>) => {
      const before = d.stats();
      await f();
      const after = d.stats();
      return { device: after.device_seconds - before.device_seconds, trip: after.round_trip_seconds - before.round_trip_seconds };
    };
    // Compute: calls of several shapes, sizes and lengths on one worker.
    type Row = { kind: CallKind; f: ReturnType<typeof features>; t: number };
    const timings: Row[] = [];
    const samples: Array<{ shape: string; kind: CallKind; batch: number; tokens: number; seconds: number }> = [];
    const tripOverhead: number[] = [];
    const vocab = 11;
    for (const [layers, width] of [
      [1, 32],
      [2, 64],
      [4, 64],
      [2, 128],
    ] as const) {
      const shape = localShape('p', vocab, layers, width, 4);
      const context = Math.max(...WORKLOADS.map((w) => w.promptLen + w.responseLen));
      const spec = { kind: 'policy' as const, vocab, context, layers, width, heads: 4 };
      await d.call(0, 'm', 0, { fn: 'load', role: 'actor', spec, layout: ONE, rank: 0, seed: 1, optim: TRAINING_OPTIM });
      for (const { promptLen, responseLen } of WORKLOADS) {
        for (const batch of [16, 64]) {
          const wl: Workload = { batch, promptLen, responseLen, epochs: 2, minibatches: 2 };
          const T = promptLen + responseLen;
          const tokens = Int32Array.from({ length: batch * T }, (_, i) => i % (vocab - 1));
          const body = { tokens, batch, promptLen, responseLen };
          const response = batch * responseLen;
          const calls: Array<[CallKind, () => Promise<unknown>]> = [
            ['inference', () => d.call(0, 'm', 0, { fn: 'inference', ...body })],
            ['train', () => d.call(0, 'm', 0, trainBody(body, response))],
            // No end token: every row decodes the whole budget, as the cost model prices it.
            ['generate', () => d.call(0, 'm', 0, { fn: 'generate', prompts: tokens.subarray(0, batch * promptLen), batch, promptLen, responseLen, seeds: new Uint32Array(batch), temperature: 1 })],
          ];
          for (const [kind, call] of calls) {
            await call(); // warm
            const times = [];
            for (let r = 0; r < REPEATS; r++) {
              const t = await timed(call);
              times.push(t.device);
              tripOverhead.push(t.trip - t.device);
            }
            // The mean, not the median: an iteration is a sum of calls, and its time the sum of
            // theirs, occasional slow ones included.
            const seconds = mean(times);
            timings.push({ kind, f: features(kind, shape, wl), t: seconds });
            samples.push({ shape: `${layers}x${width}`, kind, batch, tokens: T, seconds });
          }
        }
      }
      await d.call(0, 'm', 0, { fn: 'release' });
    }
    const of = (kind: CallKind) => timings.filter((r) => r.kind === kind);
    // Forward passes (inference) fix FLOP/s, the cost per layer pass, per activation element and
    // per call: t ≈ a·F + b·P + e·E + c.
    const [a, b, e, c] = nonNegative(of('inference').map(({ f, t }) => ({ x: [f.flops, f.passes, f.elements, 1], t })));
    // Training fits its factors over forward work, the cost per call shared, and its own fixed cost
    // per layer pass (forward, backward and the optimizer's update, whatever the rows: inference
    // may show none, so it is not a factor over inference's): t − c ≈ u·a·F + l·P + w·e·E.
    const [u, l, w] = nonNegative(of('train').map(({ f, t }) => ({ x: [a! * f.flops, f.passes, e! * f.elements], t: t - c! })));
    // Generation: the prompt's pass and every step's elements as priced above, then decoding
    // steps' fixed costs per layer and per step, their own (small tensors; sampling and a
    // read-back at every step).
    const [dl, ds] = nonNegative(of('generate').map(({ f, t }) => ({ x: [f.decodeLayers, f.decodeSteps], t: t - c! - a! * f.flops - b! * f.passes - e! * f.elements })));
    const predict = ({ kind, f }: Row) =>
      kind === 'train' ? u! * a! * f.flops + l! * f.passes + w! * e! * f.elements + c! : a! * f.flops + b! * f.passes + e! * f.elements + dl! * f.decodeLayers + ds! * f.decodeSteps + c!;
    // The errors of the profile as it is saved, by kind.
    const errors = (rows: Row[]) => median(rows.map((r) => Math.abs(predict(r) - r.t) / r.t))!;
    const residuals = timings.map((r) => Math.abs(predict(r) - r.t) / r.t);
    log(
      `compute: ${(1 / a! / 1e9).toFixed(2)} GFLOP/s sustained, ${(b! * 1e6).toFixed(0)} µs per layer pass, ${(e! * 1e9).toFixed(0)} ns per activation element, ${(c! * 1e3).toFixed(2)} ms per call; ` +
        `training: ${u!.toFixed(1)}× and ${w!.toFixed(1)}× a forward pass's FLOP and element costs, ${(l! * 1e6).toFixed(0)} µs per layer pass; ` +
        `decoding: ${(dl! * 1e6).toFixed(0)} µs per layer and ${(ds! * 1e6).toFixed(0)} µs per step; ` +
        `median fit error ${(100 * median(residuals)!).toFixed(1)}% (inference ${(100 * errors(of('inference'))).toFixed(1)}%, training ${(100 * errors(of('train'))).toFixed(1)}%, generation ${(100 * errors(of('generate'))).toFixed(1)}%)`,
    );
    // Two calls at once, one per worker, against one alone: how much the cores' shared caches
    // and memory, and the processes around them, slow each down.
    const parallelSlowdown = await (async () => {
      const layout = (dev: number): Layout => ({ devices: [dev], dp: 1, tp: 1, pp: 1 });
      const spec = { kind: 'policy' as const, vocab, context: 28, layers: 2, width: 64, heads: 4 };
      await Promise.all([0, 1].map((dev) => d.call(dev, 'p', 0, { fn: 'load', role: 'actor', spec, layout: layout(dev), rank: 0, seed: 1, optim: TRAINING_OPTIM })));
      const batch = 64;
      const tokens = Int32Array.from({ length: batch * 28 }, (_, i) => i % (vocab - 1));
      const train = (dev: number) => d.call(dev, 'p', 0, trainBody({ tokens, batch, promptLen: 3, responseLen: 25 }, batch * 25, { epochs: 1, minibatches: 1 }));
      const wall = async (f: () => Promise<unknown>) => {
        const t0 = performance.now();
        await f();
        return performance.now() - t0;
      };
      await Promise.all([train(0), train(1)]); // warm
      const alone: number[] = [];
      const both: number[] = [];
      for (let r = 0; r < REPEATS; r++) {
        alone.push(await wall(() => train(0)));
        both.push(await wall(() => Promise.all([train(0), train(1)])));
      }
      await Promise.all([0, 1].map((dev) => d.call(dev, 'p', 0, { fn: 'release' })));
      return Math.max(1, mean(both) / mean(alone));
    })();
    log(`two calls at once: each ${parallelSlowdown.toFixed(2)}× as long as alone`);
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
    // step is fitted to them: measured = prediction without it + α·(steps the model counts), the
    // prediction as the simulator runs the call alone (its computing part slower by the parallel
    // slowdown where both devices compute at once, not where a pipeline's stages take turns; its
    // collectives, waits on the bus, not).
    const compute = {
      flops: a! > 0 ? 1 / a! : 1e30, // 0: the FLOPs are lost in the other terms at these widths
      layerOverhead: b!,
      elementSeconds: e!,
      trainElementFactor: w!,
      callOverhead: c! + median(tripOverhead)!,
      trainFactor: u!,
      trainLayerOverhead: l!,
      decodeLayerOverhead: dl!,
      decodeStepOverhead: ds!,
      recomputeDecode: false, // generation decodes with a KV cache (engine/model/kv-cache.ts)
    };
    const partial: DeviceProfile = {
      name: 'local',
      memBandwidth: 1e30,
      memoryBytes: 1e15,
      intraBandwidth: bandwidth,
      interBandwidth: bandwidth,
      latency: 0,
      ...compute,
      source: 'fit',
    };
    const alphaRows: Array<[number, number]> = []; // [collective steps, seconds left to explain]
    let g = 0; // groups name one call each: never reused
    const shape = localShape('p', 11, 2, 64, 4);
    const spec = { kind: 'policy' as const, vocab, context: 9, layers: 2, width: 64, heads: 4 };
    for (const s of [
      { dp: 1, tp: 2, pp: 1 },
      { dp: 2, tp: 1, pp: 1 },
      { dp: 1, tp: 1, pp: 2 },
    ]) {
      const layout: Layout = { devices: [0, 1], ...s };
      const load = (rank: number) => d.call(layout.devices[rank]!, 'mesh', 0, { fn: 'load', role: 'actor', spec, layout, rank, seed: 1, optim: TRAINING_OPTIM });
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
        ['train', () => trainBody(body, batch * 4)],
      ] as Array<[CallKind, () => Parameters<typeof d.call>[3]]>) {
        await both(make);
        const times = [await both(make), await both(make), await both(make)];
        const measured = median(times)!;
        const sharing = { sharedCores: cpus().length, parallelSlowdown };
        const alone = (dev: DeviceProfile) => {
          const c = callCost(shape, kind, layout, wl, dev, 4, { owner: true, trainable: true });
          return c.seconds / segmentSpeed({ devices: layout.devices, ...callLoad(c, layout) }, 0, sharing);
        };
        // Linear in α: the collectives' seconds are waits, at full speed.
        const without = alone(partial);
        const withOne = alone({ ...partial, latency: 1 });
        alphaRows.push([withOne - without, measured - without]);
      }
      await Promise.all([0, 1].map((dev) => d.call(dev, 'mesh', 0, { fn: 'release' })));
    }
    const stepCost = Math.max(latency, alphaRows.reduce((n, [x, y]) => n + x * y, 0) / alphaRows.reduce((n, [x]) => n + x * x, 0));
    log(`collectives: ${(stepCost * 1e3).toFixed(2)} ms per step, fitted to ${alphaRows.length} calls across two workers`);
    return {
      name: 'local',
      memBandwidth: 1e30, // a worker's reads are not what bounds it; compute and overheads are
      memoryBytes: totalmem() / 4,
      intraBandwidth: bandwidth,
      interBandwidth: bandwidth,
      latency: stepCost,
      ...compute,
      sharedCores: cpus().length,
      parallelSlowdown,
      busBandwidth: bandwidth,
      ...(await storeProbe({ nc, run, d }, log)),
      ...(await envProbe({ nc, d }, log)),
      source: `npm run profile on ${new Date().toISOString()}: ${timings.length} calls of 4 shapes and 2 lengths on one worker, ${alphaRows.length} across two, a ping, a 32 MiB exchange, snapshots of two sizes and episodes against an environment that answers at once`,
      probeSeconds: await speedProbe(d),
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
