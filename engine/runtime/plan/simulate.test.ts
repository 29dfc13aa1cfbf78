// The simulator on hand-built task sets whose schedules can be worked out on paper.
import { describe, expect, it } from 'vitest';
import { ppo } from '../../algorithms/ppo.ts';
import type { CallName } from '../scenario/scenario.ts';
import { flowOf, simulate as simulateFlow, type Segment, type Simulation, type TaskSpec } from './simulate.ts';

// PPO's graph: six calls, the train calls of one iteration before the next iteration's calls.
const FLOW = flowOf(ppo.graph(ppo.options.parse({}), { iterations: 1, batch: 1, epochs: 1, minibatches: 1, clip: 0.2, kl_coef: 0, temperature: 1, lr: 1e-3, clip_norm: 1 }));
const CALLS = FLOW.order;
const simulate = (tasks: Record<CallName, TaskSpec>, options?: Parameters<typeof simulateFlow>[2]) => simulateFlow(tasks, FLOW, options);

type Spec = Record<CallName, { devices: number[]; seconds: number; computing?: number; share?: number; realloc?: { devices: number[]; seconds: number } }>;

function tasks(spec: Spec): Record<CallName, TaskSpec> {
  return Object.fromEntries(
    CALLS.map((call) => {
      const s = spec[call];
      const segments: Segment[] = [];
      if (s.realloc) segments.push({ kind: 'realloc', ...s.realloc });
      segments.push({
        kind: 'compute',
        devices: s.devices,
        seconds: s.seconds,
        ...(s.computing !== undefined ? { computing: s.computing } : {}),
        ...(s.share !== undefined ? { share: s.share } : {}),
      });
      return [call, { call, segments }];
    }),
  ) as Record<CallName, TaskSpec>;
}

/** Every call on its own devices or all on one: `where(call)` gives the devices, all take `seconds`. */
function uniform(where: (call: CallName, i: number) => number[], seconds = 1): Spec {
  return Object.fromEntries(CALLS.map((call, i) => [call, { devices: where(call, i), seconds }])) as Spec;
}

/** When a task (all its segments) started and ended. */
function span(sim: Simulation, call: CallName, iteration: number, kind?: Segment['kind']) {
  const entries = sim.timeline.filter((e) => e.call === call && e.iteration === iteration && (kind === undefined || e.kind === kind));
  expect(entries.length).toBeGreaterThan(0);
  return { start: Math.min(...entries.map((e) => e.start)), end: Math.max(...entries.map((e) => e.end)) };
}

const INFERENCES: CallName[] = ['reference.inference', 'reward.inference', 'critic.inference'];
const TRAINS: CallName[] = ['actor.train', 'critic.train'];

function checkDependencies(sim: Simulation, iterations: number) {
  const eps = 1e-9;
  for (let it = 0; it < iterations; it++) {
    const gen = span(sim, 'actor.generate', it);
    for (const inf of INFERENCES) expect(span(sim, inf, it).start).toBeGreaterThanOrEqual(gen.end - eps);
    for (const train of TRAINS) {
      expect(span(sim, train, it).start).toBeGreaterThanOrEqual(gen.end - eps);
      for (const inf of INFERENCES) expect(span(sim, train, it).start).toBeGreaterThanOrEqual(span(sim, inf, it).end - eps);
    }
    if (it > 0) {
      // The supervisor starts an iteration when both train calls of the last have ended.
      const trained = Math.max(span(sim, 'actor.train', it - 1).end, span(sim, 'critic.train', it - 1).end);
      for (const call of ['actor.generate', ...INFERENCES, ...TRAINS] as const) expect(span(sim, call, it).start).toBeGreaterThanOrEqual(trained - eps);
    }
  }
}

/** No device runs two segments at once. */
function checkExclusive(sim: Simulation) {
  const byDevice = new Map<number, Array<{ start: number; end: number }>>();
  for (const e of sim.timeline) (byDevice.get(e.device) ?? byDevice.set(e.device, []).get(e.device)!).push(e);
  for (const entries of byDevice.values()) {
    entries.sort((a, b) => a.start - b.start);
    for (let i = 1; i < entries.length; i++) expect(entries[i]!.start).toBeGreaterThanOrEqual(entries[i - 1]!.end - 1e-9);
  }
}

describe('simulate', () => {
  it('runs every call one after another when all share one device: 6 s per iteration', () => {
    const sim = simulate(tasks(uniform(() => [0])), { iterations: 4 });
    expect(sim.iterationSeconds).toBeCloseTo(6, 9);
    expect(sim.makespan).toBeCloseTo(24, 9);
    checkDependencies(sim, 4);
    checkExclusive(sim);
    // Iteration 0 in call order, back to back; iteration 1 starts when iteration 0 is done.
    CALLS.forEach((call, i) => {
      expect(span(sim, call, 0)).toEqual({ start: i, end: i + 1 });
      expect(span(sim, call, 1).start).toBeCloseTo(6 + i, 9);
    });
    expect(sim.timeline).toHaveLength(6 * 4);
  });

  it('overlaps independent calls on disjoint devices: generate, inferences, trains = 3 s per iteration', () => {
    const sim = simulate(tasks(uniform((_, i) => [i])), { iterations: 4 });
    expect(sim.iterationSeconds).toBeCloseTo(3, 9);
    checkDependencies(sim, 4);
    checkExclusive(sim);
    expect(span(sim, 'actor.generate', 0)).toEqual({ start: 0, end: 1 });
    // The three inferences run together, then both trains together.
    for (const inf of INFERENCES) expect(span(sim, inf, 0)).toEqual({ start: 1, end: 2 });
    for (const train of TRAINS) expect(span(sim, train, 0)).toEqual({ start: 2, end: 3 });
    // The next iteration's generation waits for the actor's training.
    expect(span(sim, 'actor.generate', 1)).toEqual({ start: 3, end: 4 });
  });

  it('starts an iteration only when both train calls of the last have ended, as the supervisor does (7 s, hand-computed)', () => {
    // generate 1 s on device 0; reference and reward 1 s on devices 1, 2; critic inference 1 s and
    // critic train 5 s on device 4; actor train 1 s on device 0.
    //   it 0: gen [0,1], inferences [1,2], actor.train [2,3], critic.train [2,7]
    //   it 1: gen waits for both trains: [7,8], inferences [8,9], trains [9,10] and [9,14]
    //   every iteration takes 7 s → (end of it 3 − end of it 0) / 3 = (28 − 7) / 3 = 7 s.
    const spec: Spec = {
      'actor.generate': { devices: [0], seconds: 1 },
      'reference.inference': { devices: [1], seconds: 1 },
      'reward.inference': { devices: [2], seconds: 1 },
      'critic.inference': { devices: [4], seconds: 1 },
      'actor.train': { devices: [0], seconds: 1 },
      'critic.train': { devices: [4], seconds: 5 },
    };
    const sim = simulate(tasks(spec), { iterations: 4 });
    checkDependencies(sim, 4);
    checkExclusive(sim);
    expect(span(sim, 'critic.train', 0)).toEqual({ start: 2, end: 7 });
    expect(span(sim, 'actor.generate', 1)).toEqual({ start: 7, end: 8 });
    expect(span(sim, 'reference.inference', 1)).toEqual({ start: 8, end: 9 });
    expect(span(sim, 'critic.inference', 1)).toEqual({ start: 8, end: 9 });
    expect(span(sim, 'critic.train', 1)).toEqual({ start: 9, end: 14 });
    expect(span(sim, 'critic.train', 3).end).toBeCloseTo(28, 9);
    expect(sim.iterationSeconds).toBeCloseTo(7, 9);
    expect(sim.makespan).toBeCloseTo(28, 9);
  });

  it('reports the first iteration end when unrolled once', () => {
    const sim = simulate(tasks(uniform((_, i) => [i])), { iterations: 1 });
    expect(sim.iterationSeconds).toBeCloseTo(3, 9);
    expect(sim.timeline).toHaveLength(6);
  });

  it('runs a reallocation before its call, on the union of devices, and the call waits for it', () => {
    const spec = uniform((_, i) => [i]);
    spec['actor.generate'] = { devices: [1], seconds: 1, realloc: { devices: [0, 1], seconds: 0.5 } };
    const sim = simulate(tasks(spec), { iterations: 2 });
    const move = span(sim, 'actor.generate', 0, 'realloc');
    const run = span(sim, 'actor.generate', 0, 'compute');
    expect(move).toEqual({ start: 0, end: 0.5 });
    expect(run).toEqual({ start: 0.5, end: 1.5 });
    const moveDevices = sim.timeline.filter((e) => e.call === 'actor.generate' && e.iteration === 0 && e.kind === 'realloc').map((e) => e.device);
    expect(moveDevices.sort()).toEqual([0, 1]);
    // Each iteration now takes 0.5 + 1 + 1 + 1 s.
    expect(sim.iterationSeconds).toBeCloseTo(3.5, 9);
    checkDependencies(sim, 2);
    checkExclusive(sim);
  });

  it('waits for a busy device even when the inputs are ready', () => {
    // Reference and reward inference share device 1: the second (in call order) follows the first.
    const spec = uniform((_, i) => [i]);
    spec['reward.inference'] = { devices: [1], seconds: 1 };
    const sim = simulate(tasks(spec), { iterations: 2 });
    expect(span(sim, 'reference.inference', 0)).toEqual({ start: 1, end: 2 });
    expect(span(sim, 'reward.inference', 0)).toEqual({ start: 2, end: 3 });
    expect(span(sim, 'actor.train', 0).start).toBeCloseTo(3, 9);
    expect(sim.iterationSeconds).toBeCloseTo(4, 9);
    checkExclusive(sim);
  });

  describe('sharedCores (processor sharing)', () => {
    it('two 1-second tasks on two devices with one core take 2 s together', () => {
      // Reference and reward inference on devices 1 and 2, both ready at t = 1 and alone then
      // (critic inference waits for device 1). One core: each at half speed, both end at t = 3.
      const spec: Spec = {
        'actor.generate': { devices: [0], seconds: 1 },
        'reference.inference': { devices: [1], seconds: 1 },
        'reward.inference': { devices: [2], seconds: 1 },
        'critic.inference': { devices: [1], seconds: 1 },
        'actor.train': { devices: [0], seconds: 1 },
        'critic.train': { devices: [1], seconds: 1 },
      };
      const shared = simulate(tasks(spec), { iterations: 1, sharedCores: 1 });
      expect(span(shared, 'reference.inference', 0)).toEqual({ start: 1, end: 3 });
      expect(span(shared, 'reward.inference', 0).end).toBeCloseTo(3, 9);
      const free = simulate(tasks(spec), { iterations: 1 });
      expect(span(free, 'reference.inference', 0)).toEqual({ start: 1, end: 2 });
      expect(span(free, 'reward.inference', 0)).toEqual({ start: 1, end: 2 });
      const two = simulate(tasks(spec), { iterations: 1, sharedCores: 2 });
      expect(span(two, 'reward.inference', 0)).toEqual({ start: 1, end: 2 });
    });

    it('shares the core among whatever runs, as processor sharing would (hand-computed)', () => {
      // From t = 1 on one core: reference (1 s, device 1) and reward (2 s, device 2) run at half
      // speed; reference ends at 3, having done 1 s. Critic inference (1 s, device 1) then runs
      // beside reward, both at half speed: reward's last second and critic's second both end at 5.
      const spec: Spec = {
        'actor.generate': { devices: [0], seconds: 1 },
        'reference.inference': { devices: [1], seconds: 1 },
        'reward.inference': { devices: [2], seconds: 2 },
        'critic.inference': { devices: [1], seconds: 1 },
        'actor.train': { devices: [0], seconds: 1 },
        'critic.train': { devices: [3], seconds: 1 },
      };
      const sim = simulate(tasks(spec), { iterations: 1, sharedCores: 1 });
      expect(span(sim, 'actor.generate', 0)).toEqual({ start: 0, end: 1 });
      expect(span(sim, 'reference.inference', 0).end).toBeCloseTo(3, 9);
      expect(span(sim, 'critic.inference', 0).start).toBeCloseTo(3, 9);
      expect(span(sim, 'critic.inference', 0).end).toBeCloseTo(5, 9);
      expect(span(sim, 'reward.inference', 0).end).toBeCloseTo(5, 9);
      // Both trains (devices 0 and 3) at half speed: 2 s. One core runs all 7 s of work in 7 s.
      expect(span(sim, 'actor.train', 0).end).toBeCloseTo(7, 9);
      expect(span(sim, 'critic.train', 0).end).toBeCloseTo(7, 9);
      expect(sim.iterationSeconds).toBeCloseTo(7, 9);
    });

    it('on one core the iteration takes all the work; with enough cores, the critical path', () => {
      // All calls 1 s on separate devices: 6 s of work, a critical path of 3 s. With 2 cores: the
      // generation alone (1 s), three inferences at 2/3 speed (1.5 s), two trains at full (1 s).
      const spec = uniform((_, i) => [i]);
      expect(simulate(tasks(spec), { sharedCores: 1 }).iterationSeconds).toBeCloseTo(6, 9);
      expect(simulate(tasks(spec), { sharedCores: 2 }).iterationSeconds).toBeCloseTo(3.5, 9);
      expect(simulate(tasks(spec), { sharedCores: 6 }).iterationSeconds).toBeCloseTo(3, 9);
      expect(simulate(tasks(spec)).iterationSeconds).toBeCloseTo(3, 9);
    });

    it('parallelSlowdown: overlapping calls each run slower by the factor; a call alone does not', () => {
      // All calls 1 s on separate devices, 2 cores, a slowdown of 1.5: the generation alone
      // (1 s), three inferences at 2/3 ÷ 1.5 speed (2.25 s), two trains at 1 ÷ 1.5 (1.5 s).
      const spec = uniform((_, i) => [i]);
      expect(simulate(tasks(spec), { sharedCores: 2, parallelSlowdown: 1.5 }).iterationSeconds).toBeCloseTo(1 + 2.25 + 1.5, 9);
      // On one device nothing overlaps: the factor never applies.
      const alone = uniform(() => [0]);
      expect(simulate(tasks(alone), { sharedCores: 2, parallelSlowdown: 1.5 }).iterationSeconds).toBeCloseTo(6, 9);
    });

    it('a pipeline computes one stage at a time: on two devices, one computing, it pays no parallel slowdown alone', () => {
      // The generation on devices 6 and 7 as a pipeline of two stages that take turns: alone (the
      // inferences wait for it) it computes on one core, at full speed, instead of 1.5 s as two
      // devices computing at once would take. The rest as without it: three inferences at 2/3 ÷ 1.5
      // (2.25 s), two trains at 1 ÷ 1.5 (1.5 s).
      const spec = uniform((_, i) => [i]);
      spec['actor.generate'] = { devices: [6, 7], seconds: 1, computing: 1 };
      const sim = simulate(tasks(spec), { iterations: 1, sharedCores: 2, parallelSlowdown: 1.5 });
      expect(span(sim, 'actor.generate', 0)).toEqual({ start: 0, end: 1 });
      expect(sim.iterationSeconds).toBeCloseTo(1 + 2.25 + 1.5, 9);
      // Both its devices stay held for the whole call.
      expect(sim.timeline.filter((e) => e.call === 'actor.generate').map((e) => e.device)).toEqual([6, 7]);
    });

    it("a segment's waiting share takes no core and is not slowed (hand-computed)", () => {
      // From t = 1 on one core: reference inference (1 s, half of it waiting on the bus) beside
      // reward inference (1 s, all computing). Reference computes beside the reward's 1 device:
      // 2 computing, rate 1/2, so it runs at 1 / (0.5 / 0.5 + 0.5) = 2/3. The reward computes beside
      // reference's half a device on average: 1.5 computing, rate 2/3. Both end at 1 + 1.5 = 2.5
      // (counting every device as computing throughout: 3).
      const spec: Spec = {
        'actor.generate': { devices: [0], seconds: 1 },
        'reference.inference': { devices: [1], seconds: 1, share: 0.5 },
        'reward.inference': { devices: [2], seconds: 1 },
        'critic.inference': { devices: [1], seconds: 1 },
        'actor.train': { devices: [0], seconds: 1 },
        'critic.train': { devices: [3], seconds: 1 },
      };
      const sim = simulate(tasks(spec), { iterations: 1, sharedCores: 1 });
      expect(span(sim, 'reference.inference', 0).end).toBeCloseTo(2.5, 9);
      expect(span(sim, 'reward.inference', 0).end).toBeCloseTo(2.5, 9);
    });

    it('counts a call on two devices as two busy devices', () => {
      // Generation on devices 0 and 1 with one core: 1 s of work per device, 2 s of wall time.
      const spec = uniform((_, i) => [i + 2]);
      spec['actor.generate'] = { devices: [0, 1], seconds: 1 };
      const sim = simulate(tasks(spec), { iterations: 1, sharedCores: 1 });
      expect(span(sim, 'actor.generate', 0)).toEqual({ start: 0, end: 2 });
    });
  });
});
