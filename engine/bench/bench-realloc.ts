// The reallocation benchmark: a model of at least 64 MiB of parameters moves between two layouts
// across worker processes over a private nats-server. In the same run, the same bytes go between
// the same processes as raw NATS publishes (no slicing, digests or assembly), so the ratio of the
// two says what ferry's transfer protocol costs over the bus itself.
import { shardSlices, sliceElements, type Layout } from '../../mesh/parallel/index.ts';
import { planRealloc } from '../../mesh/parallel/index.ts';
import { runExchange } from '../runtime/index.ts';
import { ALGORITHM_NAMES, BUS_DIGEST, FLUSH_EVERY, blockDigests, type DigestAlgorithm } from '../../mesh/wire/index.ts';
import { modelInfo, parameterCount, type GptSpec } from '../model/index.ts';
import { median } from '../runtime/index.ts';
import { cpuOf, withWorkers } from '../cli/workers.ts';
import { cpus } from 'node:os';

export interface ReallocBenchOptions {
  width: number;
  layers: number;
  repeats: number;
  from: Layout;
  to: Layout;
  log: (line: string) => void;
}

const MB = 1e6;

/**
 * Milliseconds per megabyte of the transfers' digest (`algorithm` of 64 KiB blocks, chunks.ts) in
 * this process with the workers idle: the median of `rounds` passes over 64 MiB.
 */
export function digestMsPerMb(algorithm: DigestAlgorithm = BUS_DIGEST, rounds = 5): number {
  const data = new Float32Array(16 << 20).map((_, i) => i);
  const times: number[] = [];
  for (let r = 0; r < rounds; r++) {
    const t0 = performance.now();
    blockDigests(data, algorithm);
    times.push(performance.now() - t0);
  }
  return median(times)! / (data.byteLength / MB);
}

export async function reallocBench(o: ReallocBenchOptions) {
  const spec: GptSpec = { kind: 'policy', vocab: 11, context: 9, layers: o.layers, width: o.width, heads: 8 };
  const devices = [...new Set([...o.from.devices, ...o.to.devices])].sort((a, b) => a - b);
  return withWorkers(devices.length, 'bench-realloc', async ({ nc, subj, d, pids }) => {
    // CPU seconds of the server and of the workers, to tell work from waiting (NaN without /proc).
    const cpu = () => cpuOf(pids);
    const spent = { realloc: { server: 0, workers: 0 }, raw: { server: 0, workers: 0 } };
    const addSpent = (into: { server: number; workers: number }, a: ReturnType<typeof cpu>, b: ReturnType<typeof cpu>) => {
      into.server += b.server - a.server;
      into.workers += b.workers - a.workers;
    };
    const stats = async () => Object.fromEntries(await Promise.all(devices.map(async (dev) => [dev, await d.call(dev, '*', 0, { fn: 'stats' })] as const)));
    const baseline = await stats();
    const bytes = parameterCount(spec) * 4;
    o.log(`model: ${o.layers} layers of width ${o.width}, ${(bytes / (1 << 20)).toFixed(1)} MiB of parameters; ${devices.length} worker processes`);
    const load = (model: string, layout: Layout, seed?: number) =>
      Promise.all(layout.devices.map((dev, rank) => d.call(dev, model, 0, { fn: 'load', role: 'actor', spec, layout, rank, ...(seed === undefined ? {} : { seed }) })));
    await load('src', o.from, 1);
    await load('dst', o.to);
    // Starts each worker's sampling window: what follows is the moves alone.
    const loaded = await stats();
    const plan = planRealloc(modelInfo(spec), o.from, o.to, () => 0);
    const chunkBytes = nc.info?.max_payload ?? 1 << 20;
    const reallocSeconds: number[] = [];
    const rawSeconds: number[] = [];
    let received = 0;
    const times: Record<string, number> = {};
    const held = new Map<number, number>();
    for (let i = 0; i < o.repeats; i++) {
      // Alternate, so that drift on a shared machine touches both alike.
      const c0 = cpu();
      const t0 = performance.now();
      const out = await d.realloc({ id: `r${i}`, iteration: 0, from: { model: 'src', layout: o.from }, to: { model: 'dst', layout: o.to }, plan });
      reallocSeconds.push((performance.now() - t0) / 1000);
      const c1 = cpu();
      addSpent(spent.realloc, c0, c1);
      received = out.received_bytes;
      for (const [k, ms] of Object.entries(out.times)) times[k] = (times[k] ?? 0) + ms;
      for (const [dev, mb] of Object.entries(out.held_mb)) held.set(Number(dev), Math.max(held.get(Number(dev)) ?? 0, mb));
      const t1 = performance.now();
      const tid = (index: number) => `p${i}-${index}`;
      const groupBytes = (g: (typeof plan.transfers)[number]) =>
        g.pieces.reduce((n, p) => n + (p.axis === null ? p.shape : p.shape.map((x, k) => (k === p.axis ? p.end - p.start : x))).reduce((a, b) => a * b, 1) * 4, 0);
      await runExchange<'probe'>(
        nc,
        subj,
        (dev, m, it, body) => d.call(dev, m, it, body),
        `p${i}`,
        0,
        'dst',
        plan.devices,
        (dev) => ({
          fn: 'probe',
          realloc: `p${i}`,
          sends: plan.transfers.filter((g) => g.src === dev).map((g) => ({ transfer: tid(g.index), bytes: groupBytes(g) })),
          recvs: plan.transfers.filter((g) => g.dsts.includes(dev)).map((g) => ({ transfer: tid(g.index), bytes: groupBytes(g) })),
          chunkBytes,
        }),
      );
      rawSeconds.push((performance.now() - t1) / 1000);
      addSpent(spent.raw, c1, cpu());
      o.log(`  round ${i + 1}: realloc ${(plan.minimumBytes / MB / reallocSeconds.at(-1)!).toFixed(1)} MB/s, raw ${(plan.receivedBytes / MB / rawSeconds.at(-1)!).toFixed(1)} MB/s`);
    }
    const after = await stats();
    const info = modelInfo(spec);
    const shardMb = (layout: Layout, dev: number) => {
      const rank = layout.devices.indexOf(dev);
      return rank < 0 ? 0 : shardSlices(info, layout, rank).reduce((n, s) => n + sliceElements(s) * 4, 0) / MB;
    };
    const perWorker = devices.map((dev) => ({
      device: dev,
      /** Idle, with TensorFlow.js loaded. */
      idle_mb: baseline[dev]!.rss_mb,
      /** With the old shard and the (empty) new one in place, before any move. */
      loaded_mb: loaded[dev]!.rss_mb,
      /** The highest RSS sampled while the moves ran. */
      peak_mb: after[dev]!.window_peak_rss_mb,
      old_shard_mb: shardMb(o.from, dev),
      new_shard_mb: shardMb(o.to, dev),
      /** What the moves needed beyond the loaded shards. */
      moving_mb: after[dev]!.window_peak_rss_mb - loaded[dev]!.rss_mb,
      /** The device's own count of what a move made it hold at most (tensors and JavaScript buffers), the worst round. */
      held_mb: ((held.get(dev) ?? 0) * (1 << 20)) / MB,
      /** The chunks a receiver can have in flight from each sender: two flush windows (mesh/wire/transfer/transfer.ts). */
      in_flight_bound_mb: (2 * FLUSH_EVERY * chunkBytes * plan.transfers.filter((g) => g.dsts.includes(dev)).reduce((n, g) => n.add(g.src), new Set<number>()).size) / MB,
    }));
    // Where the devices' time went from go to done, summed over devices and rounds, as shares:
    // the rest is waiting, on the bus or on the other devices.
    const wall = times.wall_ms ?? 0;
    const share = (ms: number) => (wall > 0 ? ms / wall : 0);
    const kinds = ['export', 'hash', 'encode', 'publish', 'decode', 'place'] as const;
    const breakdown = Object.fromEntries(kinds.map((k) => [k, share(times[k] ?? 0)])) as Record<(typeof kinds)[number], number>;
    const time_shares = { ...breakdown, waiting: Math.max(0, 1 - kinds.reduce((a, k) => a + breakdown[k], 0)) };
    // CPU per megabyte moved, and how much of the machine's cores each phase kept busy: where both
    // phases fill the cores, the ratio is the ratio of CPU per megabyte.
    const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);
    const perMb = (s: { server: number; workers: number }, bytesPerRound: number) => {
      const mb = (bytesPerRound * o.repeats) / MB;
      return { server_ms_per_mb: (1000 * s.server) / mb, workers_ms_per_mb: (1000 * s.workers) / mb };
    };
    const cores = cpus().length;
    const cpu_per_mb = {
      cores,
      realloc: { ...perMb(spent.realloc, plan.minimumBytes), cores_busy: (spent.realloc.server + spent.realloc.workers) / sum(reallocSeconds) },
      raw: { ...perMb(spent.raw, plan.receivedBytes), cores_busy: (spent.raw.server + spent.raw.workers) / sum(rawSeconds) },
    };
    // Every byte is hashed twice, by its sender and by its receiver. Where the bus keeps the cores
    // busy, a transfer that did nothing else beyond raw NATS would still spend that much more CPU
    // per megabyte: the highest ratio this protocol can reach on these cores, with the digest it
    // uses (BLAKE3) and with the one it used before (SHA-256), measured here alike.
    const rawCpu = perMb(spent.raw, plan.receivedBytes);
    const rawMsPerMb = rawCpu.server_ms_per_mb + rawCpu.workers_ms_per_mb;
    const rate = (algorithm: DigestAlgorithm) => {
      const ms = digestMsPerMb(algorithm);
      return { name: ALGORITHM_NAMES[algorithm], ms_per_mb_each_side: ms, mb_s: 1000 / ms, ratio_ceiling: rawMsPerMb / (rawMsPerMb + 2 * ms) };
    };
    const digests: { algorithm: DigestAlgorithm } & Record<DigestAlgorithm, ReturnType<typeof rate>> = { algorithm: BUS_DIGEST, blake3: rate('blake3'), sha256: rate('sha256') };
    const reallocMbS = plan.minimumBytes / MB / median(reallocSeconds)!;
    const rawMbS = plan.receivedBytes / MB / median(rawSeconds)!;
    return {
      bench: 'realloc',
      model_mb: bytes / MB,
      from: o.from,
      to: o.to,
      repeats: o.repeats,
      realloc_mb_s: reallocMbS,
      raw_mb_s: rawMbS,
      ratio: reallocMbS / rawMbS,
      bytes_ratio: received / plan.minimumBytes,
      minimum_mb: plan.minimumBytes / MB,
      published_mb: plan.publishedBytes / MB,
      chunk_bytes: chunkBytes,
      /** Shares of the devices' time from go to done: reading and cutting, hashing, encoding, publishing (the bus), decoding, placing, and waiting. */
      time_shares,
      /** CPU milliseconds per megabyte moved, of the nats-server and of the workers together, and the cores each phase kept busy on average. */
      cpu_per_mb,
      /** Each digest's milliseconds per MB and MB/s on this machine (64 KiB blocks, one core), and the ratio two of them per byte leave at most (where the cores are busy); `algorithm`: the one transfers use. */
      digests,
      peak_worker_mb: Math.max(...perWorker.map((w) => w.peak_mb)),
      workers: perWorker,
    };
  });
}
