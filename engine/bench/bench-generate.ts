// The generation benchmark: one model (4 layers, width 256) samples a batch of responses of
// several lengths, decoding with the KV cache and (for the shorter ones) by running the whole
// prefix again for every token (as ferry did before the cache), in the same run. Each figure is a
// whole generate call, as a rollout pays it: prefill, decoding, and the pass that scores the
// sampled tokens. The growth of the time per token from the shortest to the longest says what
// attending a longer cache costs.
import { Comm } from '../../mesh/parallel/index.ts';
import { MemoryBus, subjects } from '../../mesh/wire/index.ts';
import { GptRank, type GptSpec } from '../model/index.ts';

export interface GenerateBenchOptions {
  layers: number;
  width: number;
  heads: number;
  vocab: number;
  batch: number;
  promptLen: number;
  lengths: number[];
  /** Lengths up to this are also generated without the cache (each token reading its whole prefix again). */
  uncachedUpTo: number;
  log: (line: string) => void;
}

/** The time per generated token at the longest length over that at the shortest, with the cache. */
export function growth(secondsPerToken: Record<string, number>, lengths: readonly number[]): number {
  const [short, long] = [Math.min(...lengths), Math.max(...lengths)];
  return secondsPerToken[String(long)]! / secondsPerToken[String(short)]!;
}

export async function generateBench(o: GenerateBenchOptions) {
  const longest = Math.max(...o.lengths);
  const spec: GptSpec = { kind: 'policy', vocab: o.vocab, context: o.promptLen + longest, layers: o.layers, width: o.width, heads: o.heads };
  const comm = new Comm(new MemoryBus(), subjects('bench-generate'), 0);
  const rank = new GptRank(spec, { devices: [0], dp: 1, tp: 1, pp: 1 }, 0, 1, undefined, comm);
  const prompts = Int32Array.from({ length: o.batch * o.promptLen }, (_, i) => (i * 7919) % o.vocab);
  const seeds = Uint32Array.from({ length: o.batch }, (_, i) => i + 1);
  const perToken = { cache: {} as Record<string, number>, nocache: {} as Record<string, number> };
  const rate = { cache: {} as Record<string, number>, nocache: {} as Record<string, number> };
  let n = 0;
  try {
    // One warm-up call of each kind, so that neither pays for the backend's first use.
    await rank.generate(`w${n++}`, prompts, o.batch, o.promptLen, Math.min(...o.lengths), seeds, { temperature: 1, cache: true });
    await rank.generate(`w${n++}`, prompts, o.batch, o.promptLen, Math.min(...o.lengths), seeds, { temperature: 1, cache: false });
    for (const R of o.lengths) {
      for (const kind of R <= o.uncachedUpTo ? (['cache', 'nocache'] as const) : (['cache'] as const)) {
        const t0 = performance.now();
        const out = await rank.generate(`g${n++}`, prompts, o.batch, o.promptLen, R, seeds, { temperature: 1, cache: kind === 'cache' });
        const seconds = (performance.now() - t0) / 1000;
        if (out.tokens.length !== o.batch * (o.promptLen + R)) throw new Error(`generate returned ${out.tokens.length} tokens, expected ${o.batch * (o.promptLen + R)}`);
        perToken[kind][String(R)] = seconds / (o.batch * R);
        rate[kind][String(R)] = (o.batch * R) / seconds;
        o.log(`  ${String(R).padStart(4)} tokens, ${kind === 'cache' ? 'KV cache   ' : 'no cache   '} ${rate[kind][String(R)]!.toFixed(1).padStart(8)} tokens/s (${seconds.toFixed(2)} s)`);
      }
    }
  } finally {
    rank.dispose();
    comm.close();
  }
  const speedup = Object.fromEntries(o.lengths.filter((R) => R <= o.uncachedUpTo).map((R) => [String(R), rate.cache[String(R)]! / rate.nocache[String(R)]!]));
  return {
    bench: 'generate',
    model: { layers: o.layers, width: o.width, heads: o.heads, vocab: o.vocab, batch: o.batch, prompt: o.promptLen },
    tokens_per_s_cache: rate.cache,
    tokens_per_s_nocache: rate.nocache,
    speedup,
    growth: growth(perToken.cache, o.lengths),
  };
}
