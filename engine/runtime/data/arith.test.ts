// The arithmetic dataset: its answers are right, and the shipped files are what the generator makes.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { mathMatch } from '../../device/index.ts';
import { ARITH_FILES, arithJsonl, arithProblem, arithTokenizerFiles } from './arith.ts';
import { TextTokenizer } from '../../model/index.ts';
import { JsonlDataset } from './dataset.ts';

describe('arith', () => {
  it("every answer is what the question's arithmetic gives, and its solution ends with it", () => {
    for (let i = 0; i < 500; i++) {
      const p = arithProblem(7, i);
      const nums = [...p.question.matchAll(/\d+/g)].map((m) => Number(m[0]));
      const [a, b] = [nums[0]!, nums[1]!];
      const want = /gets .* more/.test(p.question) ? a + b : /gave/.test(p.question) ? a - b : /boxes/.test(p.question) ? a * b : a / b;
      expect(Number(p.answer)).toBe(want);
      expect(Number.isInteger(want) && want >= 0).toBe(true);
      expect(mathMatch(p.solution, p.answer)).toBe(true);
    }
  });

  it('is the same for the same seed and index, and differs across them', () => {
    expect(arithProblem(1, 3)).toEqual(arithProblem(1, 3));
    expect(arithJsonl(1, 0, 20)).not.toEqual(arithJsonl(2, 0, 20));
  });

  it('the shipped tokenizer is what arithTokenizer() writes, and reads every problem back exactly, one token per character', () => {
    const dir = fileURLToPath(new URL('../../../examples/arith/tokenizer/', import.meta.url));
    for (const [name, text] of Object.entries(arithTokenizerFiles())) expect(readFileSync(`${dir}${name}`, 'utf8')).toBe(text);
    const tk = TextTokenizer.load(dir);
    expect([tk.pad, tk.eos, tk.vocabSize]).toEqual([0, 1, 99]);
    for (let i = 0; i < 200; i++) {
      const p = arithProblem(1, i);
      for (const text of [p.question, p.solution]) {
        const ids = tk.encode(text);
        expect(ids).toHaveLength(text.length);
        expect(ids).not.toContain(2); // no unknown character
        expect(tk.decode(ids)).toBe(text);
      }
    }
  });

  it("the shipped files are the generator's output, and read as datasets", () => {
    for (const [name, { seed, first, count }] of Object.entries(ARITH_FILES)) {
      const file = fileURLToPath(new URL(`../../../examples/arith/${name}`, import.meta.url));
      expect(readFileSync(file, 'utf8')).toBe(arithJsonl(seed, first, count));
      expect(JsonlDataset.open(file, { prompt: 'question', answer: 'answer' }).size).toBe(count);
    }
  });
});
