import { beforeAll, describe, expect, it, vi } from 'vitest';
import * as tf from '@tensorflow/tfjs';
import { Comm } from '../../mesh/parallel/index.ts';
import { MemoryBus, subjects } from '../../mesh/wire/index.ts';
import { initBackend } from './backend/backend.ts';
import { KV_GROWTH, KvCache, kvCacheBytes } from './kv-cache.ts';
import { GptRank } from './rank.ts';
import { responseLengths } from './mask.ts';

describe('KV cache', () => {
  beforeAll(async () => {
    await initBackend('wasm');
  });

  it('writes positions in place and masks what a query may not see', () => {
    const cache = new KvCache(2, 3, 4); // 2 rows, head size 3, 4 positions
    // Positions 0-1 of both rows, then position 2.
    const kT = tf.tensor3d([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [2, 3, 2]);
    const v = tf.tensor3d([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [2, 2, 3]);
    cache.write(0, 0, kT, v);
    const layer = cache.write(0, 2, tf.tensor3d([20, 21, 22, 23, 24, 25], [2, 3, 1]), tf.tensor3d([30, 31, 32, 33, 34, 35], [2, 1, 3]));
    // k rows are [capacity, hd]: row 0 holds positions 0, 1, 2 (its keys: the columns of kT) and zeros not yet written.
    expect(Array.from(layer.k.dataSync().slice(0, 12))).toEqual([1, 3, 5, 2, 4, 6, 20, 21, 22, 0, 0, 0]);
    // vT rows are [hd, capacity]: row 0, head dim 0 holds positions 0, 1, 2 = 1, 4, 30 and a zero.
    expect(Array.from(layer.vT.dataSync().slice(0, 12))).toEqual([1, 4, 30, 0, 2, 5, 31, 0, 3, 6, 32, 0]);
    // Queries at positions 1 and 2 see positions up to their own.
    expect(Array.from(cache.mask(1, 2).dataSync())).toEqual([0, 0, -1e9, -1e9, 0, 0, 0, -1e9]);
    expect(() => cache.write(0, 3, tf.zeros([2, 3, 2]), tf.zeros([2, 2, 3]))).toThrow('the KV cache holds 4 positions; positions 3-5 do not fit');
    cache.dispose();
    expect(kvCacheBytes(2, 3, 4, 5)).toBe(2 * 2 * 3 * 4 * 5 * 4);
  });

  it('decodes the same tokens as running the whole prefix again for every token, and frees its memory', async () => {
    const spec = { kind: 'policy' as const, vocab: 7, context: 24, layers: 2, width: 8, heads: 2 };
    const comm = new Comm(new MemoryBus(), subjects('kv'), 0);
    const rank = new GptRank(spec, { devices: [0], dp: 1, tp: 1, pp: 1 }, 0, 3, undefined, comm);
    const prompts = Int32Array.from({ length: 3 * 4 }, (_, i) => (i * 5) % 7);
    const seeds = new Uint32Array([1, 2, 3]);
    const before = tf.memory().numTensors;
    const cached = await rank.generate('a', prompts, 3, 4, 20, seeds, { temperature: 1, cache: true });
    expect(tf.memory().numTensors).toBe(before);
    const recomputed = await rank.generate('b', prompts, 3, 4, 20, seeds, { temperature: 1, cache: false });
    expect(Array.from(cached.tokens)).toEqual(Array.from(recomputed.tokens));
    expect(Array.from(cached.logprobs)).toEqual(Array.from(recomputed.logprobs));
    await expect(rank.generate('c', prompts, 3, 4, 21, seeds, { temperature: 1 })).rejects.toThrow('a prompt of 4 and a response of 21 tokens exceed the context of 24');
    rank.dispose();
    comm.close();
  });

  for (const [family, extra] of [
    ['gpt2', {}],
    ['llama', { family: 'llama' as const, kvHeads: 1, ffn: 64, ropeTheta: 500 }],
  ] as const) {
    it(`${family}: a cache that grows (${KV_GROWTH} positions at a time) decodes, over heads of 64, the same tokens, log-probs and logits as reading the whole prefix`, async () => {
      // Heads of 64: every product sums more than the 48 terms the wasm backend's batched kernel
      // sums at a time (blocks.ts batchMatMul never uses it, so both ways sum in the same order).
      const spec = { kind: 'policy' as const, vocab: 7, context: 100, layers: 1, width: 128, heads: 2, ...extra };
      const comm = new Comm(new MemoryBus(), subjects(`grow-${family}`), 0);
      const rank = new GptRank(spec, { devices: [0], dp: 1, tp: 1, pp: 1 }, 0, 3, undefined, comm);
      const prompts = Int32Array.from({ length: 2 * 4 }, (_, i) => (i * 5) % 7);
      const seeds = new Uint32Array([1, 2]);
      const widths: number[] = [];
      const mask = vi.spyOn(KvCache.prototype, 'mask');
      const cached = await rank.generate('a', prompts, 2, 4, 3 * KV_GROWTH + 5, seeds, { temperature: 1 });
      for (const r of mask.mock.results) widths.push((r.value as tf.Tensor).shape.at(-1)!);
      mask.mockRestore();
      // The width attended to grew with the positions written, a step of KV_GROWTH at a time, up to the capacity.
      expect(widths[0]).toBe(KV_GROWTH);
      expect(widths.at(-1)).toBe(4 + 3 * KV_GROWTH + 5);
      expect(new Set(widths).size).toBe(Math.ceil((4 + 3 * KV_GROWTH + 5) / KV_GROWTH));
      const recomputed = await rank.generate('b', prompts, 2, 4, 3 * KV_GROWTH + 5, seeds, { temperature: 1, cache: false });
      expect(Array.from(cached.tokens)).toEqual(Array.from(recomputed.tokens));
      expect(Array.from(cached.logprobs)).toEqual(Array.from(recomputed.logprobs));
      // The logits themselves: a token at a time against the whole prefix read at once, bit for bit.
      const seq = Array.from({ length: 90 }, (_, i) => (i * 3 + 1) % 7);
      const one = await rank.decoder('one', 1, 100);
      const stepped: Float32Array[] = [];
      await one.pass(Int32Array.from(seq.slice(0, 4)), 4, new Int32Array([0]), new Int32Array([3]));
      for (let p = 4; p < seq.length; p++) stepped[p] = await one.pass(new Int32Array([seq[p]!]), 1, new Int32Array([p]), new Int32Array([0]));
      one.dispose();
      for (const p of [4, 20, 47, 48, 63, 64, 89]) {
        const whole = await rank.decoder(`whole-${p}`, 1, 100);
        const at = await whole.pass(Int32Array.from(seq.slice(0, p + 1)), p + 1, new Int32Array([0]), new Int32Array([p]));
        whole.dispose();
        expect(Array.from(at), `position ${p}`).toEqual(Array.from(stepped[p]!));
      }
      rank.dispose();
      comm.close();
    });
  }

  it('stops each row at its end token, the same tokens up to it as without one, and stops when every row has ended', async () => {
    const spec = { kind: 'policy' as const, vocab: 7, context: 24, layers: 2, width: 8, heads: 2 };
    const comm = new Comm(new MemoryBus(), subjects('eos'), 0);
    const rank = new GptRank(spec, { devices: [0], dp: 1, tp: 1, pp: 1 }, 0, 3, undefined, comm);
    const prompts = Int32Array.from({ length: 6 * 4 }, (_, i) => (i * 5) % 7);
    const seeds = Uint32Array.from({ length: 6 }, (_, i) => 40 + i);
    const [P, R, EOS] = [4, 20, 2];
    const free = await rank.generate('free', prompts, 6, P, R, seeds, { temperature: 1 });
    const before = tf.memory().numTensors;
    const ended = await rank.generate('eos', prompts, 6, P, R, seeds, { temperature: 1, eos: EOS });
    expect(tf.memory().numTensors).toBe(before);
    const lengths = responseLengths(ended.tokens, P, R, EOS);
    expect(Math.max(...lengths)).toBeLessThan(R); // every row ended within the budget here
    expect(ended.steps).toBe(Math.max(...lengths)); // and decoding stopped with the last of them
    for (let b = 0; b < 6; b++) {
      const row = (t: Int32Array) => Array.from(t.subarray(b * (P + R) + P, (b + 1) * (P + R)));
      const L = lengths[b]!;
      // Each row draws from its own stream: up to its end it is what it would have been anyway.
      expect(row(ended.tokens).slice(0, L)).toEqual(row(free.tokens).slice(0, L));
      expect(
        row(ended.tokens)
          .slice(L)
          .every((x) => x === EOS),
      ).toBe(true);
      expect(Array.from(ended.logprobs.subarray(b * R, (b + 1) * R)).slice(0, L)).toEqual(Array.from(free.logprobs.subarray(b * R, (b + 1) * R)).slice(0, L));
      expect(Array.from(ended.logprobs.subarray(b * R + L, (b + 1) * R)).every((x) => x === 0)).toBe(true);
    }
    // Without the cache: the same tokens.
    const slow = await rank.generate('slow', prompts, 6, P, R, seeds, { temperature: 1, eos: EOS, cache: false });
    expect(Array.from(slow.tokens)).toEqual(Array.from(ended.tokens));
    // A cache that would not fit is refused before anything is allocated.
    await expect(rank.generate('big', prompts, 6, P, R, seeds, { temperature: 1, memoryBytes: 1000 })).rejects.toThrow(/^generating 6 sequences of 4 \+ 20 tokens: its KV cache needs 18\.0 KiB/);
    await expect(rank.generate('bad', prompts, 6, P, R, seeds, { temperature: 1, topP: 2 })).rejects.toThrow('top_p must be in (0, 1] (1: off), got 2');
    rank.dispose();
    comm.close();
  });
});

describe('sequences at positions of their own (episodes of several turns)', () => {
  beforeAll(async () => {
    await initBackend('wasm');
  });

  it('a start per sequence writes each at its own positions; the one-hot placement writes the same values as in place', () => {
    const write = (inPlace: boolean) => {
      const cache = new KvCache(4, 2, 6, { inPlace }); // 2 sequences × 2 heads, head size 2, 6 positions
      cache.write(0, new Int32Array([0, 0]), tf.range(1, 17).reshape([4, 2, 2]), tf.range(1, 17).reshape([4, 2, 2]));
      const layer = cache.write(0, new Int32Array([2, 4]), tf.range(21, 29).reshape([4, 2, 1]), tf.range(21, 29).reshape([4, 1, 2]));
      const out = { k: Array.from(layer.k.dataSync()), vT: Array.from(layer.vT.dataSync()) };
      cache.dispose();
      return out;
    };
    const inPlace = write(true);
    expect(write(false)).toEqual(inPlace);
    // Sequence 0's first head: positions 0, 1 from the first write, 2 from the second; sequence 1's
    // (row 2) at 4. Keys [position, hd] a row; values transposed, [hd, position].
    expect(inPlace.k.slice(0, 12)).toEqual([1, 3, 2, 4, 21, 22, 0, 0, 0, 0, 0, 0]);
    expect(inPlace.k.slice(24, 36)).toEqual([9, 11, 10, 12, 0, 0, 0, 0, 25, 26, 0, 0]);
    expect(inPlace.vT.slice(24, 30)).toEqual([9, 11, 0, 0, 25, 0]);
    const cache = new KvCache(4, 2, 6);
    // Query 0 of sequence 1 at position 4 (its left padding: 1) sees positions 1..4.
    expect(Array.from(cache.mask(new Int32Array([2, 4]), 1, new Int32Array([0, 1])).dataSync()).slice(6, 12)).toEqual([-1e9, 0, 0, 0, 0, -1e9]);
    expect(() => cache.write(0, new Int32Array([2, 5]), tf.zeros([4, 2, 2]), tf.zeros([4, 2, 2]))).toThrow('the KV cache holds 6 positions; positions 5-7 do not fit');
    cache.dispose();
  });

  const base = { kind: 'policy' as const, vocab: 9, context: 32, layers: 2, width: 8, heads: 2 };
  for (const [family, spec] of [
    ['gpt2', base],
    ['llama', { ...base, family: 'llama' as const, kvHeads: 1, ffn: 16, ropeTheta: 500 }],
  ] as const) {
    it(`${family}: passes of uneven lengths, rows that sit some out, give each row the log-probs of reading its whole sequence`, async () => {
      const comm = new Comm(new MemoryBus(), subjects(`rows-${family}`), 0);
      const rank = new GptRank(spec, { devices: [0], dp: 1, tp: 1, pp: 1 }, 0, 5, undefined, comm);
      const P = 4;
      // What each row is fed, pass by pass ([] sits the pass out): a prompt, then turns of uneven lengths.
      const feeds: number[][][] = [
        [
          [1, 2, 3, 4],
          [5, 6, 7, 8],
          [2, 2, 3, 3],
        ],
        [[1], [3], [4, 5, 6]],
        [[7, 8], [], [1]],
        [[2], [4, 4, 4], []],
        [[], [5], [8]],
      ];
      const rows = 3;
      const seqs: number[][] = [[], [], []];
      const before = tf.memory().numTensors;
      const dec = await rank.decoder('rows', rows, 16);
      // logits[r][p]: row r's logits after its position p (the prediction of position p + 1).
      const predicted: Array<Map<number, Float32Array>> = [new Map(), new Map(), new Map()];
      for (const pass of feeds) {
        const n = Math.max(...pass.map((f) => f.length));
        const tokens = new Int32Array(rows * n);
        const starts = Int32Array.from(seqs, (s) => s.length);
        pass.forEach((f, r) => tokens.set(f, r * n));
        const logits = await dec.pass(
          tokens,
          n,
          starts,
          Int32Array.from(pass, (f) => Math.max(f.length - 1, 0)),
        );
        pass.forEach((f, r) => {
          if (!f.length) return;
          seqs[r]!.push(...f);
          predicted[r]!.set(seqs[r]!.length - 1, logits.slice(r * base.vocab, (r + 1) * base.vocab));
        });
      }
      dec.dispose();
      expect(tf.memory().numTensors).toBe(before);
      // Reading the whole sequences at once (padded to one width at their ends, which no earlier position sees).
      const W = Math.max(...seqs.map((s) => s.length));
      const whole = new Int32Array(rows * W);
      seqs.forEach((s, r) => whole.set(s, r * W));
      const lp = await rank.infer('whole', whole, rows, P);
      let compared = 0;
      for (let r = 0; r < rows; r++) {
        for (const [p, logits] of predicted[r]!) {
          if (p + 1 >= seqs[r]!.length) continue;
          const m = Math.max(...logits);
          const lse = m + Math.log(logits.reduce((a, x) => a + Math.exp(x - m), 0));
          expect(logits[seqs[r]![p + 1]!]! - lse).toBeCloseTo(lp[r * (W - P) + (p + 1 - P)]!, 4);
          compared += 1;
        }
      }
      expect(compared).toBe(9);
      rank.dispose();
      comm.close();
    });
  }
});

describe('KV cache rows copied out and put back (take, put)', () => {
  beforeAll(async () => {
    await initBackend('wasm');
  });

  for (const inPlace of [true, false]) {
    it(`${inPlace ? 'in place' : 'on a backend out of the host\u2019s reach'}: rows leave and come back into other rows exactly, the others untouched`, () => {
      const [rows, hd, heads] = [6, 2, 2]; // 3 sequences of 2 heads
      const cache = new KvCache(rows, hd, 40, { inPlace });
      const starts = Int32Array.of(0, 0, 0);
      // 20 positions of every row, then 3 more for each sequence at its own position.
      cache.write(0, 0, tf.randomNormal([rows, hd, 20], 0, 1, 'float32', 1), tf.randomNormal([rows, 20, hd], 0, 1, 'float32', 2));
      starts.set([20, 20, 20]);
      const layer = cache.write(0, starts, tf.randomNormal([rows, hd, 3], 0, 1, 'float32', 3), tf.randomNormal([rows, 3, hd], 0, 1, 'float32', 4));
      const [k, vT] = [Array.from(layer.k.dataSync()), Array.from(layer.vT.dataSync())];
      const W = layer.k.shape[1]!;
      const kRow = (a: number[], r: number) => a.slice(r * W * hd, (r + 1) * W * hd);
      const vRow = (a: number[], r: number) => a.slice(r * hd * W, (r + 1) * hd * W);
      const out = cache.take([2], heads);
      expect(out.rows).toBe(heads);
      // Sequence 2 goes into sequence 0's place: its rows there, sequence 1's as they were.
      cache.put([0], out, heads);
      const after = cache.write(0, Int32Array.of(23, 23, 23), tf.zeros([rows, hd, 1]), tf.zeros([rows, 1, hd]));
      const [k2, v2] = [Array.from(after.k.dataSync()), Array.from(after.vT.dataSync())];
      const W2 = after.k.shape[1]!;
      expect(W2).toBe(W);
      for (const [dst, src] of [
        [0, 4],
        [1, 5],
        [2, 2],
        [3, 3],
        [4, 4],
        [5, 5],
      ] as const) {
        // Positions 0..22 as they were in the source row (23 is the zeros just written).
        expect(kRow(k2, dst).slice(0, 23 * hd), `k row ${dst}`).toEqual(kRow(k, src).slice(0, 23 * hd));
        for (let d = 0; d < hd; d++) expect(vRow(v2, dst).slice(d * W, d * W + 23), `vT row ${dst}, element ${d}`).toEqual(vRow(vT, src).slice(d * W, d * W + 23));
      }
      out.dispose();
      cache.dispose();
    });
  }
});
