import { describe, it, expect } from 'vitest';
import { z } from 'zod';
import { describeValue, formatIssues, pathString, shortList } from './issues.ts';

const lines = (schema: z.ZodType, input: unknown): string[] => {
  const parsed = schema.safeParse(input);
  if (parsed.success) throw new Error('expected the input to be refused');
  return formatIssues(parsed.error.issues, input);
};

describe('pathString', () => {
  it('joins keys with dots and indices with brackets', () => {
    expect(pathString([])).toBe('(top level)');
    expect(pathString(['ppo'])).toBe('ppo');
    expect(pathString(['ppo', 'epochs'])).toBe('ppo.epochs');
    expect(pathString(['layers', 2, 'width'])).toBe('layers[2].width');
    expect(pathString([0, 'a'])).toBe('[0].a');
  });
});

describe('describeValue', () => {
  it('says what came, briefly', () => {
    expect(describeValue(null)).toBe('null');
    expect(describeValue(undefined)).toBe('nothing');
    expect(describeValue(new Float32Array(3))).toBe('Float32Array(3)');
    expect(describeValue([1, 2])).toBe('an array of 2');
    expect(describeValue('two')).toBe('"two"');
    expect(describeValue('x'.repeat(50))).toBe(JSON.stringify(`${'x'.repeat(40)}…`));
    expect(describeValue({ a: 1 })).toBe('an object');
    expect(describeValue(3)).toBe('number 3');
    expect(describeValue(true)).toBe('boolean true');
  });
});

describe('formatIssues', () => {
  const Schema = z.strictObject({
    ppo: z.strictObject({ epochs: z.number().int().positive(), clip: z.number() }),
    list: z.array(z.strictObject({ n: z.number() })).optional(),
    name: z.string().optional(),
  });

  it('one line per issue: path, what was expected, what came', () => {
    const out = lines(Schema, { ppo: { epochs: 'two', clip: 0.2 } });
    expect(out).toEqual(['ppo.epochs: expected number, received string (got "two")']);
  });

  it('a constraint violation says the constraint and the value', () => {
    const out = lines(Schema, { ppo: { epochs: 0, clip: 0.2 } });
    expect(out).toHaveLength(1);
    expect(out[0]).toMatch(/^ppo\.epochs: Too small: expected number to be >0 \(got number 0\)$/);
  });

  it('a missing key is reported as nothing', () => {
    expect(lines(Schema, { ppo: { epochs: 1 } })).toEqual(['ppo.clip: expected number, received undefined (got nothing)']);
  });

  it('unknown keys name where they are and every key, up to five', () => {
    expect(lines(Schema, { ppo: { epochs: 1, clip: 0, epochz: 2 } })).toEqual(['ppo.epochz: unknown key']);
    expect(lines(Schema, { ppo: { epochs: 1, clip: 0 }, a: 1, b: 2 })).toEqual(['a, b: unknown keys']);
    const seven = Object.fromEntries('abcdefg'.split('').map((k) => [k, 1]));
    expect(lines(Schema, { ppo: { epochs: 1, clip: 0 }, ...seven })).toEqual(['a, b, c, d, e, … and 2 more: unknown keys']);
  });

  it('array indices appear in brackets', () => {
    expect(lines(Schema, { ppo: { epochs: 1, clip: 0 }, list: [{ n: 1 }, { n: 'x' }] })).toEqual(['list[1].n: expected number, received string (got "x")']);
  });

  it('a problem at the top level says so', () => {
    expect(lines(Schema, 5)).toEqual(['(top level): expected object, received number (got number 5)']);
  });

  it('several problems give several lines, in order', () => {
    const out = lines(Schema, { ppo: { epochs: -1, clip: 'c' }, name: 3 });
    expect(out).toHaveLength(3);
    expect(out[0]).toMatch(/^ppo\.epochs: .*\(got number -1\)$/);
    expect(out[1]).toBe('ppo.clip: expected number, received string (got "c")');
    expect(out[2]).toBe('name: expected string, received number (got number 3)');
  });
});

describe('shortList', () => {
  it('keeps up to the limit and counts the rest', () => {
    expect(shortList(['a', 'b'], 2)).toEqual(['a', 'b']);
    expect(shortList(['a', 'b', 'c', 'd'], 2)).toEqual(['a', 'b', '… and 2 more']);
    expect(shortList([])).toEqual([]);
  });
});
