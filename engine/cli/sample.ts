// npm run sample -- --model RUN_DIR|HF_DIR --tokens 1,2,3 | --prompt TEXT [--model-name NAME] [--max-tokens N] [--greedy] [--temperature T] [--seed S] [--json]
// Prints a model's continuation of a prompt, and the log-probability of each new token.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { UsageError, args, runMain } from '../../actors/host.ts';
import { sampleHf, sampleRun } from '../runtime/index.ts';

const USAGE = `usage: npm run sample -- --model RUN_DIR|HF_DIR --tokens 1,2,3 | --prompt TEXT [--model-name NAME] [--max-tokens N] [--greedy] [--temperature T] [--seed S] [--json]
  --model        a run directory (the model comes back from its last checkpoint), or a Hugging Face
                 model directory of the gpt2 or llama family (config.json, model.safetensors, tokenizer.json)
  --tokens       the prompt as token ids, separated by commas
  --prompt       the prompt as text (a Hugging Face directory with its tokenizer.json, or a run
                 that read a dataset through one)
  --model-name   which of a run's policy models (default: the trained one)
  --max-tokens   new tokens at most (default: the task's budget, or 32); generation also stops at the end token
  --greedy       the likeliest token at every step instead of a sample
  --json         one object: {"tokens": [...], "logprobs": [...]}`;

/** A number option: whole (and ≥ 0) or any finite number > 0. */
function number(name: string, text: string | undefined, whole: boolean): number | undefined {
  if (text === undefined) return undefined;
  const n = Number(text);
  const ok = whole ? Number.isInteger(n) && n >= 0 : Number.isFinite(n) && n > 0;
  if (text.trim() === '' || !ok) throw new UsageError(`--${name}: expected ${whole ? 'a whole number' : 'a number > 0'}, got ${JSON.stringify(text)}`);
  return n;
}

runMain(async () => {
  const { values, positionals } = args(USAGE, {
    model: { type: 'string' },
    tokens: { type: 'string' },
    prompt: { type: 'string' },
    'model-name': { type: 'string' },
    'max-tokens': { type: 'string' },
    greedy: { type: 'boolean', default: false },
    temperature: { type: 'string' },
    seed: { type: 'string' },
    json: { type: 'boolean', default: false },
  });
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  if (positionals.length > 0) throw new UsageError(`unexpected ${JSON.stringify(positionals[0])}\n${USAGE}`);
  if (!values.model) throw new UsageError(`--model: expected a run directory or a Hugging Face model directory\n${USAGE}`);
  const hf = existsSync(join(values.model, 'config.json')) && !existsSync(join(values.model, 'scenario.json'));
  if ((values.tokens === undefined) === (values.prompt === undefined)) throw new UsageError(`expected the prompt as --tokens (ids, separated by commas) or as --prompt TEXT, one of the two\n${USAGE}`);
  const tokens = values.tokens?.split(',').map((t, i) => {
    const n = Number(t);
    if (t.trim() === '' || !Number.isInteger(n) || n < 0) throw new UsageError(`--tokens: item ${i + 1}: expected a token id (a whole number ≥ 0), got ${JSON.stringify(t)}`);
    return n;
  });
  const common = {
    ...(values['max-tokens'] === undefined ? {} : { maxTokens: number('max-tokens', values['max-tokens'], true)! }),
    greedy: values.greedy,
    ...(values.temperature === undefined ? {} : { temperature: number('temperature', values.temperature, false)! }),
    ...(values.seed === undefined ? {} : { seed: number('seed', values.seed, true)! }),
  };
  const s = hf
    ? await sampleHf(values.model, { ...common, ...(tokens ? { tokens } : { prompt: values.prompt! }) })
    : await sampleRun(values.model, { ...(tokens ? { tokens } : { prompt: values.prompt! }), ...(values['model-name'] === undefined ? {} : { model: values['model-name'] }), ...common });
  if (values.json) {
    console.log(JSON.stringify({ tokens: s.tokens, logprobs: s.logprobs }));
  } else {
    if ('text' in s && s.text !== undefined) console.log(s.text);
    console.log(`${s.model}: ${s.tokens.join(' ')}${s.ended ? '' : ' (at the limit, no end token)'}`);
    console.log(`log-probabilities: ${s.logprobs.map((l) => l.toFixed(3)).join(' ')}`);
  }
  return 0;
});
