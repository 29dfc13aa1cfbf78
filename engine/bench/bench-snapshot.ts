// npm run bench -- snapshot: what a snapshot costs against the number of devices and the bytes
// each holds. GRPO with the actor and its reference pipelined over 1, 2 and 4 worker processes,
// two layers a stage (so the model grows with the devices and the bytes each device holds stay
// about the same), at two widths, a snapshot after every iteration. Each device writes its own
// stages' state into its own bucket of the run's JetStream store, all at once; the supervisor
// records only the manifest. So a snapshot's seconds should stay flat as devices (and the model)
// grow, and grow with the bytes per device. Ratios are of figures measured in the same run.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { runId } from '../../mesh/wire/index.ts';
import { loadScenario, median } from '../runtime/index.ts';
import { launch } from '../cli/launch.ts';

export interface SnapshotRow {
  devices: number;
  width: number;
  layers: number;
  snapshots: number;
  /** One snapshot: the bytes the devices wrote, per device on average, and what went through the supervisor (its manifest). */
  bytes: number;
  bytes_per_device: number;
  bytes_via_supervisor: number;
  /** Seconds of one snapshot (the devices writing, then the manifest), and of each part. */
  seconds: number;
  write_seconds: number;
  manifest_seconds: number;
  /** Snapshot seconds per iteration, as summary.json's snapshots give them. */
  seconds_per_iteration: number;
  /** The devices' writes together, in MB/s: what the run's JetStream server took in. */
  write_mb_per_s: number;
}

const scenario = (devices: number, width: number, iterations: number, sync?: string) => {
  const mesh = devices === 1 ? '0:0' : `0:0-${devices - 1}`;
  return `name: snapshot-${devices}x${width}
seed: 3
task: { name: sort, digits: 4, base: 10 }
model: { layers: ${2 * devices}, width: ${width}, heads: 4 }
cluster: { nodes: 1, devices_per_node: 4 }
algorithm: { name: grpo, group: 4 }
plan:
  actor.train: { mesh: "${mesh}", pp: ${devices} }
  actor.generate: { mesh: "${mesh}", pp: ${devices} }
  reference.inference: { mesh: "${mesh}", pp: ${devices} }
  reward.inference: { mesh: "0:0" }
warmup: { steps: 0 }
rl: { iterations: ${iterations}, batch: 16 }
checkpoint: { every: 1 }
${sync ? `bus: { sync: ${sync} }\n` : ''}`;
};

/** `sync`: the private server's bus.sync (default: the scenario default, always). */
export async function snapshotBench(o: { devices?: number[]; widths?: number[]; iterations?: number; sync?: string; log: (line: string) => void }) {
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
        writeFileSync(file, scenario(n, width, iterations, o.sync));
        const res = await launch({ scenario: loadScenario(file), run: runId(`snap-${n}x${width}`), out: join(dir, `${n}x${width}`), progress: quiet, say: () => {} });
        const s = res.summary;
        if (res.code !== 0 || !s?.snapshots) throw new Error(`the run on ${n} device(s) at width ${width} failed: ${s?.error ?? `exit code ${res.code}`}`);
        const { count, total_bytes, bytes_via_supervisor, write_seconds, manifest_seconds } = s.snapshots;
        const row: SnapshotRow = {
          devices: n,
          width,
          layers: 2 * n,
          snapshots: count,
          bytes: total_bytes / count,
          bytes_per_device: total_bytes / count / n,
          bytes_via_supervisor: bytes_via_supervisor / count,
          seconds: (write_seconds + manifest_seconds) / count,
          write_seconds: write_seconds / count,
          manifest_seconds: manifest_seconds / count,
          seconds_per_iteration: (write_seconds + manifest_seconds) / s.iterations,
          write_mb_per_s: total_bytes / write_seconds / 1e6,
        };
        rows.push(row);
        o.log(
          `  ${n} device(s), ${row.layers} layers, width ${width}: ${(row.bytes / 2 ** 20).toFixed(2)} MiB a snapshot (${(row.bytes_per_device / 2 ** 20).toFixed(2)} MiB a device; ${row.bytes_via_supervisor} bytes through the supervisor), ${row.seconds.toFixed(3)} s (devices writing ${row.write_seconds.toFixed(3)}, ${row.write_mb_per_s.toFixed(0)} MB/s together; manifest ${row.manifest_seconds.toFixed(3)})`,
        );
      }
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  const at = (n: number, w: number) => rows.find((r) => r.devices === n && r.width === w)!;
  const most = Math.max(...devices);
  const least = Math.min(...devices);
  // Flat in devices is 1: each device writes its own part, all at once.
  const seconds_ratio_devices = median(widths.map((w) => at(most, w).seconds / at(least, w).seconds));
  const bytes_ratio_devices = median(widths.map((w) => at(most, w).bytes / at(least, w).bytes));
  const bytes_per_device_ratio_devices = median(widths.map((w) => at(most, w).bytes_per_device / at(least, w).bytes_per_device));
  // Linear in the bytes a device holds: the seconds grow as the bytes do.
  const [small, large] = [Math.min(...widths), Math.max(...widths)];
  const seconds_ratio_size = median(devices.map((n) => at(n, large).seconds / at(n, small).seconds));
  const bytes_ratio_size = median(devices.map((n) => at(n, large).bytes_per_device / at(n, small).bytes_per_device));
  const bytes_via_supervisor_max = Math.max(...rows.map((r) => r.bytes_via_supervisor));
  // Where the seconds stop being flat: the rate the server takes the devices' writes in stops growing.
  const write_rate_ratio_devices = median(widths.map((w) => at(most, w).write_mb_per_s / at(least, w).write_mb_per_s));
  return { rows, seconds_ratio_devices, bytes_ratio_devices, bytes_per_device_ratio_devices, seconds_ratio_size, bytes_ratio_size, bytes_via_supervisor_max, write_rate_ratio_devices };
}
