// The profile's environment probe: how long a generating device waits for an environment's answer
// that takes the environment no time — a reset or a step over this machine's bus, answered by an
// environment served from the profiler's own process. A worker plays episodes against it in one
// group (every episode in lock-step: nothing else runs on the device while it waits), and each
// answer's seconds, as the device timed them, are read from the episodes' records (the planner's
// envAnswerSeconds).
import { serveEnvironment, type CallOf, type ResultOf } from '../../mesh/wire/index.ts';
import type { Layout } from '../../mesh/parallel/index.ts';
import { median } from '../runtime/index.ts';
import type { Workers } from './workers.ts';

/** Calls of the probe; the first warms the model and the bus up and is not counted. */
const CALLS = 4;

export async function envProbe(w: Pick<Workers, 'nc' | 'd'>, log: (line: string) => void): Promise<{ envAnswerSeconds: number }> {
  const { nc, d } = w;
  const name = 'profile-probe';
  // Every step answers at once; an episode is 4 turns.
  const env = await serveEnvironment<{ turn: number }>({
    nats: nc,
    name,
    reset: () => ({ state: { turn: 0 }, observation: '' }),
    step: (s) => {
      s.turn += 1;
      return { observation: '1', reward: 0, done: s.turn >= 4 };
    },
  });
  const layout: Layout = { devices: [0], dp: 1, tp: 1, pp: 1 };
  const spec = { kind: 'policy' as const, vocab: 11, context: 20, layers: 1, width: 32, heads: 4 };
  const model = 'envprobe';
  try {
    await d.call(0, model, 0, { fn: 'load', role: 'actor', spec, layout, rank: 0, seed: 1 });
    const rows = 8;
    const promptLen = 4;
    const seconds: number[] = [];
    for (let c = 0; c < CALLS; c++) {
      const body: CallOf<'generate'> = {
        fn: 'generate',
        prompts: Int32Array.from({ length: rows * promptLen }, (_, i) => i % 10),
        batch: rows,
        promptLen,
        responseLen: 16,
        seeds: Uint32Array.from({ length: rows }, (_, r) => r + 1),
        temperature: 1,
        episodes: {
          environment: name,
          ids: Array.from({ length: rows }, (_, r) => `${c}-${r}`),
          tasks: Array.from({ length: rows }, (_, r) => ({ prompt_text: '', seed: r })),
          max_turns: 4,
          turn_tokens: 2,
          stop: [],
          group_size: rows,
          codec: { kind: 'digits', base: 10 },
          fill: 10,
          timeout_ms: 10_000,
          retries: 0,
          wait_ms: 10_000,
        },
      };
      const out = (await d.call(0, model, c, body)) as ResultOf<'generate'>;
      if (c === 0) continue;
      for (const e of out.episodes ?? []) seconds.push(e.reset.seconds, ...e.turns.map((t) => t.seconds));
    }
    await d.call(0, model, 0, { fn: 'release' });
    const envAnswerSeconds = median(seconds)!;
    log(`environment: ${(envAnswerSeconds * 1e3).toFixed(2)} ms an answer, as the generating device waits for it (median of ${seconds.length})`);
    return { envAnswerSeconds };
  } finally {
    await env.stop();
  }
}
