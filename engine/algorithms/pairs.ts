// Offline preference pairs for DPO: drawn from the task and labelled by its rule (two answers of
// graded quality per prompt, the better one chosen), or read from a JSONL file. Either way an
// iteration's pairs are a pure function of (seed, iteration), so a replay gets the same bits.
import { readFileSync } from 'node:fs';
import { Rng, Stream, seedOf } from '../model/index.ts';
import { padded, type Task } from '../device/index.ts';

export class PairsError extends Error {
  override name = 'PairsError';
}

/** Pairs as one batch: every chosen sequence, then every rejected one, [2n, promptLen + responseLen]. */
function assemble(pairs: ReadonlyArray<{ prompt: ArrayLike<number>; chosen: ArrayLike<number>; rejected: ArrayLike<number> }>, width: number): Int32Array {
  const n = pairs.length;
  const out = new Int32Array(2 * n * width);
  pairs.forEach((p, i) => {
    out.set(p.prompt, i * width);
    out.set(p.chosen, i * width + p.prompt.length);
    out.set(p.prompt, (n + i) * width);
    out.set(p.rejected, (n + i) * width + p.prompt.length);
  });
  return out;
}

/**
 * `n` pairs for one iteration: for each of the task's prompts, two answers, each the rule's answer
 * with a random number of positions replaced by random digits, labelled by the rule (a tie is
 * drawn again; after 16 ties the rule's own answer is chosen over a fully random one).
 */
export function taskPairs(task: Task, seed: number, iteration: number, n: number): Int32Array {
  const prompts = task.prompts(seed, iteration, n);
  // Noise draws digits only (not the separator, nor the end token).
  const base = task.eos === undefined ? task.vocab - 1 : task.vocab - 2;
  const pairs = [];
  for (let i = 0; i < n; i++) {
    const prompt = prompts.subarray(i * task.promptLen, (i + 1) * task.promptLen);
    const rng = new Rng(seedOf(seed, Stream.pairs, iteration, i));
    const target = task.target(prompt);
    const noisy = (k: number) => {
      const out = [...target];
      for (let j = 0; j < k; j++) out[rng.int(out.length)] = rng.int(base);
      return out;
    };
    let pair: { prompt: Int32Array; chosen: number[]; rejected: number[] } | undefined;
    for (let attempt = 0; attempt < 16 && !pair; attempt++) {
      const a = noisy(rng.int(task.responseLen + 1));
      const b = noisy(rng.int(task.responseLen + 1));
      const [sa, sb] = [task.score(prompt, a), task.score(prompt, b)];
      if (sa !== sb) pair = { prompt, chosen: sa > sb ? a : b, rejected: sa > sb ? b : a };
    }
    pairs.push(pair ?? { prompt, chosen: target, rejected: noisy(task.responseLen * 4) });
  }
  // Answers of a task with an end token are shorter than the budget: padded after it.
  for (const p of pairs) {
    p.chosen = padded(task, p.chosen.slice(0, task.responseLen));
    p.rejected = padded(task, p.rejected.slice(0, task.responseLen));
  }
  return assemble(pairs, task.promptLen + task.responseLen);
}

export interface PairsFile {
  file: string;
  count: number;
  /** `n` pairs for an iteration: the file's pairs in a seeded order per pass, one slice after another. */
  batch(seed: number, iteration: number, n: number): Int32Array;
}

/**
 * Reads a JSONL file of `{ "prompt": [ids], "chosen": [ids], "rejected": [ids] }`, checking every
 * line against the task's lengths and vocabulary; an error names the file, the line and the field.
 */
export function readPairsFile(file: string, task: Task): PairsFile {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (e) {
    throw new PairsError(`cannot read the pairs file ${file}: ${(e as Error).message}`);
  }
  const pairs: Array<{ prompt: number[]; chosen: number[]; rejected: number[] }> = [];
  text.split('\n').forEach((line, index) => {
    if (line.trim() === '') return;
    const where = `${file}:${index + 1}`;
    let row: unknown;
    try {
      row = JSON.parse(line);
    } catch (e) {
      throw new PairsError(`${where}: not JSON (${(e as Error).message})`);
    }
    // A response of a task with an end token may be shorter than the budget: it is padded with that token.
    const ids = (key: string, len: number, shorter: boolean): number[] => {
      const v = (row as Record<string, unknown> | null)?.[key];
      const fits = Array.isArray(v) && (shorter ? v.length >= 1 && v.length <= len : v.length === len);
      if (!fits || !v.every((t) => Number.isInteger(t) && t >= 0 && t < task.vocab)) {
        throw new PairsError(`${where}: '${key}' must be ${shorter ? `1 to ${len}` : len} token ids below ${task.vocab}, got ${JSON.stringify(v)?.slice(0, 80)}`);
      }
      return v as number[];
    };
    const response = (key: string) => padded(task, ids(key, task.responseLen, task.eos !== undefined));
    pairs.push({ prompt: ids('prompt', task.promptLen, false), chosen: response('chosen'), rejected: response('rejected') });
  });
  if (pairs.length === 0) throw new PairsError(`${file}: no pairs`);
  const width = task.promptLen + task.responseLen;
  return {
    file,
    count: pairs.length,
    batch(seed, iteration, n) {
      const picked = Array.from({ length: n }, (_, i) => {
        const at = iteration * n + i;
        const pass = Math.floor(at / pairs.length);
        return pairs[new Rng(seedOf(seed, Stream.pairs, -1, pass)).permutation(pairs.length)[at % pairs.length]!]!;
      });
      return assemble(picked, width);
    },
  };
}
