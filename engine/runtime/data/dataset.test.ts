// JSONL datasets: rows by field name, every bad line refused with its number, seeded order.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { DatasetError, JsonlDataset } from './dataset.ts';

const dir = mkdtempSync(join(tmpdir(), 'ferry-dataset-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
let n = 0;
const write = (text: string) => {
  const file = join(dir, `d${n++}.jsonl`);
  writeFileSync(file, text);
  return file;
};
const FIELDS = { prompt: 'question', answer: 'answer' };

describe('JsonlDataset', () => {
  it('reads rows by field name, skipping blank lines, with CRLF endings and numbers as answers', () => {
    const file = write('{"question": "1+1?", "answer": "2"}\r\n\n  \n{"question": "héllo ✓", "answer": 3, "extra": true}');
    const d = JsonlDataset.open(file, FIELDS);
    expect(d.size).toBe(2);
    expect(d.row(0)).toEqual({ line: 1, prompt: '1+1?', answer: '2' });
    expect(d.row(1)).toEqual({ line: 4, prompt: 'héllo ✓', answer: '3' });
  });

  it('indexes lines longer than a read chunk, and many lines, reading rows back by offset', () => {
    const long = 'x'.repeat(3 << 20);
    const lines = [JSON.stringify({ question: long, answer: 'a' }), ...Array.from({ length: 5000 }, (_, i) => JSON.stringify({ question: `q${i}`, answer: `${i}` }))];
    const d = JsonlDataset.open(write(`${lines.join('\n')}\n`), FIELDS);
    expect(d.size).toBe(5001);
    expect(d.row(0).prompt.length).toBe(3 << 20);
    expect(d.row(4321)).toEqual({ line: 4322, prompt: 'q4320', answer: '4320' });
  });

  it('refuses a line that is not JSON, not an object, or lacks a field, naming the file and line', () => {
    const refuse = (text: string, pattern: RegExp) => {
      const file = write(text);
      expect(() => JsonlDataset.open(file, FIELDS)).toThrow(DatasetError);
      expect(() => JsonlDataset.open(file, FIELDS)).toThrow(pattern);
    };
    refuse('{"question": "a", "answer": "b"}\n{"question": "a", "answer": \n', /d\d+\.jsonl:2: expected a JSON object on each line, got text that is not JSON/);
    refuse('\n[1, 2]\n', /:2: expected a JSON object, got \[1,2\]/);
    refuse('{"question": "a", "answer": "b"}\n\n{"prompt": "a", "answer": "b"}', /:3: expected the prompt field "question", the line has "prompt", "answer"/);
    refuse('{"question": "a", "answer": null}', /:1: expected the answer field "answer" to be text or a number, got null/);
    refuse('\n\n', /expected at least one line with a JSON object, the file has none/);
    expect(() => JsonlDataset.open(join(dir, 'missing.jsonl'), FIELDS)).toThrow(/cannot read the dataset .*missing\.jsonl/);
  });

  it('orders rows by the seed, a new permutation each epoch, every row once per epoch', () => {
    const d = JsonlDataset.open(write(Array.from({ length: 10 }, (_, i) => JSON.stringify({ question: `q${i}`, answer: i })).join('\n')), FIELDS);
    const epoch = (seed: number, e: number) => [...d.order(seed, e)];
    expect(epoch(1, 0).sort((a, b) => a - b)).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    expect(epoch(1, 0)).toEqual(epoch(1, 0));
    expect(epoch(1, 1)).not.toEqual(epoch(1, 0));
    expect(epoch(2, 0)).not.toEqual(epoch(1, 0));
    // Iterations of 4 rows walk through epoch 0 (rows 0–9), then into epoch 1.
    const rows = [0, 1, 2].flatMap((it) => d.batch(1, it, 4).map((r) => r.answer));
    expect(rows.slice(0, 10)).toEqual(epoch(1, 0).map(String));
    expect(rows.slice(10)).toEqual(epoch(1, 1).slice(0, 2).map(String));
    expect(d.batch(1, 2, 4)).toEqual(d.batch(1, 2, 4));
    expect(() => d.row(10)).toThrow(/no row 10; it has 10/);
  });
});
