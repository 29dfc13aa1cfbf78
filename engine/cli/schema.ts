// npm run schema: writes scenarios/scenario.schema.json, the JSON Schema of scenario files that
// editors use for completion and checking. It is generated from the same definition that
// validates scenarios, and a test fails if the committed file is stale.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { runMain } from '../../actors/host.ts';
import { scenarioJsonSchema } from '../runtime/index.ts';

export const SCHEMA_FILE = join('scenarios', 'scenario.schema.json');

export function schemaText(): string {
  return `${JSON.stringify(scenarioJsonSchema(), null, 2)}\n`;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  runMain(async () => {
    writeFileSync(SCHEMA_FILE, schemaText());
    console.log(`wrote ${SCHEMA_FILE}`);
    return 0;
  });
}
