// npm run bench -- snapshot: what a snapshot costs against the number of devices and the model
// size. GRPO with the actor (and its reference) data-parallel over 1, 2 and 4 worker processes, at
// two model widths, a snapshot after every iteration: the seconds per snapshot (fetching every
// rank from the devices, storing the whole in the run's JetStream object store) and the bytes.
// Each device holds a whole replica, so the bytes per device stay fixed as devices are added. A
// snapshot keeps each data-parallel replica once (takeCheckpoint fetches one, store/replicas.ts
// writes it once), so its bytes, and its seconds, stay flat as replicas are added; it still goes
// through the supervisor's process, so its seconds grow with the model's bytes. Ratios are of
// figures measured in the same run.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { runId } from '../../mesh/wire/index.ts';
import { loadScenario, median } from '../runtime/index.ts';
import { launch } from './launch.ts';

export interface SnapshotRow {
  devices: number;
  width: number;
  snapshots: number;
  /** One snapshot: its bytes, the bytes one device holds (a whole replica here), seconds (fetch + store), of which fetching. */
  bytes: number;
  bytes_per_device: number;
  seconds: number;
  fetch_seconds: number;
  store_seconds: number;
  /** Snapshot seconds per iteration, as summary.json's snapshots give them. */
  seconds_per_iteration: number;
}

const scenario = (devices: number, width: number, iterations: number) => {
  const mesh = devices === 1 ? '0:0' : `0:0-${devices - 1}`;
  return `name: snapshot-${devices}x${width}
seed: 3
task: { name: sort, digits: 4, base: 10 }
model: { layers: 2, width: ${width}, heads: 4 }
cluster: { nodes: 1, devices_per_node: 4 }
algorithm: { name: grpo, group: 4 }
plan:
  actor.train: { mesh: "${mesh}", dp: ${devices} }
  actor.generate: { mesh: "${mesh}", dp: ${devices} }
  reference.inference: { mesh: "${mesh}", dp: ${devices} }
  reward.inference: { mesh: "0:0" }
warmup: { steps: 0 }
rl: { iterations: ${iterations}, batch: 16 }
checkpoint: { every: 1 }
`;
};

export async function snapshotBench(o: { devices?: number[]; widths?: number[]; iterations?: number; log: (line: string) => void }) {
  const devices = o.devices ?? [1, 2, 4];
  const widths = o.widths ?? [64, 128];
  const iterations = o.iterations ?? 4;
  const dir = mkdtempSync(join(tmpdir(), 'ferry-bench-snapshot-'));
  const quiet = { phase() {}, iteration() {}, stop() {} };
  const rows: SnapshotRow[] = [];
  try {
    for (const width of widths) {
      for (const n of devices) {
        const file = join(dir, `${n}x${width}.yaml`);
        writeFileSync(file, scenario(n, width, iterations));
        const res = await launch({ scenario: loadScenario(file), run: runId(`snap-${n}x${width}`), out: join(dir, `${n}x${width}`), progress: quiet, say: () => {} });
        const s = res.summary;
        if (res.code !== 0 || !s?.snapshots) throw new Error(`the run on ${n} device(s) at width ${width} failed: ${s?.error ?? `exit code ${res.code}`}`);
        const { count, bytes, fetch_seconds, store_seconds } = s.snapshots;
        const row: SnapshotRow = {
          devices: n,
          width,
          snapshots: count,
          bytes,
          bytes_per_device: bytes,
          seconds: (fetch_seconds + store_seconds) / count,
          fetch_seconds: fetch_seconds / count,
          store_seconds: store_seconds / count,
          seconds_per_iteration: (fetch_seconds + store_seconds) / s.iterations,
        };
        rows.push(row);
        o.log(
          `  ${n} device(s), width ${width}: ${(row.bytes / 2 ** 20).toFixed(2)} MiB a snapshot (each device holds ${(row.bytes_per_device / 2 ** 20).toFixed(2)} MiB), ${row.seconds.toFixed(3)} s (fetch ${row.fetch_seconds.toFixed(3)}, store ${row.store_seconds.toFixed(3)})`,
        );
      }
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  const at = (n: number, w: number) => rows.find((r) => r.devices === n && r.width === w)!;
  const most = Math.max(...devices);
  const least = Math.min(...devices);
  // Flat in devices is 1: the snapshot keeps one replica however many there are.
  const seconds_ratio_devices = median(widths.map((w) => at(most, w).seconds / at(least, w).seconds));
  const bytes_ratio_devices = median(widths.map((w) => at(most, w).bytes / at(least, w).bytes));
  // Linear in the bytes a device holds: the seconds grow as the bytes do.
  const [small, large] = [Math.min(...widths), Math.max(...widths)];
  const seconds_ratio_size = median(devices.map((n) => at(n, large).seconds / at(n, small).seconds));
  const bytes_ratio_size = median(devices.map((n) => at(n, large).bytes_per_device / at(n, small).bytes_per_device));
  return { rows, seconds_ratio_devices, bytes_ratio_devices, seconds_ratio_size, bytes_ratio_size };
}
