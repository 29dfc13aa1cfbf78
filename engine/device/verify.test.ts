// Verifiable rewards: exact match and math answer checking on hand-written responses.
import { describe, expect, it } from 'vitest';
import { exactMatch, extractAnswer, lastBoxed, lastNumber, mathMatch, parseNumber, verifier } from './verify.ts';

describe('exact', () => {
  it('ignores surrounding white space and the width of inner runs, nothing else', () => {
    expect(exactMatch('  Paris \n', 'Paris')).toBe(true);
    expect(exactMatch('New   York', 'New York')).toBe(true);
    expect(exactMatch('paris', 'Paris')).toBe(false);
    expect(exactMatch('Paris.', 'Paris')).toBe(false);
    expect(verifier('exact')('x', 'x')).toBe(1);
    expect(verifier('exact')('x', 'y')).toBe(0);
  });
});

describe('math', () => {
  it('reads numbers with separators, signs, decimals, exponents and fractions', () => {
    expect(parseNumber('1,234,567')).toBe(1234567);
    expect(parseNumber('-3.5')).toBe(-3.5);
    expect(parseNumber('3 / 4')).toBe(0.75);
    expect(lastNumber('it costs 2e3 dollars')).toBe(2000);
    expect(lastNumber('half is \\frac{1}{2}')).toBe(0.5);
    expect(lastNumber('\\dfrac{3}{4}')).toBe(0.75);
    expect(lastNumber('no digits here')).toBeUndefined();
    expect(lastNumber('1/0')).toBeUndefined();
  });

  it('takes the last \\boxed{…}, with nested braces', () => {
    expect(lastBoxed('first \\boxed{1} then \\boxed{\\frac{1}{2}}')).toBe('\\frac{1}{2}');
    expect(lastBoxed('\\boxed{open')).toBeUndefined();
    expect(extractAnswer('so \\boxed{42}. Check: 6 * 7 = 42, not 41')).toBe(42);
  });

  it('takes what follows the last ####, as GSM8K writes it', () => {
    expect(extractAnswer('3 + 4 = 7 apples, 7 * 2 = 14\n#### 14')).toBe(14);
    expect(extractAnswer('#### 1,000')).toBe(1000);
    // Nothing after the marker: the last number before it.
    expect(extractAnswer('the answer is 9 ####')).toBe(9);
  });

  it('otherwise takes the last number in the text', () => {
    expect(extractAnswer('Tom has 3 apples and buys 4, so he has 7.')).toBe(7);
    expect(extractAnswer('I do not know')).toBeUndefined();
  });

  it('compares numerically within the tolerance', () => {
    expect(mathMatch('The answer is 0.5', '1/2')).toBe(true);
    expect(mathMatch('#### 7.0', '#### 7')).toBe(true);
    expect(mathMatch('7.001', '7')).toBe(false);
    expect(mathMatch('1000000.5', '1000000', 1e-6)).toBe(true);
    expect(mathMatch('1e-9', '0')).toBe(true);
    expect(mathMatch('no answer', '7')).toBe(false);
    expect(mathMatch('7', 'no reference number')).toBe(false);
    expect(verifier('math')('so \\boxed{12}', '#### 12')).toBe(1);
    expect(verifier('math')('so \\boxed{13}', '#### 12')).toBe(0);
  });
});
