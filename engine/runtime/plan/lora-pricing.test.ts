// The planner prices a model with LoRA adapters as what it is: moments for the adapters alone, a
// backward pass without the frozen matrices' own gradients, views filled with the adapters once the
// base is there, snapshots of what trains.
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { parseScenario } from '../scenario/scenario.ts';
import { candidateOf, problemOf } from './problem.ts';
import { Evaluator } from './planner.ts';
import { loraShare } from './cost.ts';
import type { DeviceProfile } from './catalog.ts';
import { adapterCount, defaultTargets } from '../../adapters/index.ts';
import { baseSpec, parameterShapes } from '../../model/index.ts';
import { policySpec } from '../scenario/scenario.ts';

const profile = JSON.parse(readFileSync('profiles/default-local.json', 'utf8')) as DeviceProfile;
const text = (lora: string) => `name: p
task: { name: sort, digits: 4, base: 10 }
model: { family: llama, layers: 2, width: 256, heads: 4${lora} }
cluster: { nodes: 1, devices_per_node: 2 }
algorithm: { name: grpo, group: 4 }
plan: { actor.train: { mesh: "0:0" }, actor.generate: { mesh: "0:1" }, reference.inference: { mesh: "0:1" }, reward.inference: { mesh: "0:1" } }
rl: { iterations: 4, batch: 16 }
`;

describe('the planner and LoRA', () => {
  it("the adapters' share is what engine/adapters counts", () => {
    const s = parseScenario(text(', lora: { rank: 8 }'), 'p.yaml');
    const spec = policySpec(s);
    const p = problemOf(s, profile);
    const base = parameterShapes(baseSpec(spec));
    const adapters = adapterCount('llama', base, spec.layers, { rank: 8, alpha: 8, targets: defaultTargets('llama') });
    const total = base.reduce((n: number, [, sh]: [string, number[]]) => n + sh.reduce((a: number, b: number) => a * b, 1), 0);
    expect(p.models.actor!.trainedShare).toBeCloseTo(adapters / (total + adapters), 2);
    expect(p.models.reference!.trainedShare).toBeUndefined();
    expect(loraShare(p.models.reference!, { rank: 8, targets: ['q_proj'] }, false)).toBeLessThan(p.models.actor!.trainedShare!);
  });

  it('prices less memory on the trainer, a cheaper step, and fills of the adapters alone', () => {
    const [full, lora] = ['', ', lora: { rank: 8 }'].map((l) => {
      const s = parseScenario(text(l), 'p.yaml');
      return new Evaluator(problemOf(s, profile)).evaluate(candidateOf(s));
    });
    expect(lora!.calls['actor.train'].memoryBytes).toBeLessThan(full!.calls['actor.train'].memoryBytes);
    expect(lora!.calls['actor.train'].seconds).toBeLessThan(full!.calls['actor.train'].seconds);
    // The bytes shrink to a few percent; the bus's latency per message stays.
    expect(lora!.calls['actor.generate'].reallocSeconds).toBeLessThan(full!.calls['actor.generate'].reallocSeconds / 3);
    expect(lora!.iterationSeconds).toBeLessThan(full!.iterationSeconds);
  });
});
