// npm run sample: a trained model of a real run (worker processes over NATS, the actor split over
// two devices) comes back from the run's checkpoint and continues a prompt.
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { launch } from '../engine/cli/launch.ts';
import { SampleError, sampleRun } from '../engine/runtime/index.ts';
import { loadScenario } from '../engine/runtime/scenario/scenario.ts';
import { smallScenario, spawnTs, tempDir } from './helpers.ts';

const quiet = { phase() {}, iteration() {}, stop() {} };
/** count, base 8: prompts [a, b, 8], answers a..b then the end token 9; vocabulary 10, budget 9. */
const COUNT = 'task: { name: count, base: 8 }\nalgorithm: grpo\nplan:\n  actor.train: { mesh: "0:0-1", tp: 2 }\n';
const PROMPT = [2, 5, 8];

describe('npm run sample', () => {
  const dir = tempDir();
  const run = join(dir, 'run');
  beforeAll(async () => {
    const r = await launch({ scenario: loadScenario(smallScenario(dir, COUNT, 'sample')), run: `sample${Date.now()}`, out: run, progress: quiet, say: () => {} });
    expect(r.code).toBe(0);
  }, 120_000);

  it('prints the continuation and each token’s log-probability as one JSON object', async () => {
    const p = spawnTs('engine/cli/sample.ts', ['--model', run, '--tokens', PROMPT.join(','), '--greedy', '--json']);
    expect(await p.exited).toBe(0);
    const line = p.output().trim().split('\n').at(-1)!;
    const out = JSON.parse(line) as { tokens: number[]; logprobs: number[] };
    expect(out.tokens.length).toBeGreaterThan(0);
    expect(out.tokens.length).toBeLessThanOrEqual(9);
    // It stops at the end token, or at the budget.
    expect(out.tokens.indexOf(9) === -1 ? out.tokens.length === 9 : out.tokens.indexOf(9) === out.tokens.length - 1).toBe(true);
    expect(out.logprobs).toHaveLength(out.tokens.length);
    // Greedy takes the likeliest token: its probability is at least 1/V.
    for (const l of out.logprobs) expect(l).toBeGreaterThanOrEqual(-Math.log(10) - 1e-5);
    expect(out.logprobs.every((l) => l <= 0)).toBe(true);
  }, 60_000);

  it('is the same for the same seed (greedy or sampled), and a sample is no likelier than greedy at its first step', async () => {
    const greedy = await sampleRun(run, { tokens: PROMPT, greedy: true });
    expect(await sampleRun(run, { tokens: PROMPT, greedy: true })).toEqual(greedy);
    const a = await sampleRun(run, { tokens: PROMPT, seed: 4, temperature: 2 });
    expect(await sampleRun(run, { tokens: PROMPT, seed: 4, temperature: 2 })).toEqual(a);
    expect(a.logprobs[0]!).toBeLessThanOrEqual(greedy.logprobs[0]! + 1e-6);
    const short = await sampleRun(run, { tokens: PROMPT, greedy: true, maxTokens: 2 });
    expect(short.tokens).toEqual(greedy.tokens.slice(0, Math.min(2, greedy.tokens.length)));
  }, 60_000);

  it('refuses what it cannot do, saying what was expected', async () => {
    await expect(sampleRun(run, { tokens: [2, 5, 12] })).rejects.toThrow(/prompt token 3: expected an id in 0\.\.9 \(the model's vocabulary\), got 12/);
    await expect(sampleRun(run, { tokens: PROMPT, maxTokens: 20 })).rejects.toThrow(/a prompt of 3 tokens and 20 new ones need 23 positions; the model has 12/);
    await expect(sampleRun(run, { tokens: PROMPT, model: 'critic' })).rejects.toThrow(SampleError);
    await expect(sampleRun(dir, { tokens: PROMPT })).rejects.toThrow(/expected a run directory \(scenario\.json and checkpoint\.msgpack\)/);
    const p = spawnTs('engine/cli/sample.ts', ['--model', run, '--prompt', 'hello']);
    // The run's task (count) reads no text: a refusal of what the run is, not of the command line.
    expect(await p.exited).toBe(1);
    expect(p.output()).toMatch(/--prompt: text prompts need a tokenizer, and the 'count' task has none; give the prompt as --tokens/);
  }, 60_000);
});
