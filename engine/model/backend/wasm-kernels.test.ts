import { beforeAll, describe, expect, it } from 'vitest';
import * as tf from '@tensorflow/tfjs';
import { initBackend } from './backend.ts';
import { copySlice } from './wasm-kernels.ts';

/** The block [begin, begin + size) of an array of `shape`, element by element. */
function naiveSlice(from: Float32Array, shape: number[], begin: number[], size: number[]): number[] {
  const out: number[] = [];
  const total = size.reduce((a, b) => a * b, 1);
  for (let k = 0; k < total; k++) {
    let rest = k;
    let offset = 0;
    let stride = 1;
    const idx = new Array<number>(shape.length);
    for (let i = shape.length - 1; i >= 0; i--) {
      idx[i] = rest % size[i]!;
      rest = Math.floor(rest / size[i]!);
    }
    for (let i = shape.length - 1; i >= 0; i--) {
      offset += (begin[i]! + idx[i]!) * stride;
      stride *= shape[i]!;
    }
    out.push(from[offset]!);
  }
  return out;
}

const CASES: Array<[number[], number[], number[]]> = [
  [[10], [3], [4]],
  [
    [4, 5],
    [1, 0],
    [2, 5],
  ], // contiguous rows
  [
    [4, 5],
    [1, 2],
    [3, 2],
  ], // a block
  [
    [3, 4, 5],
    [1, 0, 0],
    [1, 4, 5],
  ], // one matrix of a batch
  [
    [3, 4, 5],
    [0, 1, 2],
    [3, 2, 3],
  ],
  [
    [2, 3, 4, 5],
    [1, 1, 0, 1],
    [1, 2, 4, 3],
  ],
  [
    [2, 3, 4, 5],
    [0, 0, 0, 0],
    [2, 3, 4, 5],
  ], // the whole
  [
    [2, 3],
    [1, 0],
    [0, 3],
  ], // empty
];

describe('the wasm Slice replacement', () => {
  beforeAll(async () => {
    await initBackend('wasm');
  });

  it('copySlice takes the block element for element, contiguous or strided', () => {
    for (const [shape, begin, size] of CASES) {
      const from = Float32Array.from({ length: shape.reduce((a, b) => a * b, 1) }, (_, i) => i);
      const to = new Float32Array(size.reduce((a, b) => a * b, 1));
      copySlice(from, shape, begin, size, to);
      expect(Array.from(to), JSON.stringify({ shape, begin, size })).toEqual(naiveSlice(from, shape, begin, size));
    }
  });

  it('tf.slice on wasm gives what the cpu backend gives, for floats and integers', () => {
    for (const [shape, begin, size] of CASES) {
      const n = shape.reduce((a, b) => a * b, 1);
      for (const dtype of ['float32', 'int32'] as const) {
        const values = Array.from({ length: n }, (_, i) => (dtype === 'float32' ? i / 3 : i * 7));
        const got = Array.from(tf.slice(tf.tensor(values, shape, dtype), begin, size).dataSync());
        expect(got, JSON.stringify({ shape, begin, size, dtype })).toEqual(naiveSlice(Float32Array.from(values), shape, begin, size).map((v) => (dtype === 'float32' ? Math.fround(v) : v)));
      }
    }
  });
});
