// The environment benchmark: one model (4 layers, width 256, on this process's backend) plays 32
// episodes of 4 turns, each action 12 tokens, against an environment on a real nats-server that
// answers after 0, 20 and 100 ms, in groups of 8 (four batches, one decoding while the others wait) and as one group of 32
// (every episode in lock-step: the device waits whenever the environment does), in the same run.
// Each figure is a whole generate call's episodes: episodes per second, and the device's idle
// share (1 − its decoding time over the call's).
import { Comm } from '../../mesh/parallel/index.ts';
import { connectBus, EnvClient, MemoryBus, serveEnvironment, startNatsServer, subjects } from '../../mesh/wire/index.ts';
import { digitCodec, playEpisodes } from '../episodes/index.ts';
import { GptRank, type GptSpec } from '../model/index.ts';

export interface EnvBenchOptions {
  latencies: number[];
  episodes: number;
  groups: number[];
  repeats: number;
  log: (line: string) => void;
}

export interface EnvBenchRow {
  latency_ms: number;
  group_size: number;
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
  let latency = 0;
  // Every step answers a two-digit observation after `latency` ms; an episode is 4 turns.
  const env = await serveEnvironment<{ turn: number }>({
    nats: server.url,
    name: 'bench',
    reset: () => ({ state: { turn: 0 }, observation: '1' }),
    step: async (s) => {
      await new Promise((r) => setTimeout(r, latency));
      s.turn += 1;
      return { observation: '42', reward: 0, done: s.turn >= 4 };
    },
  });
  const client = new EnvClient(nc, 'bench', { run: 'bench', timeoutMs: 10_000, retries: 0, waitMs: 10_000 });
  const rows: EnvBenchRow[] = [];
  try {
    await client.ready();
    const n = o.episodes;
    const P = 4;
    const play = (groupSize: number, call: number) =>
      playEpisodes(client, digitCodec(10), {
        prompts: Int32Array.from({ length: n * P }, (_, i) => i % 10),
        tasks: Array.from({ length: n }, (_, r) => ({ prompt_text: '', seed: r })),
        ids: Array.from({ length: n }, (_, r) => `${call}-${r}`),
        seeds: Uint32Array.from({ length: n }, (_, r) => r + 1),
        promptLen: P,
        responseLen: 64,
        budget: { maxTurns: 4, turnTokens: 12, stop: [] },
        groupSize,
        fill: 11,
        vocab: spec.vocab,
        temperature: 1,
        decoder: (rows, capacity) => rank.decoder(`bench/${call}`, rows, capacity),
      });
    let call = 0;
    await play(8, call++); // the backend's first use, not measured
    for (const ms of o.latencies) {
      latency = ms;
      for (const g of o.groups) {
        const runs = [];
        for (let k = 0; k < o.repeats; k++) runs.push(await play(g, call++));
        const mid = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
        const row = {
          latency_ms: ms,
          group_size: g,
          episodes_per_second: mid(runs.map((r) => n / r.seconds)),
          device_idle: mid(runs.map((r) => Math.max(0, 1 - r.busySeconds / r.seconds))),
          turns: runs[0]!.episodes.reduce((a, e) => a + e.turns.length, 0) / n,
        };
        rows.push(row);
        o.log(
          `latency ${String(ms).padStart(3)} ms, groups of ${String(g).padStart(2)}: ${row.episodes_per_second.toFixed(1)} episodes/s, device idle ${(100 * row.device_idle).toFixed(1)}%, ${row.turns.toFixed(2)} turns per episode`,
        );
      }
    }
  } finally {
    client.close();
    await env.stop();
    await nc.drain().catch(() => {});
    await server.stop();
    rank.dispose();
    comm.close();
  }
  return rows;
}
