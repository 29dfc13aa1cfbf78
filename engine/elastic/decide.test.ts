import { describe, expect, it } from 'vitest';
import { runSpec } from '../runtime/run/run.ts';
import { parseScenario } from '../runtime/scenario/scenario.ts';
import { decideReplan, placementsOf, specOnPlan } from './decide.ts';

const FOUR = `
seed: 5
task: { name: sort, digits: 4, base: 10 }
model: { layers: 2, width: 32, heads: 4 }
cluster: { nodes: 1, devices_per_node: 4 }
plan:
  actor.train: { mesh: "0:0-1", dp: 2 }
  actor.generate: { mesh: "0:2-3", tp: 2 }
  critic.train: { mesh: "0:0-1", pp: 2 }
  critic.inference: { mesh: "0:2-3", dp: 2 }
  reference.inference: { mesh: "0:2-3", tp: 2 }
  reward.inference: { mesh: "0:3" }
rl: { iterations: 6, batch: 32 }
`;
const spec = (extra = 'elastic: { search_seconds: 0.5 }\n') => runSpec(parseScenario(`${FOUR}${extra}`, 'x.yaml'));
const devicesOf = (p: Record<string, { mesh: string }>) => Object.values(p).map((x) => x.mesh);

describe('decideReplan', () => {
  it('plans the devices left, within the budget, and says what it decided with both estimates', () => {
    const r = spec();
    const { spec: next, record } = decideReplan(r, [], { devices: [3], trigger: 'chaos', reason: 'gone' }, 3);
    expect(record).toMatchObject({ iteration: 3, trigger: 'chaos', lost: [3], reason: 'gone', plan_before: placementsOf(r) });
    expect(record.plans_evaluated).toBeGreaterThan(0);
    expect(record.plans_evaluated).toBeLessThanOrEqual(2000); // 0.5 s of evaluations (4000 a second)
    expect(record.estimated_period_after).toBeGreaterThan(0);
    expect(record.why).toMatch(/^device\(s\) 3 lost: a new plan on 3 device\(s\)/);
    for (const p of Object.values(next.plan)) expect(p.devices).not.toContain(3);
    expect(placementsOf(next)).toEqual(record.plan_after);
    expect(next.rewardService).toBe(r.rewardService);
    // The same loss, decided twice: the same plan (the search is seeded).
    expect(decideReplan(r, [], { devices: [3], trigger: 'chaos', reason: 'gone' }, 3).record.plan_after).toEqual(record.plan_after);
  });

  it('plans on from a plan that lost devices before', () => {
    const r = spec();
    const first = decideReplan(r, [], { devices: [3], trigger: 'chaos', reason: 'gone' }, 2);
    const second = decideReplan(first.spec, [3], { devices: [2], trigger: 'cordon', reason: 'maintenance' }, 4);
    for (const mesh of devicesOf(second.record.plan_after)) expect(['0:0', '0:1', '0:0-1']).toContain(mesh);
  });

  it('a spec on a plan the scenario could not hold is refused as a scenario file would be', () => {
    expect(() => specOnPlan(spec(), { 'actor.train': { mesh: '0:0-1', dp: 4, tp: 1, pp: 1 } })).toThrow(/plan\.actor\.train: dp×tp×pp = 4×1×1 = 4, but mesh "0:0-1" has 2 device/);
  });
});
