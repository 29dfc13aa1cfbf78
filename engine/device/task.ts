// Synthetic tasks with a rule reward. A prompt is `digits` random digits then a separator; the
// response is `digits` tokens; the reward is the fraction of response positions that match what
// the rule wants. Partial credit gives RL a gradient long before whole answers are right.
import { Rng, Stream, seedOf } from '../model/index.ts';

export const TASKS = ['sort', 'reverse', 'copy'] as const;
export type TaskName = (typeof TASKS)[number];

export interface Task {
  name: TaskName;
  /** digits 0..base-1, then the separator token `base`. */
  vocab: number;
  promptLen: number;
  responseLen: number;
  /** `count` prompts, row-major `[count, promptLen]`. */
  prompts(seed: number, iteration: number, count: number): Int32Array;
  /** The response the rule wants for one prompt. */
  target(prompt: ArrayLike<number>): number[];
  /** Reward in [0, 1] for one prompt and response. */
  score(prompt: ArrayLike<number>, response: ArrayLike<number>): number;
}

export function makeTask(name: TaskName, digits: number, base: number): Task {
  const sep = base;
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
    score(prompt, response) {
      const want = target(prompt);
      let hits = 0;
      for (let j = 0; j < digits; j++) if (response[j] === want[j]) hits += 1;
      return hits / digits;
    },
  };
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
    out.set(task.target(prompt), i * width + task.promptLen);
  }
  return out;
}
