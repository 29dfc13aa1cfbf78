// The profile's snapshot probe: what a snapshot costs on this machine's private server (which syncs
// every write), as a run takes one — a device writes its shard's state into its own bucket, then
// the supervisor writes the manifest into the run's store and drops the snapshots before the last
// two. Two shard sizes, a few rounds each: the device's write is fitted as a fixed part and a rate,
// the manifest's seconds added to the fixed part (the planner's storeLatency and storeBandwidth).
import { PROTOCOL_VERSION, type SnapshotManifest } from '../../mesh/wire/index.ts';
import type { Layout } from '../../mesh/parallel/index.ts';
import { JetStreamStore, median, objectName } from '../runtime/index.ts';
import { TRAINING_OPTIM, type Workers } from './workers.ts';

/** Rounds per size; the first of each is a warm-up, not counted. */
const ROUNDS = 6;

export async function storeProbe(w: Pick<Workers, 'nc' | 'run' | 'd'>, log: (line: string) => void): Promise<{ storeLatency: number; storeBandwidth: number }> {
  const { nc, run, d } = w;
  const store = await JetStreamStore.open(nc, run, { devices: [0] });
  const layout: Layout = { devices: [0], dp: 1, tp: 1, pp: 1 };
  const points: Array<{ bytes: number; write: number; manifest: number }> = [];
  let iteration = 0;
  for (const width of [64, 256]) {
    const model = `store${width}`;
    const spec = { kind: 'policy' as const, vocab: 11, context: 9, layers: 2, width, heads: 4 };
    await d.call(0, model, 0, { fn: 'load', role: 'actor', spec, layout, rank: 0, seed: 1, optim: TRAINING_OPTIM });
    const writes: number[] = [];
    const manifests: number[] = [];
    let bytes = 0;
    for (let r = 0; r < ROUNDS; r++, iteration++) {
      const object = objectName(iteration, 0, model, 0);
      const t0 = performance.now();
      const out = await d.call(0, model, iteration, { fn: 'snapshot', object, optimizer: true });
      const t1 = performance.now();
      const manifest: SnapshotManifest = {
        type: 'snapshot',
        v: PROTOCOL_VERSION,
        iteration,
        models: { [model]: [{ device: 0, object, ...out }] },
        replicas: { [model]: [0] },
        layouts: { [model]: layout },
      };
      await store.saveSnapshot(manifest);
      const t2 = performance.now();
      if (r === 0) continue;
      writes.push((t1 - t0) / 1000);
      manifests.push((t2 - t1) / 1000);
      bytes = out.bytes;
    }
    await d.call(0, model, 0, { fn: 'release' });
    points.push({ bytes, write: median(writes)!, manifest: median(manifests)! });
  }
  const [small, large] = points as [(typeof points)[0], (typeof points)[0]];
  // Where the machine's noise makes the larger write look no slower, the rate is the larger's alone.
  const slope = large.write > small.write ? (large.write - small.write) / (large.bytes - small.bytes) : large.write / large.bytes;
  const storeBandwidth = 1 / slope;
  const fixed = Math.max(0, small.write - small.bytes * slope);
  const storeLatency = fixed + median([small.manifest, large.manifest])!;
  log(
    `snapshots: ${(storeLatency * 1e3).toFixed(1)} ms fixed (a device's write ${(fixed * 1e3).toFixed(1)}, the manifest ${((storeLatency - fixed) * 1e3).toFixed(1)}), ${(storeBandwidth / 1e6).toFixed(0)} MB/s a device (${(small.bytes / 1e6).toFixed(2)} and ${(large.bytes / 1e6).toFixed(2)} MB in ${(small.write * 1e3).toFixed(1)} and ${(large.write * 1e3).toFixed(1)} ms)`,
  );
  return { storeLatency, storeBandwidth };
}
