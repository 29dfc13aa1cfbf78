// A generated arithmetic word-problem dataset, shipped in the repository (examples/arith/) so that
// nothing is downloaded: one-step problems of addition, subtraction, multiplication and division
// with small numbers, each with a worked solution in GSM8K's format (the working, then `#### n`)
// for warming a model up on the format, the same with a calculator call and its result (`tool`),
// and the answer alone for the math verifier.
import { Rng, seedOf } from '../../model/index.ts';

export interface ArithProblem {
  question: string;
  solution: string;
  answer: string;
  /** The solution with a calculator: the call, the calculator's result, then `#### n` (examples/env/calculator.ts answers the call). */
  tool: string;
}

const NAMES = ['Ann', 'Ben', 'Cleo', 'Dev', 'Eli', 'Fay', 'Gus', 'Hana', 'Ivo', 'Jun'];
const ITEMS = ['apple', 'book', 'coin', 'marble', 'pencil', 'shell', 'stamp', 'sticker'];

/** The stream of the generator's seed (apart from the runtime's). */
const ARITH_STREAM = 0xa417;

/** Problem i of the dataset drawn from `seed`: the same seed and index always give the same problem. */
export function arithProblem(seed: number, i: number): ArithProblem {
  const rng = new Rng(seedOf(seed, ARITH_STREAM, i));
  const pick = <T>(xs: readonly T[]) => xs[rng.int(xs.length)]!;
  const name = pick(NAMES);
  const other = pick(NAMES.filter((n) => n !== name));
  const item = pick(ITEMS);
  const n = (lo: number, hi: number) => lo + rng.int(hi - lo + 1);
  const worked = (expr: string, result: number) => ({
    solution: `${expr} = ${result}\n#### ${result}`,
    answer: String(result),
    tool: `<calc>${expr}</calc><result>${result}</result>\n#### ${result}`,
  });
  switch (rng.int(4)) {
    case 0: {
      const [a, b] = [n(2, 50), n(2, 50)];
      return { question: `${name} has ${a} ${item}s and gets ${b} more. How many ${item}s does ${name} have now?`, ...worked(`${a} + ${b}`, a + b) };
    }
    case 1: {
      const a = n(10, 60);
      const b = n(1, a - 1);
      return { question: `${name} had ${a} ${item}s and gave ${b} to ${other}. How many ${item}s does ${name} have left?`, ...worked(`${a} - ${b}`, a - b) };
    }
    case 2: {
      const [a, b] = [n(2, 9), n(2, 9)];
      return { question: `${name} has ${a} boxes with ${b} ${item}s in each. How many ${item}s does ${name} have in all?`, ...worked(`${a} * ${b}`, a * b) };
    }
    default: {
      const [each, k] = [n(2, 9), n(2, 9)];
      return { question: `${name} shares ${each * k} ${item}s equally among ${k} friends. How many ${item}s does each friend get?`, ...worked(`${each * k} / ${k}`, each) };
    }
  }
}

/** `count` problems from `first` on, one JSON object per line. */
export function arithJsonl(seed: number, first: number, count: number): string {
  return Array.from({ length: count }, (_, k) => `${JSON.stringify(arithProblem(seed, first + k))}\n`).join('');
}

/** The shipped files: examples/arith/train.jsonl and test.jsonl, disjoint ranges of one seed. */
export const ARITH_FILES = {
  'train.jsonl': { seed: 1, first: 0, count: 4000 },
  'test.jsonl': { seed: 1, first: 4000, count: 400 },
} as const;

/**
 * A character-level tokenizer for the dataset (examples/arith/tokenizer/): padding, end and
 * unknown tokens, then newline and every printable ASCII character, one id each. A BPE model with
 * no merges (each character its own token) and a decoder that joins them as they are.
 */
export function arithTokenizer(): { json: Record<string, unknown>; config: Record<string, unknown> } {
  const special = ['<pad>', '<eos>', '<unk>'];
  const chars = ['\n', ...Array.from({ length: 95 }, (_, i) => String.fromCharCode(32 + i))];
  const vocab = Object.fromEntries([...special, ...chars].map((t, i) => [t, i]));
  const added = special.map((content, id) => ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }));
  return {
    json: {
      version: '1.0',
      truncation: null,
      padding: null,
      added_tokens: added,
      normalizer: null,
      pre_tokenizer: null,
      post_processor: null,
      decoder: { type: 'Fuse' },
      model: {
        type: 'BPE',
        dropout: null,
        unk_token: '<unk>',
        continuing_subword_prefix: null,
        end_of_word_suffix: null,
        fuse_unk: false,
        byte_fallback: false,
        ignore_merges: false,
        vocab,
        merges: [],
      },
    },
    config: { pad_token: '<pad>', eos_token: '<eos>', unk_token: '<unk>', model_max_length: 256, tokenizer_class: 'PreTrainedTokenizerFast' },
  };
}

/** The shipped tokenizer's files, as arithTokenizer() writes them. */
export function arithTokenizerFiles(): Record<string, string> {
  const { json, config } = arithTokenizer();
  return { 'tokenizer.json': `${JSON.stringify(json, null, 2)}\n`, 'tokenizer_config.json': `${JSON.stringify(config, null, 2)}\n` };
}
