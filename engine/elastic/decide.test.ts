import { describe, expect, it } from 'vitest';
import { runSpec } from '../runtime/run/run.ts';
import { FOUR_DEVICES } from '../runtime/run/four-devices.fixture.ts';
import { join } from 'node:path';
import { loadScenario, parseScenario, withPlan } from '../runtime/scenario/scenario.ts';
import { ROOT } from '../../test/helpers.ts';
import { decideReplan, placementsOf, specOnPlan } from './decide.ts';
import { decideOffThread } from './search-thread.ts';

const FOUR = `${FOUR_DEVICES}rl: { iterations: 6, batch: 32 }\n`;
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

  it("prices at the machine's speed the run measured: the same plan, the estimates scaled by the measured period over the fitted estimate", () => {
    const r = spec();
    const loss = { devices: [3], trigger: 'chaos' as const, reason: 'gone' };
    const fitted = decideReplan(r, [], loss, 3).record;
    expect(fitted.machine_speed).toBeUndefined();
    const measured = fitted.estimated_period_before * 1.3;
    const { record } = decideReplan(r, [], loss, 3, undefined, measured);
    expect(record.machine_speed).toBeCloseTo(1.3, 9);
    expect(record.measured_period_before).toBe(measured);
    expect(record.plan_after).toEqual(fitted.plan_after);
    expect(record.estimated_period_before).toBeCloseTo(measured, 9);
    expect(record.estimated_period_after).toBeCloseTo(fitted.estimated_period_after * 1.3, 9);
    expect(record.estimated_migration_seconds).toBeCloseTo(fitted.estimated_migration_seconds * 1.3, 9);
  });

  it('plans on from a plan that lost devices before', () => {
    const r = spec();
    const first = decideReplan(r, [], { devices: [3], trigger: 'chaos', reason: 'gone' }, 2);
    const second = decideReplan(first.spec, [], { devices: [2], trigger: 'cordon', reason: 'maintenance' }, 4);
    for (const mesh of devicesOf(second.record.plan_after)) expect(['0:0', '0:1', '0:0-1']).toContain(mesh);
  });

  it('a spec on a plan the scenario could not hold is refused as a scenario file would be', () => {
    expect(() => specOnPlan(spec(), { 'actor.train': { mesh: '0:0-1', dp: 4, tp: 1, pp: 1 } })).toThrow(/plan\.actor\.train: dp×tp×pp = 4×1×1 = 4, but mesh "0:0-1" has 2 device/);
  });
});

describe('decideReplan after a join', () => {
  // GRPO on LLaMA-2 7B over 8 A100s (scenarios/cluster/grpo-llama7b-8gpu.yaml), planned for 50 iterations.
  const cluster = () => {
    const s = loadScenario(join(ROOT, 'scenarios', 'cluster', 'grpo-llama7b-8gpu.yaml'));
    // Every call on all eight devices, two replicas of four tensor-parallel ranks.
    const plan = Object.fromEntries(runSpec(s).graph.calls.map((c) => [c.name, { mesh: '0:0-7', dp: 2, tp: 4, pp: 1 }]));
    return runSpec(withPlan({ ...s, elastic: { grace_seconds: 30, search_seconds: 2 }, rl: { ...s.rl, iterations: 50 } }, plan));
  };

  it('takes a device back where what it saves over the iterations left is more than moving onto it costs, and leaves it idle where not', () => {
    const lost = decideReplan(cluster(), [], { devices: [7], trigger: 'chaos', reason: 'gone' }, 0);
    for (const p of Object.values(lost.spec.plan)) expect(p.devices).not.toContain(7);
    // Device 6's worker is idle after the loss (the plan on 7 devices leaves it out): a spare.
    const idle = [0, 1, 2, 3, 4, 5, 6].filter((d) => !Object.values(lost.spec.plan).some((p) => p.devices.includes(d)));
    const back = decideReplan(lost.spec, idle, { devices: [], joined: [7], trigger: 'join', reason: 'a worker joined' }, 1);
    expect(back.changed).toBe(true);
    expect(back.record).toMatchObject({ trigger: 'join', lost: [], joined: [7], changed: true });
    expect(back.record.gain_seconds).toBeGreaterThan(back.record.estimated_migration_seconds);
    expect(back.record.why).toMatch(/^device\(s\) 6-7 joined and are used: they save [\d.]+ s over 49 iterations, more than the migration.s/);
    expect(back.spec.plan).not.toEqual(lost.spec.plan);
    // With no iteration left to use them in, the devices do not pay for any move.
    const late = decideReplan(lost.spec, idle, { devices: [], joined: [7], trigger: 'join', reason: 'a worker joined' }, 50);
    expect(late.changed).toBe(false);
    expect(late.spec).toBe(lost.spec);
    expect(late.record.why).toMatch(/device\(s\) 6-7 joined and are left idle/);
  });
});

describe('decideOffThread', () => {
  it('decides in a worker thread what decideReplan decides, and its refusals keep their names', async () => {
    const r = spec();
    const loss = { devices: [3], trigger: 'chaos' as const, reason: 'gone' };
    const here = decideReplan(r, [], loss, 3);
    const there = await decideOffThread(r, [], loss, 3);
    expect(there.changed).toBe(true);
    expect(there.record.plan_after).toEqual(here.record.plan_after);
    expect(there.record.plans_evaluated).toBe(here.record.plans_evaluated);
    expect(there.spec.plan).toEqual(here.spec.plan);
    expect(there.spec.rewardService).toBe(r.rewardService);
    await expect(decideOffThread(r, [], { ...loss, devices: [9] }, 3)).rejects.toMatchObject({ name: 'ReplanError', message: 'device 9: the cluster has devices 0-3' });
  });
});
