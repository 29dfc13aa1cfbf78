import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { parseMesh } from '../../../mesh/parallel/cluster.ts';
import { loadScenario } from '../scenario/scenario.ts';
import { Evaluator, namedPlan } from './planner.ts';
import { problemOf } from './problem.ts';
import { ReplanError, deviceRuns, replan } from './replan.ts';
import { search } from './search.ts';

const file = (name: string) => fileURLToPath(new URL(`../../../scenarios/cluster/${name}`, import.meta.url));

/** A cluster scenario as a problem, and the plan a search gives it on every device. */
function planned(name: string) {
  const problem = problemOf(loadScenario(file(name)));
  const ev = new Evaluator(problem);
  const starts = (['flattening', 'interleaving', 'separation'] as const).map((n) => namedPlan(ev, n));
  const plan = search(ev, starts, { evaluations: 400, seed: 1 }).best[0]!.plan;
  return { problem, plan };
}

describe('re-planning after a device is lost', () => {
  it('writes devices as runs', () => {
    expect(deviceRuns([8, 7, 0, 1, 2, 5])).toBe('0-2, 5, 7-8');
    expect(deviceRuns([3])).toBe('3');
    expect(deviceRuns([])).toBe('');
  });

  const { problem, plan } = planned('grpo-llama7b-8gpu.yaml');
  const used = [...new Set(Object.values(plan).flatMap((p) => p.devices))];

  it('finds a plan on the devices left, no slower per iteration than the plan with all of them, and prices the move', () => {
    const lost = used.at(-1)!;
    const r = replan(problem, plan, { lost: [lost] }, { remaining: 20, search: { evaluations: 400, seed: 1 } });
    expect(r.devices).not.toContain(lost);
    for (const p of Object.values(r.plan)) {
      expect(p.devices).not.toContain(lost);
      expect(parseMesh(p.mesh, { ...problem.cluster, lost: r.lost }).devices).toEqual(p.devices);
    }
    expect(r.evaluation.feasible).toBe(true);
    // Fewer devices: an iteration takes at least as long (the search may find the same period).
    expect(r.period.after).toBeGreaterThanOrEqual(r.period.before * 0.999);
    expect(r.objective).toBeCloseTo(r.migration.seconds + 20 * r.period.after, 6);
    // The bytes survivors send are the minimum; a model moves only where its layout changed.
    expect(r.migration.bytes).toBe(r.migration.minimumBytes);
    for (const m of r.migration.models) {
      if (JSON.stringify(m.from) === JSON.stringify(m.to)) expect(m.bytes).toBe(0);
      expect(m.to.devices).not.toContain(lost);
    }
    expect(r.search.evaluated).toBeGreaterThan(0);
  });

  it('the same problem, loss and budget give the same plan', () => {
    const a = replan(problem, plan, { lost: [3] }, { remaining: 10, search: { evaluations: 300, seed: 7 } });
    const b = replan(problem, plan, { lost: [3] }, { remaining: 10, search: { evaluations: 300, seed: 7 } });
    expect(b.plan).toEqual(a.plan);
    expect(b.objective).toBe(a.objective);
  });

  it('reads from the snapshot what only the lost device held, and nothing a survivor holds', () => {
    // Every model on one tp = 8 mesh: each device holds a shard nobody else has.
    const ev = new Evaluator(problem);
    const tp8 = Object.fromEntries(Object.entries(plan).map(([call]) => [call, { mesh: '0:0-7', devices: [0, 1, 2, 3, 4, 5, 6, 7], dp: 1, tp: 8, pp: 1 }]));
    if (!ev.evaluate(tp8).feasible) return;
    const r = replan(problem, tp8, { lost: [5] }, { remaining: 5, search: { evaluations: 300, seed: 1 } });
    expect(r.migration.snapshotBytes).toBeGreaterThan(0);
  });

  it('refuses a device the cluster does not have, and a loss of every device, naming them', () => {
    expect(() => replan(problem, plan, { lost: [8] }, { remaining: 1, search: { evaluations: 50 } })).toThrow(new ReplanError('device 8: the cluster has devices 0-7'));
    expect(() => replan(problem, plan, { lost: [0, 1, 2, 3, 4, 5, 6, 7] }, { remaining: 1, search: { evaluations: 50 } })).toThrow("no device is left: the cluster's devices 0-7 are all lost");
  });

  it('fails, naming what does not fit, when the devices left cannot hold the models', () => {
    const big = planned('llama70b-64gpu-h100.yaml');
    const lost = Array.from({ length: 63 }, (_, i) => i + 1);
    expect(() => replan(big.problem, big.plan, { lost }, { remaining: 1, search: { evaluations: 50 } })).toThrow(
      /^no plan fits the 1 device\(s\) left \(0\) after losing 1-63: actor\.\w+ needs [\d.]+ GB on a device of 80 GB/,
    );
  });

  it('a device that comes back is used only where what it saves over the remaining iterations is more than its migration', () => {
    const lost = replan(problem, plan, { lost: [7] }, { remaining: 50, search: { evaluations: 400, seed: 1 } });
    const without = { ...problem, cluster: { ...problem.cluster, lost: lost.lost } };
    // Many iterations left: worth moving back onto all eight devices.
    const back = replan(without, lost.plan, { joined: [7] }, { remaining: 50, search: { evaluations: 400, seed: 1 } });
    expect(back.lost).toEqual([]);
    expect(back.changed).toBe(true);
    expect(back.period.after).toBeLessThan(back.period.before);
    expect(back.gainSeconds).toBeGreaterThan(back.migration.seconds);
    expect(back.why).toMatch(/^device\(s\) 7 joined and are used: they save [\d.]+ s over 50 iterations, more than the migration's [\d.]+ s$/);
    // No iterations left: nothing to gain, so the plan stays and nothing moves.
    const late = replan(without, lost.plan, { joined: [7] }, { remaining: 0, search: { evaluations: 400, seed: 1 } });
    expect(late.changed).toBe(false);
    expect(late.plan).toEqual(lost.plan);
    expect(late.migration.bytes).toBe(0);
    expect(late.why).toMatch(/joined and are left idle/);
  });

  it('refuses a join for a device the run has, and a device both lost and joined', () => {
    expect(() => replan(problem, plan, { joined: [2] }, { remaining: 1, search: { evaluations: 50 } })).toThrow('device 2 joined, but the run has not lost it');
    const without = { ...problem, cluster: { ...problem.cluster, lost: [7] } };
    expect(() => replan(without, plan, { lost: [7] }, { remaining: 1, search: { evaluations: 50 } })).toThrow('device 7 is lost already');
    expect(() => replan(without, plan, { lost: [7], joined: [7] }, { remaining: 1, search: { evaluations: 50 } })).toThrow('device 7 is both lost and joined');
  });
});
