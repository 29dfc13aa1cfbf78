// Every scenario file that ships is valid, and the editor schema matches the definition.
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadScenario } from '../engine/scenario.ts';
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

  it('scenario.schema.json is up to date (npm run schema regenerates it)', () => {
    expect(readFileSync(join(ROOT, SCHEMA_FILE), 'utf8')).toBe(schemaText());
  });
});
