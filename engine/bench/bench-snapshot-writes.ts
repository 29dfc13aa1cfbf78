// The snapshot benchmark's second part: the devices' writes alone, and what bounds them. Worker
// processes hold equal shards (an actor pipelined over 1, 2 or 4 of them, two layers a stage, with
// its optimizer) and write them into their own buckets at once, as a run's snapshot does, with no
// training between. Beside the seconds, the CPU the nats-server and the workers spent per megabyte
// written, and how many of the machine's cores they kept busy: where the cores are full, adding
// devices cannot keep the seconds flat, and the ratio of seconds is the ratio of CPU.
import { cpus } from 'node:os';
import { NatsShelf } from '../../mesh/wire/index.ts';
import type { Layout } from '../../mesh/parallel/index.ts';
import type { GptSpec } from '../model/index.ts';
import { TRAINING_OPTIM, cpuOf, withWorkers } from '../cli/workers.ts';

const MB = 1e6;

export interface WritesRow {
  devices: number;
  /** One device's object: its weights, both moments and its ledger, as a snapshot writes it. */
  mb_per_device: number;
  /** The mean seconds from the calls to the last device's answer (the mean, so that seconds = CPU ÷ cores busy). */
  seconds: number;
  /** The devices' writes together. */
  mb_per_s: number;
  /** CPU milliseconds per megabyte written, of the nats-server and of the workers together. */
  server_ms_per_mb: number;
  workers_ms_per_mb: number;
  /** The cores the server and the workers kept busy on average while they wrote. */
  cores_busy: number;
}

export async function snapshotWrites(o: { devices: number[]; width: number; rounds: number; log: (line: string) => void }) {
  const most = Math.max(...o.devices);
  return withWorkers(most, 'bench-snapshot-writes', async ({ nc, run, d, pids }) => {
    const shelf = new NatsShelf(nc, run);
    for (let dev = 0; dev < most; dev++) await shelf.create(dev);
    const cpu = () => cpuOf(pids);
    const rows: WritesRow[] = [];
    for (const n of o.devices) {
      const spec: GptSpec = { kind: 'policy', vocab: 11, context: 9, layers: 2 * n, width: o.width, heads: 4 };
      const layout: Layout = { devices: Array.from({ length: n }, (_, i) => i), dp: 1, tp: 1, pp: n };
      const model = `actor${n}`;
      await Promise.all(layout.devices.map((dev, rank) => d.call(dev, model, 0, { fn: 'load', role: 'actor', spec, layout, rank, seed: 1, optim: TRAINING_OPTIM })));
      const walls: number[] = [];
      let bytes = 0;
      let spent = { server: 0, workers: 0 };
      for (let r = 0; r < o.rounds; r++) {
        const c0 = cpu();
        const t0 = performance.now();
        const out = await Promise.all(layout.devices.map((dev, rank) => d.call(dev, model, r, { fn: 'snapshot', object: `w${r}.${model}.r${rank}`, optimizer: true })));
        walls.push((performance.now() - t0) / 1000);
        const c1 = cpu();
        spent = { server: spent.server + c1.server - c0.server, workers: spent.workers + c1.workers - c0.workers };
        bytes = out.reduce((a, x) => a + x.bytes, 0);
      }
      await Promise.all(layout.devices.map((dev) => d.call(dev, model, 0, { fn: 'release' })));
      const mb = (bytes * o.rounds) / MB;
      const mean = walls.reduce((a, b) => a + b, 0) / walls.length;
      const row: WritesRow = {
        devices: n,
        mb_per_device: bytes / n / MB,
        seconds: mean,
        mb_per_s: bytes / MB / mean,
        server_ms_per_mb: (1000 * spent.server) / mb,
        workers_ms_per_mb: (1000 * spent.workers) / mb,
        cores_busy: (spent.server + spent.workers) / walls.reduce((a, b) => a + b, 0),
      };
      rows.push(row);
      o.log(
        `  ${n} device(s) writing ${row.mb_per_device.toFixed(2)} MB each at once: ${row.seconds.toFixed(3)} s (${row.mb_per_s.toFixed(0)} MB/s together); CPU per MB: server ${row.server_ms_per_mb.toFixed(1)} ms + workers ${row.workers_ms_per_mb.toFixed(1)} ms, ${row.cores_busy.toFixed(2)} of ${cpus().length} cores busy`,
      );
    }
    const first = rows[0]!;
    const last = rows.at(-1)!;
    const snapshotCpu = (r: WritesRow) => ((r.server_ms_per_mb + r.workers_ms_per_mb) * r.mb_per_device * r.devices) / 1000;
    // seconds = CPU ÷ cores busy, so the seconds' ratio is the CPU's ratio over the busy cores' ratio.
    return {
      rows,
      cores: cpus().length,
      seconds_ratio: last.seconds / first.seconds,
      /** CPU seconds a snapshot took on the most devices ÷ on the fewest. */
      cpu_ratio: snapshotCpu(last) / snapshotCpu(first),
      /** Cores busy on the most devices ÷ on the fewest. */
      busy_ratio: last.cores_busy / first.cores_busy,
    };
  });
}
