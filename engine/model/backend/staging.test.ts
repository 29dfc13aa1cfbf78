import { describe, expect, it } from 'vitest';
import * as tf from '@tensorflow/tfjs';
import { Comm } from '../../../mesh/parallel/index.ts';
import { MemoryBus, subjects } from '../../../mesh/wire/index.ts';
import { initBackend } from './backend.ts';
import { GptRank } from '../rank.ts';
import { hostView, Staging } from './staging.ts';

describe.each(['wasm', 'cpu'] as const)('staged weights on %s', (backend) => {
  it('writes land in the tensor the backend computes from, with no copy left behind', async () => {
    await initBackend(backend);
    const staging = new Staging(new Map([['w', [2, 3]]]));
    staging.view('w').set([1, 2, 3], 0);
    // A growing heap (wasm) moves memory: every write takes a new view, so it still lands.
    const big = tf.zeros([1 << 20]);
    staging.view('w').set([4, 5, 6], 3);
    big.dispose();
    const [t] = staging.take().values();
    expect(hostView(t!)).toBeDefined();
    expect(Array.from(t!.dataSync())).toEqual([1, 2, 3, 4, 5, 6]);
    t!.dispose();
  });

  it('staged slices start as zeros, whatever the memory they take held before', async () => {
    await initBackend(backend);
    // Memory a disposed tensor held is handed out again by the backend's allocator.
    const dirty = tf.fill([4096], 7.5);
    dirty.dataSync();
    dirty.dispose();
    const staging = new Staging(new Map([['w', [64, 64]]]));
    expect(staging.view('w').every((x) => x === 0)).toBe(true);
    staging.dispose();
  });

  it('a rank commits staged slices as its weights without a copy, and a dropped staging frees what it held', async () => {
    await initBackend(backend);
    const spec = { kind: 'policy' as const, vocab: 5, context: 4, layers: 1, width: 4, heads: 2 };
    const comm = new Comm(new MemoryBus(), subjects('staging'), 0);
    const rank = new GptRank(spec, { devices: [0], dp: 1, tp: 1, pp: 1 }, 0, 1, undefined, comm);
    const before = tf.memory().numTensors;
    const dropped = rank.weights.stage(['wte']);
    dropped.dispose();
    expect(tf.memory().numTensors).toBe(before);
    const staging = rank.weights.stage(['wte', 'lnf.g']);
    const wte = staging.view('wte');
    wte.set(Float32Array.from({ length: wte.length }, (_, i) => i / 10));
    staging.view('lnf.g').fill(2);
    rank.weights.commit(staging);
    expect(tf.memory().numTensors).toBe(before);
    expect(Array.from(rank.weights.exportTensor('wte').slice(0, 3))).toEqual([0, 0.1, 0.2].map(Math.fround));
    expect(Array.from(rank.weights.exportTensor('lnf.g'))).toEqual([2, 2, 2, 2]);
    expect(() => rank.weights.stage(['nope'])).toThrow("rank 0 holds no parameter 'nope'");
    rank.dispose();
    comm.close();
  });
});
