// The profile's least-squares fits, on hand-made data.
import { describe, expect, it } from 'vitest';
import { leastSquares, nonNegative } from './profile.ts';

describe('leastSquares', () => {
  it('recovers exact coefficients from exact data', () => {
    // t = 2·x + 3·y + 5
    const rows = [
      [1, 0],
      [0, 1],
      [1, 1],
      [2, 5],
      [7, 3],
    ].map(([x, y]) => ({ x: [x!, y!, 1], t: 2 * x! + 3 * y! + 5 }));
    const beta = leastSquares(rows);
    expect(beta[0]).toBeCloseTo(2, 10);
    expect(beta[1]).toBeCloseTo(3, 10);
    expect(beta[2]).toBeCloseTo(5, 10);
  });

  it('minimises the squared error (hand-computed: the mean, for one constant feature)', () => {
    expect(leastSquares([1, 2, 6].map((t) => ({ x: [1], t })))[0]).toBeCloseTo(3, 12);
  });

  it('pivots: a first feature that is 0 in the first rows does not divide by zero', () => {
    const rows = [
      { x: [0, 1], t: 4 },
      { x: [1, 0], t: 3 },
      { x: [1, 1], t: 7 },
    ];
    const [a, b] = leastSquares(rows);
    expect(a).toBeCloseTo(3, 10);
    expect(b).toBeCloseTo(4, 10);
  });

  it('says which feature is a combination of the others', () => {
    const rows = [1, 2, 3].map((x) => ({ x: [x, 2 * x], t: x }));
    expect(() => leastSquares(rows)).toThrow(/feature 1 is a combination of the others/);
  });
});

describe('nonNegative', () => {
  it('keeps an unconstrained fit whose coefficients are all ≥ 0', () => {
    const rows = [1, 2, 3, 4].map((x) => ({ x: [x, 1], t: 2 * x + 1 }));
    const [a, c] = nonNegative(rows);
    expect(a).toBeCloseTo(2, 10);
    expect(c).toBeCloseTo(1, 10);
  });

  it('holds a negative term at 0 and fits the rest again', () => {
    // t = 2·x − 1: the intercept would be −1; held at 0, the slope through zero is Σxt/Σx².
    const xs = [1, 2, 3, 4];
    const rows = xs.map((x) => ({ x: [x, 1], t: 2 * x - 1 }));
    const [a, c] = nonNegative(rows);
    expect(c).toBe(0);
    const sxt = xs.reduce((s, x) => s + x * (2 * x - 1), 0);
    const sxx = xs.reduce((s, x) => s + x * x, 0);
    expect(a).toBeCloseTo(sxt / sxx, 12);
  });

  it('holds a feature that is 0 in every row at 0 instead of failing', () => {
    const rows = [1, 2, 3].map((x) => ({ x: [x, 0], t: 3 * x }));
    expect(nonNegative(rows)).toEqual([expect.closeTo(3, 10), 0]);
  });

  it('returns zeros when nothing explains the times with a positive cost', () => {
    expect(nonNegative([1, 2].map((x) => ({ x: [x], t: -x })))).toEqual([0]);
  });
});
