import { describe, expect, it } from 'vitest';
import { parseScenario } from '../scenario/scenario.ts';
import { keptProblem, responseStats, rewardItems, runSpec } from './run.ts';

describe('rollouts of a task whose answers end (count, base 6: budget 7, EOS 7)', () => {
  const r = runSpec(parseScenario('task: { name: count, base: 6 }\nalgorithm: grpo\ncluster: { devices_per_node: 3 }', 'c.yaml'));
  // prompt [a, b, sep], then 7 response tokens
  const tokens = Int32Array.from([
    ...[1, 3, 6, 1, 2, 3, 7, 7, 7, 7], // right: 1 2 3 EOS
    ...[4, 4, 6, 4, 5, 1, 2, 3, 4, 5], // never ends: the budget
    ...[0, 2, 6, 0, 7, 3, 3, 3, 3, 3], // ends after one token; what follows is padding
  ]);

  it('reward items carry each response up to its end, and text without the end token', () => {
    const items = rewardItems(r, 0, tokens);
    expect(items.map((i) => i.response)).toEqual([
      [1, 2, 3, 7],
      [4, 5, 1, 2, 3, 4, 5],
      [0, 7],
    ]);
    expect(items.map((i) => i.response_text)).toEqual(['123', '4512345', '0']);
    expect(items.map((i) => i.ground_truth)).toEqual(['123', '4', '012']);
  });

  it('metrics: mean length (end token counted) and the share that ran into the budget', () => {
    expect(responseStats(r, tokens)).toEqual({ response_length: (4 + 7 + 2) / 3, response_at_limit: 1 / 3 });
  });

  it('a task without an end token reports no lengths (every response is the budget long)', () => {
    const sort = runSpec(parseScenario('task: { name: sort, digits: 2 }', 's.yaml'));
    expect(responseStats(sort, new Int32Array(2 * 5))).toEqual({});
  });
});

describe('keptProblem: a stage record read back must hold what the call writes', () => {
  const r = runSpec(parseScenario('{}', 'k.yaml'));
  const gen = r.graph.calls.find((c) => c.fn === 'generate')!;
  const ports = Object.fromEntries(Object.keys(gen.writes).map((p) => [p, p === 'tokens' ? new Int32Array(4) : new Float32Array(4)]));

  it('accepts the ports as typed arrays, with numeric sources', () => {
    expect(keptProblem(gen, { ports, generated: 3, sources: { rule: 0.5 } })).toBeUndefined();
  });

  it('refuses what is missing or not numbers, naming it', () => {
    expect(keptProblem(gen, null)).toBe('no ports');
    expect(keptProblem(gen, { ports: { ...ports, tokens: [1, 2] } })).toBe('port tokens is not an array of numbers');
    expect(keptProblem(gen, { ports: {} })).toMatch(/^port \w+ is not an array of numbers$/);
    expect(keptProblem(gen, { ports, sources: { rule: 'x' } })).toBe('sources are not numbers');
    expect(keptProblem(gen, { ports, generated: '3' })).toBe('generated is not a number');
  });
});
