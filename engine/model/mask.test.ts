import { describe, expect, it } from 'vitest';
import { lengthsOfMask, masked, maskOfLengths, responseLength, responseLengths, responseMask } from './mask.ts';

describe('response masks', () => {
  it('a response runs to its first EOS, which it keeps, or to the budget', () => {
    expect(responseLength([4, 2, 9, 9, 9], 9)).toBe(3);
    expect(responseLength([9, 9], 9)).toBe(1);
    expect(responseLength([4, 2, 3], 9)).toBe(3);
    expect(responseLength([4, 9, 2, 9], 9)).toBe(2); // a token after the end is padding, whatever it is
    expect(responseLength([4, 9, 2], undefined)).toBe(3); // no end token: the whole budget
  });

  it('lengths and masks of ragged rows: [prompt 2 | response 4]', () => {
    const eos = 7;
    const tokens = Int32Array.from([
      ...[1, 2, 3, 7, 7, 7], // 2 tokens
      ...[1, 2, 3, 4, 5, 6], // runs into the budget: 4
      ...[1, 2, 7, 7, 7, 7], // 1 token (EOS at once)
    ]);
    expect(Array.from(responseLengths(tokens, 2, 4, eos))).toEqual([2, 4, 1]);
    const mask = responseMask(tokens, 2, 4, eos);
    expect(Array.from(mask)).toEqual([1, 1, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0]);
    expect(Array.from(lengthsOfMask(mask, 4))).toEqual([2, 4, 1]);
    expect(maskOfLengths([2, 4, 1], 4)).toEqual(mask);
    expect(Array.from(responseMask(tokens, 2, 4, undefined))).toEqual(new Array(12).fill(1));
  });

  it('masked() zeroes padding and refuses a mask of another size', () => {
    expect(Array.from(masked(Float32Array.from([0.5, -1, 2, 3]), [1, 1, 0, 0]))).toEqual([0.5, -1, 0, 0]);
    expect(() => masked(new Float32Array(3), [1, 1])).toThrow('3 values and a mask of 2');
    expect(() => responseLengths(new Int32Array(7), 2, 4, 1)).toThrow('7 tokens are not whole rows of 2 + 4');
  });
});
