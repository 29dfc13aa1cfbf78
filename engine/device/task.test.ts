import { describe, it, expect } from 'vitest';
import { TASKS, TaskError, demonstrations, makeTask, padded } from './task.ts';

const DIGIT_TASKS = TASKS.filter((t) => t !== 'count');

const rows = (flat: Int32Array, width: number): number[][] => Array.from({ length: flat.length / width }, (_, i) => Array.from(flat.subarray(i * width, (i + 1) * width)));

describe('makeTask', () => {
  it('shapes: vocab is base + 1 (the separator), prompt is digits + 1, response is digits', () => {
    const t = makeTask('sort', 4, 10);
    expect(t.name).toBe('sort');
    expect(t.vocab).toBe(11);
    expect(t.promptLen).toBe(5);
    expect(t.responseLen).toBe(4);
  });

  it('targets: sort ascending (numerically), reverse, copy', () => {
    const prompt = [3, 1, 12, 1, 16]; // base 16: digit 12, separator 16
    expect(makeTask('sort', 4, 16).target(prompt)).toEqual([1, 1, 3, 12]); // not [1, 1, 12, 3] (string order)
    expect(makeTask('reverse', 4, 16).target(prompt)).toEqual([1, 12, 1, 3]);
    expect(makeTask('copy', 4, 16).target(prompt)).toEqual([3, 1, 12, 1]);
  });

  it('target does not change the prompt it is given', () => {
    const prompt = new Int32Array([3, 1, 2, 0, 10]);
    makeTask('sort', 4, 10).target(prompt);
    makeTask('reverse', 4, 10).target(prompt);
    expect(Array.from(prompt)).toEqual([3, 1, 2, 0, 10]);
  });

  it('score is the fraction of positions that match the target', () => {
    const sort = makeTask('sort', 4, 10);
    const prompt = [3, 1, 2, 1, 10]; // target [1, 1, 2, 3]
    expect(sort.score(prompt, [1, 1, 2, 3])).toBe(1);
    expect(sort.score(prompt, [1, 1, 3, 2])).toBe(0.5); // 2 of 4
    expect(sort.score(prompt, [1, 0, 0, 0])).toBe(0.25); // 1 of 4
    expect(sort.score(prompt, [3, 2, 1, 1])).toBe(0);
    // reverse of [3, 1, 2, 1] is [1, 2, 1, 3]: [1, 2, 0, 0] matches 2 of 4
    expect(makeTask('reverse', 4, 10).score(prompt, [1, 2, 0, 0])).toBe(0.5);
    // copy with 3 digits: [3, 1, 2] vs [3, 9, 2] → 2/3
    expect(makeTask('copy', 3, 10).score([3, 1, 2, 10], [3, 9, 2])).toBeCloseTo(2 / 3, 12);
  });

  it('score reads only the first `digits` tokens of the response', () => {
    expect(makeTask('copy', 2, 10).score([4, 5, 10], new Int32Array([4, 5, 9, 9]))).toBe(1);
  });
});

describe('prompts', () => {
  for (const name of DIGIT_TASKS) {
    it(`${name}: rows of digits in [0, base) ending with the separator`, () => {
      const t = makeTask(name, 5, 7);
      const p = t.prompts(3, 0, 50);
      expect(p).toBeInstanceOf(Int32Array);
      expect(p.length).toBe(50 * 6);
      for (const row of rows(p, 6)) {
        expect(row[5]).toBe(7);
        for (const d of row.slice(0, 5)) {
          expect(d).toBeGreaterThanOrEqual(0);
          expect(d).toBeLessThan(7);
        }
      }
    });
  }

  it('are deterministic per (seed, iteration), and differ across seeds and iterations', () => {
    const t = makeTask('sort', 6, 10);
    const p = t.prompts(1, 4, 16);
    expect(t.prompts(1, 4, 16)).toEqual(p);
    expect(t.prompts(2, 4, 16)).not.toEqual(p);
    expect(t.prompts(1, 5, 16)).not.toEqual(p);
    // another task with the same shape draws the same prompts: only the rule differs
    expect(makeTask('reverse', 6, 10).prompts(1, 4, 16)).toEqual(p);
  });

  it('prompt i does not depend on how many are asked for (one stream per prompt)', () => {
    const t = makeTask('copy', 4, 10);
    const few = t.prompts(9, 2, 3);
    const many = t.prompts(9, 2, 10);
    expect(many.subarray(0, few.length)).toEqual(few);
  });

  it('use every digit over many prompts', () => {
    const p = makeTask('sort', 4, 10).prompts(0, 0, 100);
    const seen = new Set(rows(p, 5).flatMap((r) => r.slice(0, 4)));
    expect([...seen].sort((a, b) => a - b)).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
  });
});

describe('demonstrations', () => {
  for (const name of DIGIT_TASKS) {
    it(`${name}: each row is a prompt followed by its target`, () => {
      const t = makeTask(name, 4, 10);
      const d = demonstrations(t, 1, 20);
      expect(d).toBeInstanceOf(Int32Array);
      expect(d.length).toBe(20 * 9);
      for (const row of rows(d, 9)) {
        const prompt = row.slice(0, 5);
        expect(prompt[4]).toBe(10);
        expect(row.slice(5)).toEqual(t.target(prompt));
        expect(t.score(prompt, row.slice(5))).toBe(1);
      }
    });
  }

  it('are deterministic per seed and apart from the PPO prompts', () => {
    const t = makeTask('sort', 4, 10);
    expect(demonstrations(t, 1, 8)).toEqual(demonstrations(t, 1, 8));
    expect(demonstrations(t, 2, 8)).not.toEqual(demonstrations(t, 1, 8));
    const demoPrompts = rows(demonstrations(t, 1, 8), 9).map((r) => r.slice(0, 5));
    expect(demoPrompts).not.toEqual(rows(t.prompts(1, 0, 8), 5));
  });
});

describe('count: answers of different lengths that end with an end token', () => {
  const t = makeTask('count', 4, 10);

  it('shapes: prompt [a, b, separator], vocabulary of digits, separator and EOS, budget base + 1', () => {
    expect(t.promptLen).toBe(3);
    expect(t.vocab).toBe(12);
    expect(t.eos).toBe(11);
    expect(t.responseLen).toBe(11); // 0 … 9, then EOS
    expect(makeTask('count', 4, 10, 32).responseLen).toBe(32);
  });

  it('targets count up, down, or just say a, each ending with EOS', () => {
    expect(t.target([3, 6, 10])).toEqual([3, 4, 5, 6, 11]);
    expect(t.target([6, 3, 10])).toEqual([6, 5, 4, 3, 11]);
    expect(t.target([5, 5, 10])).toEqual([5, 11]);
    expect(t.target([0, 9, 10])).toHaveLength(11);
  });

  it('score: matching positions over the longer of the answer and the response, the response read to its first EOS', () => {
    const prompt = [3, 6, 10]; // wants 3 4 5 6 EOS
    expect(t.score(prompt, [3, 4, 5, 6, 11, 11, 11])).toBe(1);
    expect(t.score(prompt, [3, 4, 5, 6, 11, 7, 7])).toBe(1); // nothing after the end counts
    expect(t.score(prompt, [3, 4, 5, 6, 7, 11, 11])).toBe(4 / 6); // one too many: 4 of 6
    expect(t.score(prompt, [3, 4, 11, 11, 11])).toBe(2 / 5); // stopped early: 2 of 5
    expect(t.score(prompt, [3, 4, 5, 6, 7, 8, 9, 9, 9, 9, 9])).toBe(4 / 11); // never ends: the whole budget
    expect(t.score(prompt, [11])).toBe(0);
  });

  it('prompts hold two numbers below base and the separator; answers run from 2 to base + 1 tokens', () => {
    const p = t.prompts(1, 0, 200);
    const lengths = new Set<number>();
    for (const row of rows(p, 3)) {
      expect(row[2]).toBe(10);
      expect(row[0]).toBeLessThan(10);
      expect(row[1]).toBeLessThan(10);
      lengths.add(t.target(row).length);
    }
    expect(Math.min(...lengths)).toBe(2);
    expect(Math.max(...lengths)).toBe(11);
    expect(lengths.size).toBe(10);
  });

  it('demonstrations are the answers, padded with EOS to the budget', () => {
    const d = demonstrations(t, 1, 20);
    expect(d.length).toBe(20 * 14);
    for (const row of rows(d, 14)) {
      const want = t.target(row.slice(0, 3));
      expect(row.slice(3, 3 + want.length)).toEqual(want);
      expect(row.slice(3 + want.length).every((x) => x === 11)).toBe(true);
      expect(t.score(row.slice(0, 3), row.slice(3))).toBe(1);
    }
  });

  it('a budget for a fixed-length task must be its length; padding refuses a response longer than the budget', () => {
    expect(() => makeTask('sort', 4, 10, 6)).toThrow(TaskError);
    expect(() => makeTask('sort', 4, 10, 6)).toThrow("the 'sort' task answers with exactly 4 tokens (its digits) and has no end-of-sequence token; max_new_tokens must be 4 or left out, got 6");
    expect(makeTask('sort', 4, 10, 4).responseLen).toBe(4);
    expect(padded(makeTask('count', 4, 10, 4), [1, 11])).toEqual([1, 11, 11, 11]);
    expect(() => padded(makeTask('count', 4, 10, 4), [1, 2, 3, 4, 11])).toThrow("a response of the 'count' task has 4 tokens at most, got 5");
  });
});
