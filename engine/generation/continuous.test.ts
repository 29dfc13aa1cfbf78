// Continuous generation is exact: a sample's tokens and log-probabilities are those of the same
// sample generated alone, bit for bit, whatever shared its slots and whenever it took one.
import { beforeAll, describe, expect, it } from 'vitest';
import * as tf from '@tensorflow/tfjs';
import { Comm } from '../../mesh/parallel/index.ts';
import { MemoryBus, subjects } from '../../mesh/wire/index.ts';
import { GptRank, initBackend, responseLengths } from '../model/index.ts';
import { generateContinuous, generateRows } from './continuous.ts';
import { mesh } from '../../test/in-memory-mesh.ts';
import { decode, SampleLog, type Layout } from '../../mesh/wire/index.ts';

describe('continuous generation', () => {
  beforeAll(async () => {
    await initBackend('wasm');
  });

  const small = { context: 40, layers: 2, width: 16, heads: 4 };
  for (const arch of [
    { name: 'gpt-2', R: 30, ...small },
    { name: 'llama (grouped KV heads, SwiGLU, rotary, left-padded prompts)', R: 30, ...small, family: 'llama', kvHeads: 2, ffn: 48, pad: 0 },
    // Heads of 64 over up to 80 positions: products of more than the 48 terms the wasm backend's batched kernel sums at a time.
    { name: 'gpt-2, heads of 64, responses of up to 75 tokens', R: 75, context: 80, layers: 1, width: 128, heads: 2, vocab: 48 },
  ] as const) {
    it(`${arch.name}: every sample equals the same sample generated alone, in 1, 3, 4 or 9 slots`, async () => {
      const { name: _name, R, ...family } = arch;
      const spec = { kind: 'policy' as const, vocab: 11, ...family };
      const comm = new Comm(new MemoryBus(), subjects(`cont-${arch.name.length}`), 0);
      const rank = new GptRank(spec, { devices: [0], dp: 1, tp: 1, pp: 1 }, 0, 5, undefined, comm);
      const [N, P, eos] = [9, 5, 2];
      // Left padding (token 0) of 0 to 2 tokens where the family has a pad token.
      const prompts = Int32Array.from({ length: N * P }, (_, i) => ('pad' in family && i % P < (i / P) % 3 ? 0 : 1 + ((i * 7 + 3) % 10)));
      const seeds = Uint32Array.from({ length: N }, (_, i) => 1000 + 17 * i);
      const sampling = { temperature: 0.8 };
      const alone: Array<{ tokens: Int32Array; logprobs: Float32Array }> = [];
      for (let i = 0; i < N; i++) alone.push(await rank.generate(`one-${i}`, prompts.slice(i * P, (i + 1) * P), 1, P, R, seeds.slice(i, i + 1), { ...sampling, eos }));
      const lengths = responseLengths(Int32Array.from(alone.flatMap((a) => Array.from(a.tokens))), P, R, eos);
      // The responses end at different steps (else no slot would be given over mid-way).
      expect(new Set(lengths).size).toBeGreaterThan(3);
      if (R > 48) expect(Math.max(...lengths)).toBeGreaterThan(48);
      const before = tf.memory().numTensors;
      for (const slots of [1, 3, 4, 9]) {
        const heard: number[] = [];
        const out = await generateContinuous((rows, capacity) => rank.decoder(`c-${slots}`, rows, capacity, { what: 'continuous generations' }), {
          prompts,
          seeds,
          promptLen: P,
          responseLen: R,
          vocab: spec.vocab,
          eos,
          slots,
          ...sampling,
          onSample: (i, tokens, logprobs) => {
            heard.push(i);
            expect(Array.from(tokens), `sample ${i} as it ended, ${slots} slots`).toEqual(Array.from(alone[i]!.tokens));
            expect(Array.from(logprobs), `sample ${i} as it ended, ${slots} slots`).toEqual(Array.from(alone[i]!.logprobs));
          },
        });
        for (let i = 0; i < N; i++) {
          expect(Array.from(out.tokens.subarray(i * (P + R), (i + 1) * (P + R))), `sample ${i}, ${slots} slots`).toEqual(Array.from(alone[i]!.tokens));
          expect(Array.from(out.logprobs.subarray(i * R, (i + 1) * R)), `sample ${i}, ${slots} slots`).toEqual(Array.from(alone[i]!.logprobs));
        }
        // Each sample is heard once, as it ends: with fewer slots than samples, in the order they end, not the queue's.
        expect([...heard].sort((a, b) => a - b)).toEqual(Array.from({ length: N }, (_, i) => i));
        if (slots < N) expect(out.prefills).toBeGreaterThan(1);
        // One slot: every token but a response's first (the prefill's) takes a pass.
        if (slots === 1) expect(out.steps).toBe(lengths.reduce((a, b) => a + b, 0) - N);
        expect(out.occupancy).toBeGreaterThan(0);
        expect(out.occupancy).toBeLessThanOrEqual(1);
      }
      expect(tf.memory().numTensors).toBe(before);
      rank.dispose();
      comm.close();
    }, 60_000);
  }

  it('keeps the slots full: in fewer decoding passes than a batch at a time of the same size, the same samples', async () => {
    const spec = { kind: 'policy' as const, vocab: 11, context: 48, layers: 1, width: 16, heads: 2 };
    const comm = new Comm(new MemoryBus(), subjects('cont-full'), 0);
    const rank = new GptRank(spec, { devices: [0], dp: 1, tp: 1, pp: 1 }, 0, 9, undefined, comm);
    const [N, P, R, S] = [24, 3, 40, 4];
    const prompts = Int32Array.from({ length: N * P }, (_, i) => 1 + (i % 9));
    const seeds = Uint32Array.from({ length: N }, (_, i) => 50 + i);
    const body = { prompts, batch: N, promptLen: P, responseLen: R, seeds, eos: 2, temperature: 1, slots: S };
    const out = await generateRows(rank, 'full', body);
    // Batches of S at a time, each decoded to its longest response.
    let passes = 0;
    for (let lo = 0; lo < N; lo += S) {
      const lock = await rank.generate(`lock-${lo}`, prompts.subarray(lo * P, (lo + S) * P), S, P, R, seeds.subarray(lo, lo + S), { temperature: 1, eos: 2 });
      expect(Array.from(out.tokens.subarray(lo * (P + R), (lo + S) * (P + R)))).toEqual(Array.from(lock.tokens));
      passes += lock.steps;
    }
    expect(out.steps).toBeLessThan(passes);
    expect(out.occupancy).toBeGreaterThan(0.5);
    rank.dispose();
    comm.close();
  }, 60_000);

  for (const layout of [
    { devices: [0, 1], dp: 2, tp: 1, pp: 1 },
    { devices: [0, 1], dp: 1, tp: 2, pp: 1 },
  ] satisfies Layout[]) {
    it(`dp = ${layout.dp}, tp = ${layout.tp}: a generate call with slots gives, and sends as each row ends, the rows of the call without`, async () => {
      const spec = { kind: 'policy' as const, vocab: 11, context: 40, layers: 2, width: 16, heads: 4, family: 'llama' as const, kvHeads: 2, ffn: 32, pad: 0 };
      const m = mesh(layout);
      await m.run('actor', (rank) => ({ fn: 'load', role: 'actor', spec, layout, rank, seed: 7 }));
      const [N, P, R] = [10, 4, 30];
      const prompts = Int32Array.from({ length: N * P }, (_, i) => (i % P < (i / P) % 2 ? 0 : 1 + ((i * 3) % 10)));
      const seeds = Uint32Array.from({ length: N }, (_, i) => 300 + i);
      const call = { fn: 'generate' as const, prompts, batch: N, promptLen: P, responseLen: R, seeds, temperature: 1, eos: 2 };
      const batch = await m.run('actor', () => call);
      const heard: SampleLog[] = [];
      const sub = m.bus.subscribe(m.subj.allSamples, { callback: (_e, msg) => heard.push(decode(msg.subject, msg.data, SampleLog)) });
      const slots = await m.run('actor', () => ({ ...call, slots: 2, samples: 'actor__generate' }));
      sub.unsubscribe();
      for (const key of ['tokens', 'logprobs']) expect(Array.from(m.gather(slots, key))).toEqual(Array.from(m.gather(batch, key)));
      // Each row once, from its replica's speaking rank, as the reply holds it.
      const tokens = m.gather<Int32Array>(batch, 'tokens');
      expect(heard.map((h) => h.row).sort((a, b) => a - b)).toEqual(Array.from({ length: N }, (_, i) => i));
      for (const h of heard) expect(Array.from(h.tokens)).toEqual(Array.from(tokens.subarray(h.row * (P + R), (h.row + 1) * (P + R))));
    }, 30_000);
  }

  it('refuses slots that are not a whole number of at least 1, and a layout of several stages', async () => {
    const spec = { kind: 'policy' as const, vocab: 11, context: 16, layers: 2, width: 8, heads: 2 };
    const comm = new Comm(new MemoryBus(), subjects('cont-bad'), 0);
    const rank = new GptRank(spec, { devices: [0], dp: 1, tp: 1, pp: 1 }, 0, 1, undefined, comm);
    const body = { prompts: new Int32Array(6), batch: 2, promptLen: 3, responseLen: 4, seeds: new Uint32Array(2), temperature: 1 };
    await expect(generateRows(rank, 'bad', { ...body, slots: 0 })).rejects.toThrow('slots must be a whole number of at least 1; got 0');
    await expect(generateRows(rank, 'bad', { ...body, slots: 1.5 })).rejects.toThrow('slots must be a whole number of at least 1; got 1.5');
    rank.dispose();
    const staged = new GptRank(spec, { devices: [0, 1], dp: 1, tp: 1, pp: 2 }, 0, 1, undefined, comm);
    await expect(generateRows(staged, 'bad', { ...body, slots: 2 })).rejects.toThrow('continuous generations are generated by a replica on one stage (pp = 1); this layout has tp = 1, pp = 2');
    staged.dispose();
    comm.close();
  });
});
