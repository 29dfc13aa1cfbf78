// npm run eval -- RUN_DIR --data FILE.jsonl [--model NAME] [--max N] [--sample] [--seed S] [--json]
// Scores a run's policy on a dataset it did not train on, with the run's tokenizer and verifier.
import { UsageError, args, runMain } from '../../actors/host.ts';
import { evaluateRun } from '../runtime/index.ts';

const USAGE = `usage: npm run eval -- RUN_DIR --data FILE.jsonl [--model NAME] [--max N] [--sample] [--seed S] [--json]
  RUN_DIR   a run that read a dataset (data:): its last checkpoint is scored
  --data    a JSONL file with the fields the run's data: names (e.g. examples/arith/test.jsonl)
  --model   which of the run's policy models (default: the trained one)
  --max     rows at most (default: every row), in the run's seeded order
  --sample  sample at the run's temperature (default: greedy, the likeliest token)
  --json    one object: {"model", "rows", "correct", "accuracy", "greedy"}`;

runMain(async () => {
  const { values, positionals } = args(USAGE, {
    data: { type: 'string' },
    model: { type: 'string' },
    max: { type: 'string' },
    sample: { type: 'boolean', default: false },
    seed: { type: 'string' },
    json: { type: 'boolean', default: false },
  });
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  if (positionals.length !== 1) throw new UsageError(`expected one run directory, got ${positionals.length ? positionals.map((p) => JSON.stringify(p)).join(' ') : 'none'}\n${USAGE}`);
  if (!values.data) throw new UsageError(`--data: expected a JSONL file to score the policy on\n${USAGE}`);
  const whole = (name: string, text: string | undefined) => {
    if (text === undefined) return undefined;
    const n = Number(text);
    if (text.trim() === '' || !Number.isInteger(n) || n < (name === 'max' ? 1 : 0))
      throw new UsageError(`--${name}: expected a whole number${name === 'max' ? ' > 0' : ''}, got ${JSON.stringify(text)}`);
    return n;
  };
  const max = whole('max', values.max);
  const seed = whole('seed', values.seed);
  const out = await evaluateRun(positionals[0]!, {
    data: values.data,
    ...(values.model === undefined ? {} : { model: values.model }),
    ...(max === undefined ? {} : { max }),
    ...(seed === undefined ? {} : { seed }),
    sample: values.sample,
  });
  if (values.json) console.log(JSON.stringify(out));
  else console.log(`${out.model}: ${out.correct} of ${out.rows} right (${(100 * out.accuracy).toFixed(1)}%), ${out.greedy ? 'greedy' : 'sampled'}`);
  return 0;
});
