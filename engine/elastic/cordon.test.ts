import { describe, expect, it } from 'vitest';
import { runSpec } from '../runtime/run/run.ts';
import { FOUR_DEVICES } from '../runtime/run/four-devices.fixture.ts';
import { parseScenario } from '../runtime/scenario/scenario.ts';
import { cordonProblem } from './cordon.ts';

const FOUR = `${FOUR_DEVICES}rl: { iterations: 6, batch: 32 }\n`;
const spec = (extra = 'elastic: { search_seconds: 0.5 }\n') => runSpec(parseScenario(`${FOUR}${extra}`, 'x.yaml'));

describe('cordonProblem', () => {
  it('takes a device of an elastic run that the devices left can do without', async () => {
    expect(await cordonProblem(spec(), [0, 1, 2, 3], [], { device: 2, trigger: 'cordon' }, 1)).toBeUndefined();
  });

  it('refuses a run that is not elastic, a device it does not have, its last device', async () => {
    expect(await cordonProblem(spec(''), [0, 1, 2, 3], [], { device: 2, trigger: 'cordon' }, 1)).toMatch(/this run is not elastic/);
    expect(await cordonProblem(spec(), [0, 1, 2, 3], [], { device: 9, trigger: 'cordon' }, 1)).toBe("device 9 is not one of this run's devices (0, 1, 2, 3)");
    expect(await cordonProblem(spec(), [0], [], { device: 0, trigger: 'intensity' }, 1)).toBe("device 0 is the run's last device: no plan runs on none");
  });

  it("refuses an operator's cordon that no plan on the devices left survives, naming the model and the memory it needs", async () => {
    // 7B trained with Adam needs about 112 GB: on two 80 GB devices it fits, on the one left it does not.
    const big = runSpec(
      parseScenario(
        `seed: 1\ntask: { name: sort, digits: 4, base: 10 }\nmodel: { layers: 2, width: 32, heads: 4 }\ncluster: { nodes: 1, devices_per_node: 2, device: h100-80gb }\nmodels: { actor: llama2-7b }\nalgorithm: { name: grpo, group: 2 }\nplan:\n  actor.train: { mesh: "0:0-1", tp: 2 }\n  actor.generate: { mesh: "0:0-1", tp: 2 }\nelastic: { search_seconds: 0.2 }\n`,
        'x.yaml',
      ),
    );
    expect(await cordonProblem(big, [0, 1], [], { device: 1, trigger: 'cordon' }, 1)).toMatch(
      /the run cannot go on without device 1: no plan fits the 1 device\(s\) left \(0\) after losing 1: .*actor.* needs [\d.]+ GB/,
    );
  });
});
