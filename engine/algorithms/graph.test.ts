// Graphs as data: what validateGraph refuses (with the names involved), and how runGraph runs
// nodes as their fields appear, independent ones at once.
import { describe, expect, it } from 'vitest';
import { BUILTIN, algorithmOf } from './registry.ts';
import { GraphError, runGraph, validateGraph, type Graph } from './graph.ts';
import type { RlConfig } from './algorithm.ts';

const RL: RlConfig = { iterations: 1, batch: 4, epochs: 1, minibatches: 1, clip: 0.2, kl_coef: 0.1, temperature: 1, lr: 1e-3, clip_norm: 1 };
const grpo = () => BUILTIN.grpo!.graph(BUILTIN.grpo!.options.parse({}), RL);
const refusal = (g: Graph) => {
  try {
    validateGraph(g, 'mine');
  } catch (e) {
    expect(e).toBeInstanceOf(GraphError);
    return (e as Error).message;
  }
  throw new Error('the graph was accepted');
};

describe('validateGraph', () => {
  it('accepts every built-in algorithm with its default options', () => {
    for (const a of Object.values(BUILTIN)) expect(() => validateGraph(a.graph(a.options.parse({}), RL), a.name)).not.toThrow();
  });

  it('refuses a cycle, naming the calls and steps on it', () => {
    const g = grpo();
    // The advantage step now also reads what the train call writes: train → advantages → train.
    g.steps[0]!.reads.push('actor_loss');
    expect(refusal(g)).toMatch(/a cycle: .*advantages.*actor\.train|a cycle: .*actor\.train.*advantages/);
  });

  it('refuses an input no call produces', () => {
    const g = grpo();
    g.calls[1]!.reads.tokens = 'tokenz';
    expect(refusal(g)).toContain("'reference.inference' reads field 'tokenz', which no call or step writes");
  });

  it('refuses a call on a model the algorithm does not declare, listing the ones it has', () => {
    const g = grpo();
    g.calls.push({ name: 'critic.inference', model: 'critic', fn: 'inference', reads: { tokens: 'tokens' }, writes: { values: 'values' } });
    expect(refusal(g)).toContain("call 'critic.inference' is on model 'critic', which the algorithm does not declare (it has actor, reference, reward)");
  });

  it('refuses a trained model with no train call, and a train call on a frozen model', () => {
    const g = grpo();
    g.calls = g.calls.filter((c) => c.fn !== 'train');
    expect(refusal(g)).toContain("model 'actor' is trained but no call trains it");
    const h = grpo();
    h.models[1]!.trained = false;
    h.calls.push({
      name: 'reference.train',
      model: 'reference',
      fn: 'train',
      loss: { name: 'clip_policy', params: { clip: 0.2 } },
      reads: { tokens: 'tokens', old: 'logprobs', advantages: 'advantages' },
      writes: { loss: 'ref_loss' },
    });
    expect(refusal(h)).toContain("call 'reference.train' trains 'reference', which the algorithm declares frozen");
  });

  it('refuses a field written twice, a wrong port, and generation by a model without a token head', () => {
    const g = grpo();
    g.calls.push({ name: 'reward.inference_again', model: 'reward', fn: 'inference', reads: { tokens: 'tokens' }, writes: { scores: 'scores' } });
    expect(refusal(g)).toContain("field 'scores' is written by both 'reward.inference' and 'reward.inference_again'");
    const h = grpo();
    h.calls[1]!.writes = { values: 'ref_logprobs' };
    expect(refusal(h)).toContain("call 'reference.inference' writes port 'values'; a inference call of a policy model has logprobs");
    const k = grpo();
    k.calls.push({ name: 'reward.generate', model: 'reward', fn: 'generate', reads: { prompts: 'prompts' }, writes: { tokens: 'other' } });
    expect(refusal(k)).toContain("call 'reward.generate' generates with 'reward', which has a reward head");
  });

  it('an unknown algorithm lists the known ones', () => {
    expect(() => algorithmOf('ppo2')).toThrow(/unknown algorithm 'ppo2'; known: ppo, grpo, rloo, remax, reinforce_pp, dpo/);
  });
});

describe('runGraph', () => {
  it('starts every node whose fields exist at once, and the rest as their inputs arrive', async () => {
    const g = grpo();
    const log: string[] = [];
    let running = 0;
    let most = 0;
    const out = await runGraph(g, { prompts: new Int32Array(4) }, async (node, inputs) => {
      const name = node.kind === 'call' ? node.call.name : node.step.name;
      log.push(`start ${name}`);
      running += 1;
      most = Math.max(most, running);
      await new Promise((r) => setTimeout(r, 5));
      running -= 1;
      if (node.kind === 'step') return { advantages: new Float32Array(1), kl: Object.keys(inputs).length };
      return Object.fromEntries(Object.values(node.call.writes).map((f) => [f, f.endsWith('loss') ? 1 : new Float32Array(1)]));
    });
    // Reference and reward inference both wait for generation only, and run side by side.
    expect(log.indexOf('start actor.generate')).toBe(0);
    expect(log.slice(1, 3).sort()).toEqual(['start reference.inference', 'start reward.inference']);
    expect(most).toBe(2);
    expect(log.at(-1)).toBe('start actor.train');
    expect(out.kl).toBe(5); // scores, logprobs, ref_logprobs, mask, step_rewards
    expect(out.actor_loss).toBe(1);
  });

  it('fails with the first error and names a node that did not produce its field', async () => {
    const g = grpo();
    await expect(runGraph(g, { prompts: new Int32Array(4) }, async () => ({}))).rejects.toThrow("'actor.generate' did not produce field 'tokens'");
    await expect(
      runGraph(g, { prompts: new Int32Array(4) }, async () => {
        throw new Error('device 3 is gone');
      }),
    ).rejects.toThrow('device 3 is gone');
  });
});
