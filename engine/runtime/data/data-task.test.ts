// A dataset task: prompts from a JSONL file through a tokenizer, left-padded; demonstrations from a
// worked-answer field; a verifier's reward; and the refusals (a prompt too long, names its line).
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { TextTokenizer } from '../../model/index.ts';
import { demonstrations } from '../../device/index.ts';
import { arithTokenizer } from './arith.ts';
import { JsonlDataset } from './dataset.ts';
import { dataTask } from './data-task.ts';

const dir = mkdtempSync(join(tmpdir(), 'ferry-data-task-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const rows = [
  { q: 'What is 2 + 3?', a: '5', w: '2 + 3 = 5\n#### 5' },
  { q: 'What is 10 - 4?', a: '6', w: '10 - 4 = 6\n#### 6' },
  { q: 'Is 7 * 6 equal to 42? Say the product.', a: '42', w: '7 * 6 = 42\n#### 42' },
];
const file = join(dir, 'train.jsonl');
writeFileSync(file, rows.map((r) => JSON.stringify(r)).join('\n'));
const { json, config } = arithTokenizer();
const tokenizer = new TextTokenizer(json, config, 'arith tokenizer');
const task = (promptLen = 48, chat = false, tk = tokenizer, responseLen = 24) =>
  dataTask({ dataset: JsonlDataset.open(file, { prompt: 'q', answer: 'a', demo: 'w' }), tokenizer: tk, verifier: 'math', promptLen, responseLen, chat });

describe('a dataset task', () => {
  it("lays prompts out left-padded with the tokenizer's pad token, in a seeded order, the same for the same seed", () => {
    const t = task();
    const p = t.prompts(1, 0, 3);
    expect(p).toHaveLength(3 * 48);
    const texts = [0, 1, 2].map((i) => t.text(p.subarray(i * 48, (i + 1) * 48)));
    expect(texts.sort()).toEqual(rows.map((r) => r.q).sort());
    const first = p.subarray(0, 48);
    const ids = tokenizer.encode(t.text(first));
    expect(Array.from(first.subarray(48 - ids.length))).toEqual(ids);
    expect(Array.from(first.subarray(0, 48 - ids.length)).every((x) => x === tokenizer.pad)).toBe(true);
    expect(Array.from(task().prompts(1, 0, 3))).toEqual(Array.from(p));
    expect(t.vocab).toBe(tokenizer.vocabSize);
    expect(t.eos).toBe(tokenizer.eos);
  });

  it('answers with the worked answer then the end token, and scores a response by the math verifier', () => {
    const t = task();
    const p = t.prompts(1, 0, 3);
    for (let i = 0; i < 3; i++) {
      const prompt = p.subarray(i * 48, (i + 1) * 48);
      const row = rows.find((r) => r.q === t.text(prompt))!;
      expect(t.target(prompt)).toEqual([...tokenizer.encode(row.w, false), tokenizer.eos]);
      expect(t.answer(prompt)).toBe(row.a);
      expect(t.score(prompt, Int32Array.from(t.target(prompt)))).toBe(1);
      expect(t.score(prompt, Int32Array.from([...tokenizer.encode('#### 1000', false), tokenizer.eos!]))).toBe(0);
      // Read up to the end token: what follows it does not count.
      expect(t.score(prompt, Int32Array.from([...tokenizer.encode(`#### ${row.a}`, false), tokenizer.eos!, ...tokenizer.encode('#### 9', false)]))).toBe(1);
    }
  });

  it('gives demonstrations of the prompt and its worked answer, padded after the end token', () => {
    const t = task();
    const demos = demonstrations(t, 3, 4);
    const width = t.promptLen + t.responseLen;
    for (let i = 0; i < 4; i++) {
      const row = demos.subarray(i * width, (i + 1) * width);
      const prompt = row.subarray(0, t.promptLen);
      expect(t.text(row.subarray(t.promptLen))).toBe(rows.find((r) => r.q === t.text(prompt))!.w);
    }
  });

  it('refuses a prompt longer than its prompt tokens and a demonstration longer than the budget, naming the file and line; and a prompt it never drew', () => {
    expect(() => task(16).prompts(1, 0, 3)).toThrow(/train\.jsonl:\d: the prompt is \d+ tokens; data\.prompt_tokens is 16/);
    expect(() => task().answer(new Int32Array(48))).toThrow(/a prompt none of the last 8 draws of this task has/);
    // A demonstration the response budget would cut (it would never end) is refused too.
    const short = task(48, false, tokenizer, 12);
    expect(() => demonstrations(short, 3, 3)).toThrow(/train\.jsonl:\d: the demonstration is \d+ tokens with its end token; task\.max_new_tokens is 12/);
  });

  it('wraps a prompt in the chat template when asked, and encodes text prompts as it lays prompts out', () => {
    const chat = new TextTokenizer(json, { ...config, chat_template: "{% for m in messages %}Q: {{ m['content'] }}\n{% endfor %}A: " }, 'chat');
    const t = task(64, true, chat);
    const p = t.prompts(1, 0, 1);
    expect(t.text(p)).toMatch(/^Q: .*\nA: $/);
    expect(t.text(t.encode!('hi'))).toBe('Q: hi\nA: ');
    expect(t.encode!('hi')[0]).toBe(chat.pad);
  });
});
