// The environment benchmark: one model (4 layers, width 256, on this process's backend) plays 32
// episodes of 4 turns, each action 12 tokens, against an environment in a process of its own
// (bench-env-server.ts, as a user's environment is; in this process its work on each request
// counted as the device's idle time) on a real nats-server, that answers after 0, 20 and 100 ms:
// in groups of 8 (four batches, one decoding while the others wait), as one group of 32 (every
// episode in lock-step: the device waits whenever the environment does), and in 8 and 32 slots
// (an episode waiting on its environment gives its slot to another); then calls of 128 episodes
// at 100 ms in each mode (a call's last steps leave the device nothing to do whatever the mode:
// at 100 ms and 32 episodes that alone is about an eighth of the call; more episodes a call share
// it out), in the same run.
// Each figure is a whole generate call's episodes: episodes per second, and the device's idle
// share (1 − its decoding time over the call's).
import { spawn } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Comm } from '../../mesh/parallel/index.ts';
import { connectBus, EnvClient, MemoryBus, startNatsServer, subjects } from '../../mesh/wire/index.ts';
import { digitCodec, playEpisodes, playInSlots } from '../episodes/index.ts';
import { GptRank, type GptSpec } from '../model/index.ts';

const HERE = dirname(fileURLToPath(import.meta.url));

export interface EnvBenchOptions {
  latencies: number[];
  episodes: number;
  groups: number[];
  /** Also in slots (rl.slots): an episode waiting on its environment gives its slot to another. */
  slots?: number[];
  /** Also calls of this many episodes, at the last latency, in every mode. */
  more?: number;
  repeats: number;
  log: (line: string) => void;
}

export interface EnvBenchRow {
  latency_ms: number;
  /** Groups of this size, or slots of this many. */
  group_size?: number;
  slots?: number;
  episodes: number;
  episodes_per_second: number;
  device_idle: number;
  turns: number;
}

export async function envBench(o: EnvBenchOptions): Promise<EnvBenchRow[]> {
  // Digits 0-9, the separator 10 and 11 after the end; an action is 12 tokens (no end token: every
  // round costs the same), an observation 2.
  const spec: GptSpec = { kind: 'policy', vocab: 12, context: 72, layers: 4, width: 256, heads: 4 };
  const comm = new Comm(new MemoryBus(), subjects('bench-env'), 0);
  const rank = new GptRank(spec, { devices: [0], dp: 1, tp: 1, pp: 1 }, 0, 1, undefined, comm);
  const server = await startNatsServer();
  const nc = await connectBus(server.url, 'bench-env');
  // The environment runs in a process of its own (bench-env-server.ts), one environment per latency.
  const env = spawn(process.execPath, ['--import', import.meta.resolve('tsx'), join(HERE, 'bench-env-server.ts'), '--nats', server.url, '--latencies', o.latencies.join(',')], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  await new Promise<void>((res, rej) => {
    env.stdout.on('data', (b: Buffer) => b.toString().includes('ready') && res());
    env.once('exit', (code) => rej(new Error(`the bench's environment process exited (${code}) before it was ready`)));
  });
  const clients = new Map(o.latencies.map((ms) => [ms, new EnvClient(nc, `bench-${ms}`, { run: 'bench', timeoutMs: 10_000, retries: 0, waitMs: 10_000 })]));
  let client = clients.get(o.latencies[0]!)!;
  const rows: EnvBenchRow[] = [];
  try {
    for (const c of clients.values()) await c.ready();
    const P = 4;
    const play = (mode: { groupSize: number } | { slots: number }, call: number, n = o.episodes) => {
      const options = {
        prompts: Int32Array.from({ length: n * P }, (_, i) => i % 10),
        tasks: Array.from({ length: n }, (_, r) => ({ prompt_text: '', seed: r })),
        ids: Array.from({ length: n }, (_, r) => `${call}-${r}`),
        seeds: Uint32Array.from({ length: n }, (_, r) => r + 1),
        promptLen: P,
        responseLen: 64,
        budget: { maxTurns: 4, turnTokens: 12, stop: [] },
        groupSize: 'groupSize' in mode ? mode.groupSize : 8,
        fill: 11,
        vocab: spec.vocab,
        temperature: 1,
        decoder: (rows: number, capacity: number) => rank.decoder(`bench/${call}`, rows, capacity),
      };
      return 'slots' in mode ? playInSlots(client, digitCodec(10), { ...options, slots: mode.slots }) : playEpisodes(client, digitCodec(10), options);
    };
    let call = 0;
    await play({ groupSize: 8 }, call++); // the backend's first use, not measured
    const modes: Array<{ groupSize: number } | { slots: number }> = [...o.groups.map((groupSize) => ({ groupSize })), ...(o.slots ?? []).map((slots) => ({ slots }))];
    const rounds = [...o.latencies.map((ms) => ({ ms, n: o.episodes })), ...(o.more ? [{ ms: o.latencies.at(-1)!, n: o.more }] : [])];
    for (const { ms, n } of rounds) {
      client = clients.get(ms)!;
      for (const mode of modes) {
        const runs = [];
        for (let k = 0; k < o.repeats; k++) runs.push(await play(mode, call++, n));
        const mid = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
        const row: EnvBenchRow = {
          latency_ms: ms,
          ...('slots' in mode ? { slots: mode.slots } : { group_size: mode.groupSize }),
          episodes: n,
          episodes_per_second: mid(runs.map((r) => n / r.seconds)),
          device_idle: mid(runs.map((r) => Math.max(0, 1 - r.busySeconds / r.seconds))),
          turns: runs[0]!.episodes.reduce((a, e) => a + e.turns.length, 0) / n,
        };
        rows.push(row);
        o.log(
          `latency ${String(ms).padStart(3)} ms, ${'slots' in mode ? `${String(mode.slots).padStart(2)} slots  ` : `groups of ${String(mode.groupSize).padStart(2)}`}, ${n} episodes: ${row.episodes_per_second.toFixed(1)} episodes/s, device idle ${(100 * row.device_idle).toFixed(1)}%, ${row.turns.toFixed(2)} turns per episode`,
        );
      }
    }
  } finally {
    for (const c of clients.values()) c.close();
    env.kill('SIGTERM');
    await nc.drain().catch(() => {});
    await server.stop();
    rank.dispose();
    comm.close();
  }
  return rows;
}
