import { beforeAll, describe, expect, it } from 'vitest';
import * as tf from '@tensorflow/tfjs';
import { Comm } from '../../mesh/parallel/index.ts';
import { MemoryBus, subjects } from '../../mesh/wire/index.ts';
import { initBackend } from './backend.ts';
import { KvCache, kvCacheBytes } from './kv-cache.ts';
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
    // kT rows are [hd, capacity]: row 0, head dim 0 holds positions 0, 1, 2 = 1, 2, 20 and a zero not yet written.
    expect(Array.from(layer.kT.dataSync().slice(0, 12))).toEqual([1, 2, 20, 0, 3, 4, 21, 0, 5, 6, 22, 0]);
    expect(Array.from(layer.v.dataSync().slice(0, 12))).toEqual([1, 2, 3, 4, 5, 6, 30, 31, 32, 0, 0, 0]);
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
