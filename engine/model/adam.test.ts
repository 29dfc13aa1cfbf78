import * as tf from '@tensorflow/tfjs';
import { beforeAll, describe, expect, it } from 'vitest';
import { Adam } from './adam.ts';
import { initBackend } from './backend/backend.ts';

describe('Adam', () => {
  beforeAll(async () => {
    await initBackend('cpu');
  });

  it('takes the textbook steps (hand-computed) and its state restores the next step exactly', () => {
    // Step 1 with g: m = 0.1g, v = 0.001g², m̂ = g, v̂ = g² → θ −= lr·g/(|g| + ε).
    // Step 2 with the same g: m = 0.19g, v = 0.001999g², m̂ = g, v̂ = g² → the same step again.
    const lr = 0.1;
    const adam = new Adam(lr, 0.9, 0.999, 1e-8);
    const theta = tf.variable(tf.tensor1d([1, -2, 0.5]));
    const g = tf.tensor1d([0.2, -4, 0]);
    adam.apply([{ name: 'w', variable: theta, gradient: g }]);
    const one = Array.from(theta.dataSync());
    expect(one[0]).toBeCloseTo(1 - lr * (0.2 / (0.2 + 1e-8)), 6);
    expect(one[1]).toBeCloseTo(-2 + lr * (4 / (4 + 1e-8)), 6);
    expect(one[2]).toBeCloseTo(0.5, 9);
    const saved = adam.state();
    expect(saved.step).toBe(1);
    adam.apply([{ name: 'w', variable: theta, gradient: g }]);
    const two = Array.from(theta.dataSync());
    expect(two[0]).toBeCloseTo(one[0]! - lr, 5);

    // The same second step from the saved state, on a copy of the first step's weights: bit-identical.
    const copy = tf.variable(tf.tensor1d(one));
    const restored = new Adam(lr, 0.9, 0.999, 1e-8);
    restored.load(saved, () => [3]);
    restored.apply([{ name: 'w', variable: copy, gradient: g }]);
    expect(Array.from(copy.dataSync())).toEqual(two);
    tf.dispose([theta, g, copy]);
    adam.dispose();
    restored.dispose();
  });
});
