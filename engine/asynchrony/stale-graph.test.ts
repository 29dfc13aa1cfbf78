import { describe, expect, it } from 'vitest';
import { graphOf, parseScenario, resolvePlan, ScenarioError } from '../runtime/scenario/scenario.ts';

const graph = (yaml: string) => graphOf(parseScenario(yaml, 'test.yaml'));
const call = (yaml: string, name: string) => graph(yaml).calls.find((c) => c.name === name);

describe('the graph of stale rollouts', () => {
  it('at lag 0 is the algorithm’s own graph', () => {
    const [lagged, plain] = [graph('algorithm: grpo\nrl: { lag: 0 }'), graph('algorithm: grpo')];
    expect(lagged.calls).toEqual(plain.calls);
    expect(lagged.models).toEqual(plain.models);
    expect(lagged.steps.map((x) => x.name)).toEqual(plain.steps.map((x) => x.name));
  });

  it('gains the proximal policy’s pass on the train mesh, and the actor trains with the decoupled loss on the same clip and KL', () => {
    const yaml = 'algorithm: { name: grpo, kl: loss, clip_high: 0.28 }\nrl: { lag: 1, clip: 0.15, kl_coef: 0.01 }\nplan: { actor.train: { mesh: "0:2" } }\ncluster: { nodes: 1, devices_per_node: 4 }';
    expect(call(yaml, 'actor.prox')).toEqual({ name: 'actor.prox', model: 'actor', fn: 'inference', placedWith: 'actor.train', reads: { tokens: 'tokens' }, writes: { logprobs: 'prox_logprobs' } });
    const train = call(yaml, 'actor.train')!;
    expect(train.fn === 'train' && train.loss.name).toBe('decoupled');
    expect(train.fn === 'train' && train.loss.params).toMatchObject({ clip: 0.15, clip_high: 0.28, kl_coef: 0.01, kl: 'k3' });
    expect(train.reads).toEqual({ tokens: 'tokens', advantages: 'advantages', ref: 'ref_logprobs', behav: 'logprobs', prox: 'prox_logprobs' });
    expect(resolvePlan(parseScenario(yaml, 'test.yaml'))['actor.prox']).toMatchObject({ mesh: '0:2', devices: [2] });
  });

  it('is the same graph whether the scenario names clip_policy or leaves it to its default (a resolved scenario read back names it)', () => {
    expect(graph('algorithm: { name: grpo, loss: clip_policy }\nrl: { lag: 1 }').calls).toEqual(graph('algorithm: grpo\nrl: { lag: 1 }').calls);
  });

  it('keeps another loss: one with a prox port reads the proximal policy, another the behaviour policy as before', () => {
    const decoupled = call('algorithm: { name: grpo, loss: decoupled }\nrl: { lag: 1 }', 'actor.train')!;
    expect(decoupled.reads.prox).toBe('prox_logprobs');
    expect(decoupled.reads.behav).toBe('logprobs');
    const g = graph('algorithm: { name: grpo, loss: gspo }\nrl: { lag: 1 }');
    expect(g.calls.map((c) => c.name)).not.toContain('actor.prox');
    expect(g.calls.find((c) => c.name === 'actor.train')!.reads.old).toBe('logprobs');
  });

  it('PPO: the actor’s update goes decoupled, the critic’s is left as it is', () => {
    const g = graph('algorithm: ppo\nrl: { lag: 2, iterations: 5 }');
    expect(g.calls.find((c) => c.name === 'critic.train')).toEqual(graph('algorithm: ppo').calls.find((c) => c.name === 'critic.train'));
    expect(g.calls.map((c) => c.name)).toContain('actor.prox');
  });

  it('an algorithm of pairs cannot lag: refused naming rl.lag', () => {
    expect(() => graph('algorithm: dpo\nrl: { lag: 1 }')).toThrow(ScenarioError);
    expect(() => graph('algorithm: dpo\nrl: { lag: 1 }')).toThrow(/rl\.lag: this algorithm learns from preference pairs/);
  });
});
