// Generation is batch-invariant: a sequence generated alone equals, bit for bit, the same
// sequence (same prompt, same seed) generated among others. A free-running run (rl.staleness)
// replays its recorded schedule on this: which rows a generation call holds must not change what
// any of them becomes.
import { beforeAll, describe, expect, it, vi } from 'vitest';
import { Comm } from '../../mesh/parallel/index.ts';
import { MemoryBus, subjects } from '../../mesh/wire/index.ts';
import { initBackend } from './backend/backend.ts';
import { GptRank } from './rank.ts';
import { KvCache } from './kv-cache.ts';

describe('batch invariance of generation', () => {
  beforeAll(async () => {
    await initBackend('wasm');
  });

  for (const arch of [{ name: 'gpt-2' }, { name: 'llama (grouped KV heads, SwiGLU, rotary, left-padded prompts)', family: 'llama', kvHeads: 2, ffn: 48, pad: 0 }] as const) {
    it(`${arch.name}: each row alone gives the tokens and log-probs it gets in a batch of 7, with and without an end token, cached or not`, async () => {
      const { name: _name, ...family } = arch;
      const spec = { kind: 'policy' as const, vocab: 11, context: 32, layers: 2, width: 16, heads: 4, ...family };
      const comm = new Comm(new MemoryBus(), subjects(`bi-${arch.name.length}`), 0);
      const rank = new GptRank(spec, { devices: [0], dp: 1, tp: 1, pp: 1 }, 0, 5, undefined, comm);
      const [B, P, R] = [7, 5, 20];
      const prompts = Int32Array.from({ length: B * P }, (_, i) => (i * 7 + 3) % 11);
      const seeds = Uint32Array.from({ length: B }, (_, i) => 1000 + 17 * i);
      for (const opts of [{ temperature: 1 }, { temperature: 0.8, eos: 2 }, { temperature: 1, cache: false }]) {
        const together = await rank.generate('all', prompts, B, P, R, seeds, opts);
        for (let b = 0; b < B; b++) {
          const alone = await rank.generate(`one-${b}`, prompts.slice(b * P, (b + 1) * P), 1, P, R, seeds.slice(b, b + 1), opts);
          expect(Array.from(alone.tokens), `row ${b}, ${JSON.stringify(opts)}`).toEqual(Array.from(together.tokens.subarray(b * (P + R), (b + 1) * (P + R))));
          expect(Array.from(alone.logprobs), `row ${b}, ${JSON.stringify(opts)}`).toEqual(Array.from(together.logprobs.subarray(b * R, (b + 1) * R)));
        }
      }
      rank.dispose();
      comm.close();
    });

    it(`${arch.name}: once half of a batch's rows have ended, the cache keeps the others only, and every row's tokens and log-probs stay those of the uncached pass`, async () => {
      const { name: _name, ...family } = arch;
      const spec = { kind: 'policy' as const, vocab: 11, context: 40, layers: 2, width: 16, heads: 4, ...family };
      const comm = new Comm(new MemoryBus(), subjects(`shrink-${arch.name.length}`), 0);
      const rank = new GptRank(spec, { devices: [0], dp: 1, tp: 1, pp: 1 }, 0, 5, undefined, comm);
      const [B, P, R] = [16, 5, 30];
      const prompts = Int32Array.from({ length: B * P }, (_, i) => (i * 5 + 1) % 11);
      const seeds = Uint32Array.from({ length: B }, (_, i) => 7 + 31 * i);
      const keep = vi.spyOn(KvCache.prototype, 'keep');
      const cached = await rank.generate('cached', prompts, B, P, R, seeds, { temperature: 1, eos: 2 });
      const shrunk = keep.mock.calls.map((c) => c[0].length);
      keep.mockRestore();
      const uncached = await rank.generate('uncached', prompts, B, P, R, seeds, { temperature: 1, eos: 2, cache: false });
      // Rows end at different steps here: the cache shrank, each time to at most half of what it held.
      expect(shrunk.length).toBeGreaterThan(0);
      shrunk.reduce((held, n) => (expect(n).toBeLessThanOrEqual(held / 2), n), B);
      expect(Array.from(cached.tokens)).toEqual(Array.from(uncached.tokens));
      expect(Array.from(cached.logprobs)).toEqual(Array.from(uncached.logprobs));
      rank.dispose();
      comm.close();
    });
  }
});
