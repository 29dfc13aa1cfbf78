import { describe, expect, it } from 'vitest';
import { initBackend } from './backend.ts';

describe('initBackend', () => {
  it('auto falls through node-gpu and node (not installed here) to wasm', async () => {
    expect(await initBackend('auto')).toBe('wasm');
    const tf = await import('@tensorflow/tfjs');
    expect(tf.getBackend()).toBe('wasm');
  });

  it('asking for a backend that is not installed says what to install', async () => {
    await expect(initBackend('node-gpu')).rejects.toThrow(/backend 'node-gpu' is not available \(npm install @tensorflow\/tfjs-node-gpu\)/);
  });

  it('cpu is always there', async () => {
    expect(await initBackend('cpu')).toBe('cpu');
  });
});
