import { beforeAll, describe, expect, it } from 'vitest';
import * as tf from '@tensorflow/tfjs';
import { MemoryBus } from '../../mesh/wire/bus/memory-bus.ts';
import { subjects } from '../../mesh/wire/bus/subjects.ts';
import { Comm } from '../../mesh/parallel/comm.ts';
import { initBackend } from './backend/backend.ts';
import { GptRank } from './rank.ts';

describe('GptRank memory (one device)', () => {
  beforeAll(async () => {
    await initBackend('cpu');
  });

  it('frees everything it made: load, replace the weights, generate, train, dispose', async () => {
    const spec = { kind: 'policy' as const, vocab: 5, context: 6, layers: 1, width: 8, heads: 2 };
    const comm = new Comm(new MemoryBus(), subjects('mem'), 0);
    const before = tf.memory().numTensors;
    const shard = new GptRank(spec, { devices: [0], dp: 1, tp: 1, pp: 1 }, 0, 1, { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, clipNorm: 1 }, comm);
    for (let i = 0; i < 5; i++) shard.weights.importTensors(shard.weights.exportTensors());
    const prompts = new Int32Array([1, 2, 3, 4]);
    const g = await shard.generate('g0', prompts, 2, 2, 2, new Uint32Array([1, 2]), { temperature: 1 });
    const loss = { name: 'clip_policy', params: { clip: 0.2 } };
    const afterFirst = tf.memory().numTensors;
    await shard.train('g1', g.tokens, 2, 2, 2, loss, { old: g.logprobs, advantages: new Float32Array(4).fill(0.5) }, 2, 2, 1);
    const afterOptimizerState = tf.memory().numTensors;
    await shard.train('g2', g.tokens, 2, 2, 2, loss, { old: g.logprobs, advantages: new Float32Array(4).fill(0.5) }, 2, 2, 2);
    // Adam's moments appear with the first step; later steps add nothing.
    expect(tf.memory().numTensors).toBe(afterOptimizerState);
    expect(afterOptimizerState).toBeGreaterThan(afterFirst);
    shard.dispose();
    comm.close();
    expect(tf.memory().numTensors).toBe(before);
  });
});
