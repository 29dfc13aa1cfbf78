// Generation is batch-invariant: a sequence generated alone equals, bit for bit, the same
// sequence (same prompt, same seed) generated among others. A free-running run (rl.staleness)
// replays its recorded schedule on this: which rows a generation call holds must not change what
// any of them becomes.
import { beforeAll, describe, expect, it } from 'vitest';
import { Comm } from '../../mesh/parallel/index.ts';
import { MemoryBus, subjects } from '../../mesh/wire/index.ts';
import { initBackend } from './backend.ts';
import { GptRank } from './rank.ts';

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
  }
});
