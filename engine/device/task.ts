// Synthetic tasks with a rule reward. sort, reverse and copy: a prompt is `digits` random digits
// then a separator, and the answer is `digits` tokens. count: a prompt is two numbers a and b below
// `base` then a separator, and the answer counts from a to b (up or down) and ends with an
// end-of-sequence token, so answers run from 2 to base + 1 tokens. The reward is the share of
// positions that match what the rule wants (over the longer of the answer and the response, when
// lengths differ): partial credit gives RL a gradient long before whole answers are right.
import { Rng, Stream, responseLength, seedOf } from '../model/index.ts';

export const TASKS = ['sort', 'reverse', 'copy', 'count'] as const;
export type TaskName = (typeof TASKS)[number];

export interface Task {
  /** A synthetic task's name, or `data` for prompts from a dataset file. */
  name: TaskName | 'data';
  /** digits 0..base-1, the separator token `base`, and for a task whose answers end, its EOS `base + 1`. */
  vocab: number;
  promptLen: number;
  /** The response budget (max_new_tokens): the longest response generation makes. */
  responseLen: number;
  /** The end-of-sequence token, for a task whose answers have different lengths (none: every answer is `responseLen` long). */
  eos?: number;
  /** The token prompts are left-padded with, for a task whose prompts have different lengths. */
  pad?: number;
  /** `count` prompts, row-major `[count, promptLen]`. */
  prompts(seed: number, iteration: number, count: number): Int32Array;
  /** The response the rule wants for one prompt (with its EOS, if the task has one). */
  target(prompt: ArrayLike<number>): number[];
  /** Reward in [0, 1] for one prompt and response (a response is read up to its first EOS). */
  score(prompt: ArrayLike<number>, response: ArrayLike<number>): number;
  /** The text of tokens (a prompt's padding and an end token left out), for reward actors and reports. */
  text(tokens: ArrayLike<number>): string;
  /** The reference answer to a prompt, as text: what a verifier compares a response with. */
  answer(prompt: ArrayLike<number>): string;
  /** A prompt written as text, as this task lays prompts out (a dataset task's: tokenized, left-padded); digit tasks have none. */
  encode?(text: string): Int32Array;
}

/** A digit task's token as text: its digit in base 36, and `|` for the separator and end tokens. */
const digitText = (t: number, base: number) => (t < base ? t.toString(36) : '|');

/** text() and answer() of a digit task: digits as characters, the end token left out. */
function digitTexts(base: number, eos: number | undefined, target: (prompt: ArrayLike<number>) => number[]) {
  const text = (tokens: ArrayLike<number>) =>
    Array.from(tokens)
      .filter((t) => t !== eos)
      .map((t) => digitText(t, base))
      .join('');
  return { text, answer: (prompt: ArrayLike<number>) => text(target(prompt)) };
}

export class TaskError extends Error {
  override name = 'TaskError';
}

/** The longest answer of a task: what its response budget must hold for a right answer to fit. */
export function longestAnswer(name: TaskName, digits: number, base: number): number {
  return name === 'count' ? base + 1 : digits;
}

/**
 * A task by name. `maxNewTokens` is the response budget; by default the longest answer. A task
 * whose answers have one length (sort, reverse, copy) has no end token, so its budget is that length.
 */
export function makeTask(name: TaskName, digits: number, base: number, maxNewTokens?: number): Task {
  const sep = base;
  if (name === 'count') return countTask(base, maxNewTokens ?? longestAnswer(name, digits, base));
  if (maxNewTokens !== undefined && maxNewTokens !== digits) {
    throw new TaskError(`the '${name}' task answers with exactly ${digits} tokens (its digits) and has no end-of-sequence token; max_new_tokens must be ${digits} or left out, got ${maxNewTokens}`);
  }
  const promptLen = digits + 1;
  const target = (prompt: ArrayLike<number>): number[] => {
    const body = Array.from(prompt).slice(0, digits);
    if (name === 'sort') return body.sort((a, b) => a - b);
    if (name === 'reverse') return body.reverse();
    return body;
  };
  return {
    name,
    vocab: base + 1,
    promptLen,
    responseLen: digits,
    prompts(seed, iteration, count) {
      const out = new Int32Array(count * promptLen);
      for (let i = 0; i < count; i++) {
        const rng = new Rng(seedOf(seed, Stream.prompts, iteration, i));
        for (let j = 0; j < digits; j++) out[i * promptLen + j] = rng.int(base);
        out[i * promptLen + digits] = sep;
      }
      return out;
    },
    target,
    ...digitTexts(base, undefined, target),
    score(prompt, response) {
      const want = target(prompt);
      let hits = 0;
      for (let j = 0; j < digits; j++) if (response[j] === want[j]) hits += 1;
      return hits / digits;
    },
  };
}

/** count: [a, b, sep] → a, a ± 1, …, b, EOS. */
function countTask(base: number, budget: number): Task {
  if (!Number.isInteger(budget) || budget < 1) throw new TaskError(`max_new_tokens must be a whole number ≥ 1, got ${budget}`);
  const sep = base;
  const eos = base + 1;
  const target = (prompt: ArrayLike<number>): number[] => {
    const [a, b] = [prompt[0]!, prompt[1]!];
    const step = b >= a ? 1 : -1;
    const out: number[] = [];
    for (let x = a; x !== b + step; x += step) out.push(x);
    out.push(eos);
    return out;
  };
  return {
    name: 'count',
    vocab: base + 2,
    promptLen: 3,
    responseLen: budget,
    eos,
    prompts(seed, iteration, count) {
      const out = new Int32Array(count * 3);
      for (let i = 0; i < count; i++) {
        const rng = new Rng(seedOf(seed, Stream.prompts, iteration, i));
        out[i * 3] = rng.int(base);
        out[i * 3 + 1] = rng.int(base);
        out[i * 3 + 2] = sep;
      }
      return out;
    },
    target,
    ...digitTexts(base, eos, target),
    score(prompt, response) {
      const want = target(prompt);
      const got = Array.from(response).slice(0, responseLength(response, eos));
      let hits = 0;
      for (let j = 0; j < Math.min(want.length, got.length); j++) if (got[j] === want[j]) hits += 1;
      return hits / Math.max(want.length, got.length);
    },
  };
}

/** A response as `responseLen` tokens: padded after its end with the task's EOS (a task without one needs no padding). */
export function padded(task: Task, response: readonly number[]): number[] {
  if (response.length === task.responseLen) return [...response];
  if (task.eos === undefined || response.length > task.responseLen) {
    throw new TaskError(`a response of the '${task.name}' task has ${task.responseLen} tokens${task.eos === undefined ? '' : ' at most'}, got ${response.length}`);
  }
  return [...response, ...new Array<number>(task.responseLen - response.length).fill(task.eos)];
}

/** Demonstrations for the supervised warm-up: prompts followed by the rule's answer. */
export function demonstrations(task: Task, seed: number, count: number): Int32Array {
  // Iteration -1 keeps demonstration prompts apart from the prompts RL trains on.
  const prompts = task.prompts(seedOf(seed, Stream.demos), -1, count);
  const width = task.promptLen + task.responseLen;
  const out = new Int32Array(count * width);
  for (let i = 0; i < count; i++) {
    const prompt = prompts.subarray(i * task.promptLen, (i + 1) * task.promptLen);
    out.set(prompt, i * width);
    out.set(padded(task, task.target(prompt).slice(0, task.responseLen)), i * width + task.promptLen);
  }
  return out;
}
