// A task whose prompts come from a JSONL dataset and whose reward is a verifier: the prompt text
// (through the tokenizer's chat template, when asked) becomes token ids, left-padded to the
// task's prompt length, so that every row's response starts at the same position; a response is
// decoded to text and checked against the row's reference answer. The warm-up's demonstrations
// are the rows' worked answers (or their answers), then the end token.
//
// The prompts of the last few draws are remembered, by their tokens, with their rows: that is how
// target(), answer() and score() — which see tokens only — find a prompt's reference answer.
import { responseLength, seedOf, type TextTokenizer } from '../../model/index.ts';
import { TaskError, verifier, type Task, type VerifierName } from '../../device/index.ts';
import type { DatasetRow, JsonlDataset } from './dataset.ts';

export interface DataTaskOptions {
  dataset: JsonlDataset;
  tokenizer: TextTokenizer;
  verifier: VerifierName;
  /** Prompt tokens: every prompt is left-padded to this many; a longer one is refused. */
  promptLen: number;
  /** The response budget (max_new_tokens). */
  responseLen: number;
  /** Wrap each prompt as a user message in the tokenizer's chat template. */
  chat: boolean;
  /** The model's vocabulary, when larger than the tokenizer's (checkpoints often pad theirs). */
  vocab?: number;
}

/** The seed stream of draws at negative iterations (the warm-up's demonstrations). */
const DRAW_STREAM = 0xd7a5;

/** Draws whose prompts are remembered: an iteration's, the warm-up's and the preference pairs' at once, with room. */
const REMEMBERED_DRAWS = 8;

/** A dataset task, with the number of rows its file holds. */
export type DataTask = Task & { readonly rows: number };

export function dataTask(o: DataTaskOptions): DataTask {
  const { dataset, tokenizer, promptLen, responseLen } = o;
  const eos = tokenizer.eos;
  if (eos === undefined) throw new TaskError(`${tokenizer.where}: the tokenizer names no end token (eos_token in tokenizer_config.json); a response of a dataset task ends at one`);
  const pad = tokenizer.pad ?? eos;
  const vocab = Math.max(o.vocab ?? 0, tokenizer.vocabSize);
  const check = verifier(o.verifier);
  /** Rows by their prompt's tokens, one map per draw, the newest last. */
  const draws: Array<Map<string, DatasetRow>> = [];
  const keyOf = (prompt: ArrayLike<number>) => Array.from(prompt).join(',');
  const rowOf = (prompt: ArrayLike<number>): DatasetRow => {
    const key = keyOf(prompt);
    for (let i = draws.length - 1; i >= 0; i--) {
      const row = draws[i]!.get(key);
      if (row) return row;
    }
    throw new TaskError(`a prompt none of the last ${REMEMBERED_DRAWS} draws of this task has: ${JSON.stringify(text(prompt)).slice(0, 80)}`);
  };
  const text = (tokens: ArrayLike<number>) => {
    const ids = Array.from(tokens);
    let first = 0;
    while (first < ids.length && ids[first] === pad) first++; // a prompt's left padding
    return tokenizer.decode(ids.slice(first, first + responseLength(ids.slice(first), eos)).filter((t) => t !== eos));
  };
  /** A prompt's ids, left-padded to promptLen; `where` names it in the error when it is too long. */
  const encode = (prompt: string, where: string): Int32Array => {
    const ids = o.chat ? tokenizer.encode(tokenizer.chat([{ role: 'user', content: prompt }]), false) : tokenizer.encode(prompt);
    if (ids.length > promptLen) throw new TaskError(`${where}: the prompt is ${ids.length} tokens; data.prompt_tokens is ${promptLen}`);
    const out = new Int32Array(promptLen).fill(pad);
    out.set(ids, promptLen - ids.length);
    return out;
  };
  return {
    name: 'data',
    rows: dataset.size,
    vocab,
    promptLen,
    responseLen,
    eos,
    pad,
    prompts(seed, iteration, count) {
      const rows = iteration >= 0 ? dataset.batch(seed, iteration, count) : dataset.batch(seedOf(seed, DRAW_STREAM, -iteration), 0, count);
      const out = new Int32Array(count * promptLen);
      const seen = new Map<string, DatasetRow>();
      draws.push(seen);
      if (draws.length > REMEMBERED_DRAWS) draws.shift();
      rows.forEach((row, i) => {
        const ids = encode(row.prompt, `${dataset.file}:${row.line}`);
        out.set(ids, i * promptLen);
        seen.set(keyOf(ids), row);
      });
      return out;
    },
    target(prompt) {
      const row = rowOf(prompt);
      const ids = [...tokenizer.encode(row.demo ?? row.answer, false), eos];
      // Cut, a demonstration would teach answers that never end.
      if (ids.length > responseLen) throw new TaskError(`${dataset.file}:${row.line}: the demonstration is ${ids.length} tokens with its end token; task.max_new_tokens is ${responseLen}`);
      return ids;
    },
    score(prompt, response) {
      return check(text(response), rowOf(prompt).answer);
    },
    text,
    answer: (prompt) => rowOf(prompt).answer,
    encode: (prompt) => encode(prompt, 'the prompt'),
  };
}
