// The planner on in-flight weight updates (rl.inflight): a generation's switch of version priced
// into its call (the bus's crossings; under recompute a pass of every held row again), plans the
// runtime refuses in flight refused here too, a free-running scenario priced free-running at every
// η, a named placement priced at the scenario's own η, and the smallest of equally fast lags chosen.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { loadScenario, type Scenario } from '../scenario/scenario.ts';
import { DEVICES, MODELS } from './catalog.ts';
import { SWITCH_CROSSINGS, callCost, type Workload } from './cost.ts';
import { INFLIGHT_MAX_COST, inflightChoice } from './inflight.ts';
import { LAG_TIE, asynchronyOf, chooseLag, lagsFor } from './lag.ts';
import { planYaml } from './plan-file.ts';
import { Evaluator, namedPlan } from './planner.ts';
import { DEFAULT_LOCAL_PROFILE, atLag, candidateOf, loadLocalProfile, problemOf } from './problem.ts';

const H100 = DEVICES['h100-80gb']!;
const Q7 = MODELS['qwen2.5-7b']!;
const INFLIGHT = fileURLToPath(new URL('../../../scenarios/inflight.yaml', import.meta.url));
const LONGTAIL_FILE = fileURLToPath(new URL('../../../scenarios/cluster/grpo-qwen7b-64gpu-longtail.yaml', import.meta.url));
const local = loadLocalProfile(DEFAULT_LOCAL_PROFILE);

/** A long-tail generation decoding continuously, as scenarios/cluster/grpo-qwen7b-64gpu-longtail.yaml's. */
const LONGTAIL: Workload = { batch: 64, promptLen: 1024, responseLen: 16384, responseMean: 4096, epochs: 1, minibatches: 4, slots: 64 };
const layout = { devices: [0, 1], dp: 1, tp: 2, pp: 1 };

describe('the switch of version, priced', () => {
  const none = callCost(Q7, 'generate', layout, LONGTAIL, H100, 8);
  const keep = callCost(Q7, 'generate', layout, { ...LONGTAIL, inflight: 'keep' }, H100, 8);
  const recompute = callCost(Q7, 'generate', layout, { ...LONGTAIL, inflight: 'recompute' }, H100, 8);

  it('keep: the bus crossed SWITCH_CROSSINGS times, added to the generation and said apart', () => {
    expect(none.switchSeconds).toBeUndefined();
    expect(keep.switchSeconds).toBeCloseTo(SWITCH_CROSSINGS * H100.latency, 12);
    expect(keep.seconds - none.seconds).toBeCloseTo(keep.switchSeconds!, 9);
    expect(keep.latency - none.latency).toBeCloseTo(SWITCH_CROSSINGS * H100.latency, 12);
  });

  it('recompute: a forward pass of every held row as well, far more than keep at 7B', () => {
    expect(recompute.switchSeconds!).toBeGreaterThan(100 * keep.switchSeconds!);
    expect(recompute.seconds - none.seconds).toBeCloseTo(recompute.switchSeconds!, 9);
  });
});

describe('a free-running in-flight scenario, planned', () => {
  const s = loadScenario(INFLIGHT);

  it('stays free-running (and in flight) at every η, and lock-step at 0 switches nothing', () => {
    expect(atLag(s, 2).rl).toMatchObject({ staleness: 2, lag: 0, inflight: true });
    expect(atLag(s, 0).rl).toMatchObject({ staleness: 0, lag: 0, inflight: false });
    expect(problemOf(s, local, 2).workload.inflight).toBe('keep');
    expect(problemOf(s, local, 0).workload.inflight).toBeUndefined();
    expect(asynchronyOf(s, 1)).toBe('rl.staleness 1, in flight (rl.inflight_kv keep)');
    expect(asynchronyOf({ ...s, rl: { ...s.rl, staleness: 0, inflight: false, lag: 1 } }, 1)).toBe('rl.lag 1');
  });

  it('refuses, as the runtime does, a generation on the layout its model trains on or over several stages', () => {
    const ev = new Evaluator(problemOf(s, local));
    const own = namedPlan(ev, 'flattening');
    const e = ev.evaluate(own);
    expect(e.feasible).toBe(false);
    expect(e.why).toMatch(/actor\.generate: in flight \(rl\.inflight\), a generation needs devices or a layout of its own/);
    // The same plan lock-step is fine.
    expect(new Evaluator(problemOf(s, local, 0)).evaluate(own).feasible).toBe(true);
    // The scenario's own plan (generation on a device of its own) prices the switch.
    const mine = ev.evaluate(candidateOf(s), true);
    expect(mine.feasible).toBe(true);
    expect(mine.calls['actor.generate']!.switchSeconds).toBeCloseTo(SWITCH_CROSSINGS * local.latency, 12);
  });

  it('a named placement is priced at the scenario own η, against the same placement lock-step', () => {
    const c = chooseLag(s, [1], { local, placement: 'separation', search: { evaluations: 1, seed: 1 } });
    expect(c.chosen.lag).toBe(1);
    expect(c.sync.lag).toBe(0);
    expect(c.speedup).toBeCloseTo(c.sync.evaluation.iterationSeconds / c.chosen.evaluation.iterationSeconds, 12);
    expect(c.why).toMatch(/^the scenario's own rl\.staleness 1, in flight \(rl\.inflight_kv keep\), at which a named placement is priced: \d+\.\d\d× the same placement lock-step$/);
  });

  it('of lags as fast as each other (within LAG_TIE), chooses the smallest: its rollouts are fresher for nothing', () => {
    const recompute: Scenario = { ...s, rl: { ...s.rl, inflight_kv: 'recompute' } };
    const c = chooseLag(recompute, lagsFor(recompute, 2), { local, search: { evaluations: 3000, seed: 1 } });
    const stale = c.tried.filter((t) => t.lag > 0 && t.evaluation.feasible);
    const best = Math.min(...stale.map((t) => t.evaluation.iterationSeconds));
    // Here η 2 is as fast as η 1 (the train pool is the bottleneck), to a hair: faster by a rounding.
    expect(stale.map((t) => t.lag)).toEqual([1, 2]);
    expect(stale.every((t) => t.evaluation.iterationSeconds <= best * (1 + LAG_TIE))).toBe(true);
    expect(c.chosen.lag).toBe(1);
    expect(c.why).toMatch(/^η 1, free-running in flight(, generating continuously \(rl\.slots \d+\))? is \d+\.\d\d× the best lock-step plan/);
  });
});

describe('the planner chooses in flight for a free-running run where it costs at most INFLIGHT_MAX_COST', () => {
  const dir = mkdtempSync(join(tmpdir(), 'ferry-plan-inflight-'));
  /** The long-tail 7B scenario free-running within η 1 (64 slots), generation on nodes 0-3 and training on 4-7, or `plan`. */
  const longtail = (
    plan = ['  actor.generate: { mesh: "0-3:*", dp: 16, tp: 2 }', '  actor.train: { mesh: "4-7:*", dp: 8, tp: 2, pp: 2 }', '  reference.inference: { mesh: "4-7:*", dp: 16, tp: 2 }'],
  ) => {
    const file = join(dir, `longtail-${plan.length}.yaml`);
    const text = readFileSync(LONGTAIL_FILE, 'utf8').replace('rl: { batch: 64, epochs: 1, minibatches: 4 }', 'rl: { batch: 64, epochs: 1, minibatches: 4, staleness: 1, slots: 64, iterations: 100 }');
    writeFileSync(file, `${text}${plan.length ? `plan:\n${plan.join('\n')}\n` : ''}`);
    const s = loadScenario(file);
    const evaluation = new Evaluator(problemOf(s)).evaluate(candidateOf(s), true);
    return { s, chosen: { lag: 1, plan: candidateOf(s), evaluation } };
  };

  it('at 7B on H100, keep: a switch of 0.04 ms, chosen; its period is the plan’s and the switch', () => {
    const { s, chosen } = longtail();
    const c = inflightChoice(s, chosen)!;
    expect(c.chosen).toBe(true);
    expect(c.switchSeconds).toBeCloseTo(SWITCH_CROSSINGS * H100.latency, 12);
    expect(c.seconds).toBeGreaterThanOrEqual(chosen.evaluation.iterationSeconds);
    expect(c.seconds).toBeLessThanOrEqual(chosen.evaluation.iterationSeconds * (1 + INFLIGHT_MAX_COST));
    expect(c.why).toMatch(/^in flight \(rl\.inflight, keep\) costs 0\.00% of the period \(a generation's switch 0\.0400 ms\)/);
  });

  it('where the training device bounds the period, the switch hides in the rollout’s slack: chosen at no cost', () => {
    const s = loadScenario(INFLIGHT);
    const free = { ...s, rl: { ...s.rl, inflight: false } };
    const evaluation = new Evaluator(problemOf(free, local)).evaluate(candidateOf(free), true);
    const c = inflightChoice(free, { lag: 1, plan: candidateOf(free), evaluation }, local)!;
    expect(c.switchSeconds).toBeCloseTo(SWITCH_CROSSINGS * local.latency, 12);
    expect(c.chosen).toBe(true);
    expect(c.seconds).toBe(evaluation.iterationSeconds);
  });

  it('where it would lengthen the period by more than INFLIGHT_MAX_COST, not chosen, and says what it would cost', () => {
    const s = loadScenario(INFLIGHT);
    const free = { ...s, rl: { ...s.rl, inflight: false } };
    const evaluation = new Evaluator(problemOf(free, local)).evaluate(candidateOf(free), true);
    // The same plan, as if it were 5% faster without in flight than with it.
    const faster = { ...evaluation, iterationSeconds: evaluation.iterationSeconds / 1.05 };
    const c = inflightChoice(free, { lag: 1, plan: candidateOf(free), evaluation: faster }, local)!;
    expect(c.chosen).toBe(false);
    expect(c.why).toMatch(/^in flight \(rl\.inflight, keep\) would cost [45]\.\d\d% of the period \(a generation's switch 2\.35 ms\), more than the 1% it is worth$/);
  });

  it('a plan whose generation is on its training layout does not fit in flight, and says why; lagged, in flight already or lock-step: no choice to make', () => {
    const { s, chosen } = longtail([]);
    const c = inflightChoice(s, chosen)!;
    expect(c.chosen).toBe(false);
    expect(c.why).toMatch(/^in flight does not fit this plan: actor\.generate: in flight \(rl\.inflight\), a generation needs devices or a layout of its own/);
    expect(inflightChoice({ ...s, rl: { ...s.rl, staleness: 0, lag: 1 } }, chosen)).toBeUndefined();
    expect(inflightChoice({ ...s, rl: { ...s.rl, inflight: true } }, chosen)).toBeUndefined();
    expect(inflightChoice(s, { ...chosen, lag: 0 })).toBeUndefined();
  });

  it('a scenario in flight without a plan is refused to run (its default plan generates on the training layout), but read for a search, which finds one', () => {
    const file = join(dir, 'longtail-inflight.yaml');
    writeFileSync(
      file,
      readFileSync(LONGTAIL_FILE, 'utf8').replace(
        'rl: { batch: 64, epochs: 1, minibatches: 4 }',
        'rl: { batch: 64, epochs: 1, minibatches: 4, staleness: 1, inflight: true, slots: 64, iterations: 100 }',
      ),
    );
    expect(() => loadScenario(file)).toThrow(/rl\.inflight, and plan\.actor\.generate is the layout 'actor' trains on/);
    const s = loadScenario(file, undefined, { searching: true });
    // Not what the search relaxes: in flight without a free-running run is refused all the same.
    writeFileSync(file, readFileSync(LONGTAIL_FILE, 'utf8').replace('rl: { batch: 64, epochs: 1, minibatches: 4 }', 'rl: { batch: 64, epochs: 1, minibatches: 4, inflight: true, iterations: 100 }'));
    expect(() => loadScenario(file, undefined, { searching: true })).toThrow(/rl\.inflight: new versions are taken in flight by a free-running run; set rl\.staleness/);
    // The search at η 1 finds a plan in flight: feasible, its generation off the training layout, the switch priced.
    const at1 = chooseLag(s, [0, 1], { search: { evaluations: 2000, seed: 1 } }).tried.find((t) => t.lag === 1)!;
    expect(at1.evaluation.feasible).toBe(true);
    const [gen, train] = [at1.plan['actor.generate']!, at1.plan['actor.train']!];
    expect(`${gen.mesh}/${gen.dp}/${gen.tp}/${gen.pp}`).not.toBe(`${train.mesh}/${train.dp}/${train.tp}/${train.pp}`);
    expect(at1.evaluation.calls['actor.generate']!.switchSeconds).toBeCloseTo(SWITCH_CROSSINGS * H100.latency, 12);
  });

  it('the plan file npm run plan --write writes with it runs the scenario in flight', () => {
    const file = join(dir, 'plan.yaml');
    writeFileSync(file, planYaml(candidateOf(loadScenario(INFLIGHT)), 1, 2, 'keep'));
    expect(readFileSync(file, 'utf8')).toMatch(/^lag: 1\nslots: 2\ninflight: keep\n$/m);
    const free = join(dir, 'free.yaml');
    writeFileSync(free, readFileSync(INFLIGHT, 'utf8').replace('  inflight: true\n  inflight_kv: keep\n', ''));
    expect(loadScenario(free).rl.inflight).toBe(false);
    const planned = loadScenario(free, file);
    expect(planned.rl).toMatchObject({ staleness: 1, slots: 2, inflight: true, inflight_kv: 'keep' });
    // A search that kept lock-step says lag 0: read back, even a scenario in flight runs lock-step.
    writeFileSync(file, planYaml(candidateOf(atLag(loadScenario(INFLIGHT), 0)), 0));
    expect(loadScenario(INFLIGHT, file).rl).toMatchObject({ lag: 0, staleness: 0, inflight: false });
    // What a plan file's inflight may be, named where it is wrong.
    writeFileSync(file, planYaml(candidateOf(loadScenario(INFLIGHT)), 1).concat('inflight: false\n'));
    expect(() => loadScenario(free, file)).toThrow(/plan\.yaml: inflight: expected keep or recompute \(what a generation in flight does with the old version's keys and values\), got boolean false/);
    rmSync(dir, { recursive: true, force: true });
  });
});
