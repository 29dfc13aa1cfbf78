// In-flight weight updates are exact too: a sample whose session went on with a newer version
// mid-way equals the same sample generated alone with the same switch at the same token, bit for
// bit, whatever shared its slots; its log-probabilities are read off the logits each token was
// drawn from, and each token names the version that drew it.
import { beforeAll, describe, expect, it } from 'vitest';
import * as tf from '@tensorflow/tfjs';
import { Comm } from '../../mesh/parallel/index.ts';
import { MemoryBus, subjects } from '../../mesh/wire/index.ts';
import { GptRank, initBackend, responseLengths, type GptSpec } from '../model/index.ts';
import { generateContinuous, type ContinuousOptions, type Inflight } from './continuous.ts';

describe('in-flight weight updates', () => {
  beforeAll(async () => {
    await initBackend('wasm');
  });

  const small = { context: 40, layers: 2, width: 16, heads: 4 };
  for (const arch of [
    { name: 'gpt-2', ...small },
    { name: 'llama (grouped KV heads, SwiGLU, rotary, left-padded prompts)', ...small, family: 'llama', kvHeads: 2, ffn: 48, pad: 0 },
  ] as const) {
    it(`${arch.name}: a sample equals itself generated alone with the switch at the same token, keep and recompute`, async () => {
      const { name: _name, ...family } = arch;
      const spec: GptSpec = { kind: 'policy', vocab: 11, ...family };
      const comm = new Comm(new MemoryBus(), subjects(`inflight-${arch.name.length}`), 0);
      const layout = { devices: [0], dp: 1, tp: 1, pp: 1 };
      // Two versions of one model: the same shapes, other weights.
      const old = new GptRank(spec, layout, 0, 5, undefined, comm);
      const fresh = new GptRank(spec, layout, 0, 6, undefined, comm);
      const [N, P, R, eos] = [9, 5, 30, 2];
      const prompts = Int32Array.from({ length: N * P }, (_, i) => ('pad' in family && i % P < (i / P) % 3 ? 0 : 1 + ((i * 7 + 3) % 10)));
      const seeds = Uint32Array.from({ length: N }, (_, i) => 1000 + 17 * i);
      const base = { promptLen: P, responseLen: R, vocab: spec.vocab, eos, temperature: 0.8 };
      const run = (tag: string, o: Partial<ContinuousOptions> & { slots: number }, from = old) =>
        generateContinuous((rows, capacity) => from.decoder(tag, rows, capacity, { what: 'continuous generations' }), { prompts, seeds, ...base, ...o });
      /** Switches to `fresh` before pass `step`. */
      const switchAt = (step: number, kv: Inflight['kv']): Inflight => ({
        version: 3,
        kv,
        at: (s) => (s === step ? { version: 4, rank: () => fresh.decodingRank(`sw-${step}`, { what: 'continuous generations' }) } : undefined),
      });
      const before = tf.memory().numTensors;

      // No switch: the log-probabilities drawn with the tokens are the forward pass's, bit for bit.
      const plain = await run('plain', { slots: 3 });
      const unswitched = await run('unswitched', { slots: 3, inflight: { version: 3, kv: 'keep', at: () => undefined } });
      expect(Array.from(unswitched.tokens)).toEqual(Array.from(plain.tokens));
      expect(Array.from(unswitched.logprobs)).toEqual(Array.from(plain.logprobs));
      const lengths = responseLengths(plain.tokens, P, R, eos);
      expect(new Set(lengths).size).toBeGreaterThan(3);
      for (let i = 0; i < N; i++) for (let j = 0; j < R; j++) expect(unswitched.versions![i * R + j]).toBe(j < lengths[i]! ? 3 : -1);

      const outs: Record<string, Awaited<ReturnType<typeof run>>> = {};
      for (const kv of ['keep', 'recompute'] as const) {
        const step = 6;
        const heard = new Map<number, Int32Array>();
        const out = await run(`${kv}-3`, { slots: 3, inflight: switchAt(step, kv), onSample: (i, _t, _l, v) => heard.set(i, v!.slice()) });
        outs[kv] = out;
        expect(out.switches).toEqual([{ step, version: 4 }]);
        let mixed = 0;
        for (let i = 0; i < N; i++) {
          const v = Array.from(out.versions!.subarray(i * R, (i + 1) * R));
          expect(Array.from(heard.get(i)!), `sample ${i} as it ended`).toEqual(v);
          const len = responseLengths(out.tokens.subarray(i * (P + R), (i + 1) * (P + R)), P, R, eos)[0]!;
          // The first token the new version drew: versions go 3 … 3, 4 … 4, then −1 after the end.
          const j = v.indexOf(4) < 0 ? len : v.indexOf(4);
          expect(v).toEqual(Array.from({ length: R }, (_, t) => (t >= len ? -1 : t < j ? 3 : 4)));
          if (j > 0 && j < len) mixed += 1;
          // Alone, in one slot: token j is drawn from the pass before step j (token 0 from the prefill).
          const one = { prompts: prompts.slice(i * P, (i + 1) * P), seeds: seeds.slice(i, i + 1), slots: 1 };
          const alone =
            j === 0
              ? await run(`alone-${kv}-${i}`, { ...one, inflight: { version: 4, kv, at: () => undefined } }, fresh)
              : await run(`alone-${kv}-${i}`, { ...one, inflight: j < len ? switchAt(j - 1, kv) : { version: 3, kv, at: () => undefined } });
          expect(Array.from(out.tokens.subarray(i * (P + R), (i + 1) * (P + R))), `sample ${i}, switched at its token ${j}`).toEqual(Array.from(alone.tokens));
          expect(Array.from(out.logprobs.subarray(i * R, (i + 1) * R)), `sample ${i}, switched at its token ${j}`).toEqual(Array.from(alone.logprobs));
          expect(Array.from(out.versions!.subarray(i * R, (i + 1) * R))).toEqual(Array.from(alone.versions!));
        }
        // Some samples took both versions, and some came after the switch whole.
        expect(mixed).toBeGreaterThan(0);
      }
      // Recomputing the keys and values changes what the new version draws from (keeping them does not recompute).
      expect(Array.from(outs.recompute!.logprobs)).not.toEqual(Array.from(outs.keep!.logprobs));
      expect(tf.memory().numTensors).toBe(before);
      old.dispose();
      fresh.dispose();
      comm.close();
    }, 90_000);
  }

  it('recompute: a token drawn after the switch is what the new version draws over the whole sequence so far', async () => {
    const spec: GptSpec = { kind: 'policy', vocab: 11, context: 40, layers: 2, width: 16, heads: 4 };
    const comm = new Comm(new MemoryBus(), subjects('inflight-recompute'), 0);
    const layout = { devices: [0], dp: 1, tp: 1, pp: 1 };
    const old = new GptRank(spec, layout, 0, 5, undefined, comm);
    const fresh = new GptRank(spec, layout, 0, 6, undefined, comm);
    const [P, R] = [4, 20];
    const prompts = Int32Array.from([3, 1, 4, 1]);
    const seeds = Uint32Array.from([77]);
    const out = await generateContinuous((rows, capacity) => old.decoder('rc', rows, capacity, { what: 'continuous generations' }), {
      prompts,
      seeds,
      promptLen: P,
      responseLen: R,
      vocab: 11,
      temperature: 1,
      slots: 1,
      inflight: { version: 0, kv: 'recompute', at: (s) => (s === 7 ? { version: 1, rank: () => fresh.decodingRank('rc-new', { what: 'continuous generations' }) } : undefined) },
    });
    // Token 8 on was drawn by the new version: its log-probability is the new version's over the
    // whole sequence (a forward pass, as training reads it); token 7 and before, the old one's.
    const whole = await fresh.infer('rc-check', out.tokens, 1, P);
    const before = await old.infer('rc-check-old', out.tokens, 1, P);
    for (let t = 0; t < R; t++) expect(out.logprobs[t], `token ${t}`).toBe(t >= 8 ? whole[t] : before[t]);
    old.dispose();
    fresh.dispose();
    comm.close();
  }, 30_000);
});
