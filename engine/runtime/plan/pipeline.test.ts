// The simulator's pipeline under a lag, on hand-built tasks whose schedules can be worked out on
// paper, and the planner's choice of a lag: only where it pays.
import { describe, expect, it } from 'vitest';
import { grpo } from '../../algorithms/grpo.ts';
import { staleGraph } from '../../asynchrony/index.ts';
import type { CallName } from '../scenario/scenario.ts';
import { loadScenario } from '../scenario/scenario.ts';
import { flowOf, simulate, type TaskSpec } from './simulate.ts';
import { ASYNC_MIN_SPEEDUP, chooseLag, lagsFor, poolsOf } from './lag.ts';
import { loadLocalProfile, DEFAULT_LOCAL_PROFILE, problemOf } from './problem.ts';
import { Evaluator, namedPlan } from './planner.ts';
import { smallScenarioText } from './pipeline.fixture.ts';
import { join } from 'node:path';
import { ROOT } from '../../../test/helpers.ts';

const RL = { iterations: 8, batch: 1, epochs: 1, minibatches: 1, clip: 0.2, kl_coef: 0, temperature: 1, lr: 1e-3, clip_norm: 1 };
const fresh = grpo.graph(grpo.options.parse({}), RL);
const stale = staleGraph(fresh);

/** GRPO's calls, each on `devices` for `seconds`; the generation after a move of `sync` seconds. */
function tasks(calls: readonly CallName[], spec: Record<string, { devices: number[]; seconds: number; sync?: number }>): Record<CallName, TaskSpec> {
  return Object.fromEntries(
    calls.map((call) => {
      const s = spec[call]!;
      const segments: TaskSpec['segments'] = [];
      if (s.sync) segments.push({ kind: 'realloc', devices: [0, 1], seconds: s.sync });
      segments.push({ kind: 'compute', devices: s.devices, seconds: s.seconds });
      return [call, { call, segments }];
    }),
  );
}

describe('the pipeline under a lag', () => {
  // Generation 3 s on device 0 after a 0.5 s move of the weights; scoring 0.25 s each beside it;
  // the proximal pass 0.5 s and training 3 s on device 1.
  const split = {
    'actor.generate': { devices: [0], seconds: 3, sync: 0.5 },
    'reference.inference': { devices: [0], seconds: 0.25 },
    'reward.inference': { devices: [0], seconds: 0.25 },
    'actor.prox': { devices: [1], seconds: 0.5 },
    'actor.train': { devices: [1], seconds: 3 },
  };

  it('lock-step, an iteration is the sum of its chain: move, generate, score, train', () => {
    const flow = flowOf(fresh);
    const { 'actor.prox': _p, ...rest } = split;
    expect(simulate(tasks(flow.order, rest), flow).iterationSeconds).toBeCloseTo(0.5 + 3 + 0.25 + 0.25 + 3, 9);
  });

  it('one-step-off on two pools, the period is about max(generate + sync + scoring, prox + train), not their sum', () => {
    const flow = flowOf(stale, 1);
    expect(flow.ahead).toEqual(['actor.generate', 'reference.inference', 'reward.inference']);
    const sim = simulate(tasks(flow.order, split), flow);
    expect(sim.iterationSeconds).toBeCloseTo(Math.max(0.5 + 3 + 0.25 + 0.25, 0.5 + 3), 9);
    // Iteration i's generation waits for the weights of i − 2's training, and starts before i − 1's ends.
    const at = (call: string, it: number) => sim.timeline.filter((e) => e.call === call && e.iteration === it && e.kind === 'compute')[0]!;
    expect(at('actor.generate', 3).start).toBeGreaterThanOrEqual(at('actor.train', 1).end - 1e-9);
    expect(at('actor.generate', 3).start).toBeLessThan(at('actor.train', 2).end);
  });

  it('on devices the rollout and the training share, a lag overlaps nothing: no faster than lock-step', () => {
    const shared = Object.fromEntries(Object.entries(split).map(([c, s]) => [c, { ...s, devices: [0, 1] }]));
    const lagged = simulate(tasks(flowOf(stale, 1).order, shared), flowOf(stale, 1)).iterationSeconds;
    const { 'actor.prox': _p, ...rest } = shared;
    const lockStep = simulate(tasks(flowOf(fresh).order, rest), flowOf(fresh)).iterationSeconds;
    expect(lagged).toBeGreaterThanOrEqual(lockStep);
  });

  it('a longer lag hides a generation that takes longer than training, up to the train pool', () => {
    const slow = { ...split, 'actor.generate': { devices: [0], seconds: 6, sync: 0.5 } };
    const one = simulate(tasks(flowOf(stale, 1).order, slow), flowOf(stale, 1)).iterationSeconds;
    // The rollout pool is the bottleneck: 0.5 + 6 + 0.5 per iteration, whatever the lag.
    expect(one).toBeCloseTo(7, 9);
    expect(simulate(tasks(flowOf(stale, 2).order, slow), flowOf(stale, 2)).iterationSeconds).toBeCloseTo(7, 9);
  });
});

describe('the choice of a lag', () => {
  const local = loadLocalProfile(DEFAULT_LOCAL_PROFILE);

  it('chooses one-step-off where a reward actor on the bus is slow, and says so', () => {
    const s = loadScenario(smallScenarioText('slow-actor', 0.1));
    expect(lagsFor(s, 2)).toEqual([0, 1, 2]);
    const c = chooseLag(s, [0, 1], { local, search: { evaluations: 2000, seed: 1 } });
    expect(c.chosen.lag).toBe(1);
    expect(c.speedup).toBeGreaterThanOrEqual(ASYNC_MIN_SPEEDUP);
    expect(c.speedup).toBeCloseTo(c.sync.evaluation.iterationSeconds / c.chosen.evaluation.iterationSeconds, 12);
    expect(c.why).toMatch(/lag 1 is \d\.\d\d× the best lock-step plan/);
    expect(poolsOf(c.chosen.problem, c.chosen.plan).rollout.length).toBeGreaterThan(0);
  });

  it('keeps lock-step where asynchrony does not pay (nothing off the devices to overlap)', () => {
    const s = loadScenario(smallScenarioText('no-actor', 0));
    const c = chooseLag(s, [0, 1], { local, search: { evaluations: 2000, seed: 1 } });
    expect(c.chosen.lag).toBe(0);
    expect(c.speedup).toBe(1);
    expect(c.why).toMatch(/lock-step kept: the best lag \(1\) would be \d\.\d\d×, less than the 1\.1×/);
  });

  it('prices continuous generation where rows wait for slots (a long tail, more sequences than the KV caches hold): chosen where faster, at lock-step too', () => {
    // grpo-qwen7b-64gpu-longtail with 4 times the prompts: 4,096 sequences of up to 16,384 tokens.
    const longtail = loadScenario(join(ROOT, 'scenarios/cluster/grpo-qwen7b-64gpu-longtail.yaml'));
    const s = { ...longtail, rl: { ...longtail.rl, batch: 256 } };
    const c = chooseLag(s, [0, 1], { search: { evaluations: 600, seed: 1 } });
    // Lock-step by waves (today's run, the baseline), then every lag generating continuously.
    expect(c.tried.map((t) => [t.lag, t.slots !== undefined])).toEqual([
      [0, false],
      [0, true],
      [1, true],
    ]);
    expect(c.sync).toBe(c.tried[0]);
    const continuous = c.tried[1]!;
    expect(continuous.evaluation.iterationSeconds).toBeLessThan(c.sync.evaluation.iterationSeconds);
    expect(c.chosen.slots).toBeGreaterThan(0);
    expect(c.speedup).toBeCloseTo(c.sync.evaluation.iterationSeconds / c.chosen.evaluation.iterationSeconds, 12);
    expect(c.why).toMatch(/generating continuously \(rl\.slots \d+\)/);
    // Its slots are what the plan's generations hold at once.
    const gen = Object.values(c.chosen.evaluation.calls).find((x) => x.slots !== undefined)!;
    expect(c.chosen.slots).toBe(gen.slots);
    // Responses that all run to the budget: nothing to price; lock-step by waves and the lags only.
    const flat = { ...s, lengths: { ...s.lengths, response_mean: undefined } };
    expect(chooseLag(flat, [0, 1], { search: { evaluations: 300, seed: 1 } }).tried.every((t) => t.slots === undefined)).toBe(true);
  });

  it("under a lag, counts the next version's copy of a generation's view on its devices, and moves it on the senders alone", () => {
    const s = loadScenario(smallScenarioText('copies', 0.1));
    const at = (lag: number) => {
      const ev = new Evaluator(problemOf(s, local, lag));
      return ev.evaluate(namedPlan(ev, 'separation'), true);
    };
    const [sync, lagged] = [at(0), at(1)];
    expect(lagged.calls['actor.generate'].placement.devices).not.toEqual(lagged.calls['actor.train'].placement.devices);
    // The generation's own cost counts one copy; the next version's is one more there, and both
    // are resident beside the calls that share its devices.
    const one = lagged.calls['actor.generate'].memoryBytes - sync.calls['actor.generate'].memoryBytes;
    expect(one).toBeGreaterThan(0);
    expect(lagged.calls['reference.inference'].memoryBytes - sync.calls['reference.inference'].memoryBytes).toBe(2 * one);
    const movers = (e: typeof sync) => [...new Set(e.simulation!.timeline.filter((t) => t.call === 'actor.generate' && t.kind === 'realloc').map((t) => t.device))].sort();
    expect(movers(sync)).toEqual([0, 1]);
    expect(movers(lagged)).toEqual(sync.calls['actor.train'].placement.devices);
  });

  it('offers no lag to an algorithm of pairs, nor one as long as the run', () => {
    expect(lagsFor(loadScenario(smallScenarioText('pairs', 0, 'dpo')), 2)).toEqual([0]);
    expect(lagsFor(loadScenario(smallScenarioText('short', 0, 'grpo', 2)), 3)).toEqual([0, 1]);
  });
});
