// Every scenario file that ships is valid, and the editor schema matches the definition.
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { graphOf, loadScenario, planOnly, rowsOf } from '../engine/runtime/scenario/scenario.ts';
import { problemOf } from '../engine/runtime/plan/problem.ts';
import { SCHEMA_FILE, schemaText } from '../engine/cli/schema.ts';
import { ROOT } from './helpers.ts';

describe('shipped scenarios', () => {
  const files = [
    ...readdirSync(join(ROOT, 'scenarios')).filter((f) => f.endsWith('.yaml')),
    ...readdirSync(join(ROOT, 'scenarios', 'algorithms'))
      .filter((f) => f.endsWith('.yaml'))
      .map((f) => `algorithms/${f}`),
  ];

  it('include the quickstart', () => {
    expect(files).toContain('quickstart.yaml');
  });

  it.each(files)('%s is valid', (f) => {
    expect(() => loadScenario(join(ROOT, 'scenarios', f))).not.toThrow();
  });

  const cluster = readdirSync(join(ROOT, 'scenarios', 'cluster')).filter((f) => f.endsWith('.yaml'));

  it('include cluster-scale scenarios for planning, among them 7B on 8 GPUs and 70B on 128', () => {
    expect(cluster).toEqual(expect.arrayContaining(['llama7b-8gpu.yaml', 'llama70b-128gpu.yaml']));
    expect(cluster.length).toBeGreaterThanOrEqual(4);
  });

  it.each(cluster)('cluster/%s is valid, and only for planning', (f) => {
    expect(planOnly(loadScenario(join(ROOT, 'scenarios', 'cluster', f)))).toBeDefined();
  });

  it.each(cluster.filter((f) => !f.includes('longtail')))('cluster/%s: 512 sequences of 1024 + 1024 tokens', (f) => {
    const s = loadScenario(join(ROOT, 'scenarios', 'cluster', f));
    // 512 sequences per iteration: 512 prompts, or 64 prompts × 8 samples for GRPO.
    expect(rowsOf(s)).toBe(512);
    expect(s.lengths).toEqual({ prompt: 1024, response: 1024 });
  });

  it('the long-tail scenario: 64 prompts × 16 samples, responses of up to 16,384 tokens with a mean of 4,096', () => {
    const s = loadScenario(join(ROOT, 'scenarios', 'cluster', 'grpo-qwen7b-64gpu-longtail.yaml'));
    expect(rowsOf(s)).toBe(1024);
    expect(s.lengths).toEqual({ prompt: 1024, response: 16384, response_mean: 4096 });
    expect(problemOf(s).workload).toMatchObject({ responseLen: 16384, responseMean: 4096 });
  });

  it('a GRPO cluster scenario plans only its own calls, and prices every sample of every prompt', () => {
    const s = loadScenario(join(ROOT, 'scenarios', 'cluster', 'grpo-llama7b-8gpu.yaml'));
    const p = problemOf(s);
    expect(p.graph.calls.map((c) => c.name)).toEqual(['actor.generate', 'reference.inference', 'reward.inference', 'actor.train']);
    expect(p.graph.calls.every((c) => c.rows === 64 * 8)).toBe(true);
    expect(Object.keys(p.models)).toEqual(['actor', 'reference', 'reward']);
    // The reference starts from the policy, so it takes its shape.
    expect(p.models.reference).toBe(p.models.actor);
  });

  it('there is a scenario for every built-in algorithm', () => {
    const names = files.map((f) => graphOf(loadScenario(join(ROOT, 'scenarios', f))) && (loadScenario(join(ROOT, 'scenarios', f)).algorithm as { name: string }).name);
    expect(new Set(names)).toEqual(new Set(['ppo', 'grpo', 'rloo', 'remax', 'reinforce_pp', 'dpo']));
  });

  it.each(files)('%s runs here (it is not a plan-only scenario)', (f) => {
    expect(planOnly(loadScenario(join(ROOT, 'scenarios', f)))).toBeUndefined();
  });

  it('scenario.schema.json is up to date (npm run schema regenerates it)', () => {
    expect(readFileSync(join(ROOT, SCHEMA_FILE), 'utf8')).toBe(schemaText());
  });
});
