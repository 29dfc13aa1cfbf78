// A private nats-server and `count` worker processes that have joined as devices 0..count-1, for
// commands that drive workers directly (benchmarks, the profiler); all of it is stopped after.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connectBus, type NatsConnection } from '../../mesh/wire/index.ts';
import { startNatsServer } from '../../mesh/wire/index.ts';
import { runId, subjects, type Optim, type Subjects } from '../../mesh/wire/index.ts';
import { BusDispatcher } from '../runtime/index.ts';
import { Membership } from '../supervision/index.ts';
import { exited, startProcess } from './launch.ts';
import { processBundle } from './process-bundle.ts';

export interface Workers {
  nc: NatsConnection;
  subj: Subjects;
  run: string;
  d: BusDispatcher;
  /** Process ids of the nats-server and of the workers, in device order (benchmarks read their CPU time). */
  pids: { server: number; workers: number[] };
}

export async function withWorkers<T>(count: number, label: string, fn: (w: Workers) => Promise<T>): Promise<T> {
  const dir = mkdtempSync(join(tmpdir(), `ferry-${label}-`));
  const server = await startNatsServer();
  const run = runId(label);
  const subj = subjects(run);
  const nc = await connectBus(server.url, label);
  const devices = Array.from({ length: count }, (_, i) => i);
  const bundle = await processBundle();
  const workers = devices.map((i) => startProcess('actors/worker.ts', ['--run', run, '--nats', server.url, '--backend', 'wasm'], join(dir, `worker-${i}.log`), {}, bundle));
  try {
    await new Promise<void>((resolve, reject) => {
      const joined = new Set<number>();
      const timer = setTimeout(() => reject(new Error(`workers did not join within 60 s (logs in ${dir})`)), 60_000);
      const membership: Membership = new Membership(nc, subj, run, devices, {
        heartbeatMs: 600_000,
        onJoined: (j) => {
          joined.add(j.device);
          if (joined.size === count) {
            clearTimeout(timer);
            membership.close();
            resolve();
          }
        },
        onLost: () => {},
        log: () => {},
      });
    });
    const d = new BusDispatcher(nc, subj, run, 600_000);
    const out = await fn({ nc, subj, run, d, pids: { server: server.process.pid!, workers: workers.map((w) => w.pid!) } });
    await Promise.all(devices.map((dev) => d.call(dev, '*', 0, { fn: 'shutdown' }).catch(() => undefined)));
    return out;
  } finally {
    for (const w of workers) if (w.exitCode === null) w.kill('SIGTERM');
    await Promise.all(workers.map(exited));
    await nc.close().catch(() => {});
    await server.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

/** The optimizer a command loads a trainable shard with, where what it times does not depend on it. */
export const TRAINING_OPTIM: Optim = { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, clipNorm: 1 };

/**
 * CPU seconds (user + system) a process has used, from /proc/PID/stat; undefined where there is
 * no /proc (the benchmark then reports no CPU figures).
 */
export function cpuSeconds(pid: number): number | undefined {
  try {
    // Fields after the command's closing parenthesis: state is the 3rd field, utime the 14th, stime the 15th.
    const rest = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ').at(-1)!.split(' ');
    return (Number(rest[11]) + Number(rest[12])) / CLOCK_TICKS;
  } catch {
    return undefined;
  }
}

/** Linux's USER_HZ: /proc counts CPU time in hundredths of a second on every architecture it runs on. */
const CLOCK_TICKS = 100;

/** CPU seconds the nats-server and the workers (together) have used so far: NaN without /proc. */
export function cpuOf(pids: Workers['pids']): { server: number; workers: number } {
  const seconds = (pid: number) => cpuSeconds(pid) ?? Number.NaN;
  return { server: seconds(pids.server), workers: pids.workers.reduce((a, p) => a + seconds(p), 0) };
}
