// A small local scenario for the planner's tests of asynchrony, written to a temporary file.
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/** A file: two local devices, a reward actor that takes `actorSeconds` per request (none at 0). */
export function smallScenarioText(name: string, actorSeconds: number, algorithm = 'grpo', iterations = 8): string {
  const file = join(mkdtempSync(join(tmpdir(), 'ferry-pipeline-')), `${name}.yaml`);
  const reward = actorSeconds > 0 ? `reward: { weight: 0.5, actors: [{ name: slow, weight: 0.5, seconds: ${actorSeconds} }] }\n` : '';
  writeFileSync(
    file,
    `name: ${name}
task: { name: sort, digits: 4, base: 10 }
model: { layers: 2, width: 64, heads: 4 }
cluster: { nodes: 1, devices_per_node: 2 }
algorithm: ${algorithm === 'grpo' ? '{ name: grpo, group: 4 }' : algorithm}
rl: { iterations: ${iterations}, batch: 16 }
${reward}`,
  );
  return file;
}
