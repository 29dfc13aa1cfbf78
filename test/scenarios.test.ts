// Every scenario file that ships is valid, and the editor schema matches the definition.
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadScenario, planOnly } from '../engine/scenario.ts';
import { SCHEMA_FILE, schemaText } from '../engine/cli/schema.ts';
import { ROOT } from './helpers.ts';

describe('shipped scenarios', () => {
  const files = readdirSync(join(ROOT, 'scenarios')).filter((f) => f.endsWith('.yaml'));

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
    const s = loadScenario(join(ROOT, 'scenarios', 'cluster', f));
    expect(planOnly(s)).toBeDefined();
    expect(s.rl.batch).toBe(512);
    expect(s.lengths).toEqual({ prompt: 1024, response: 1024 });
  });

  it.each(files)('%s runs here (it is not a plan-only scenario)', (f) => {
    expect(planOnly(loadScenario(join(ROOT, 'scenarios', f)))).toBeUndefined();
  });

  it('scenario.schema.json is up to date (npm run schema regenerates it)', () => {
    expect(readFileSync(join(ROOT, SCHEMA_FILE), 'utf8')).toBe(schemaText());
  });
});
