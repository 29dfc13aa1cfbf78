// A device lost for good in each kind of call it runs — generation, inference, training, a
// reallocation, its part of a snapshot — in lock-step and asynchronous runs (rl.lag, rl.staleness):
// the run re-plans onto the devices left and ends with the parameters of its twin, the same run
// stopped at the snapshot the re-plan went back to and resumed from it on the new plan (what
// `npm run chaos` compares it with), every prompt trained on once. Each loss comes after the run
// recorded stage results past that snapshot on the old plan (a rollout, log-probs, values), which
// the new plan computes with other reduction orders. In one process (the same supervisor machine,
// devices and migration; a loss is what chaos would tell the supervisor), the cases that share a
// twin's first leg sharing it; one loss over NATS, end to end through npm run chaos and its reference.
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Call, Metrics } from '../mesh/wire/index.ts';
import type { Layout } from '../mesh/parallel/index.ts';
import { initBackend } from '../engine/model/backend/backend.ts';
import { runChaos } from '../engine/cli/chaos-run.ts';
import { LocalDispatcher, parseScenario, planDevices, reshardToPlan, runSpec, withPlan, type CheckpointSet, type Scenario, type Summary } from '../engine/runtime/index.ts';
import { FOUR_DEVICES } from '../engine/runtime/run/four-devices.fixture.ts';
import { runInProcess } from '../engine/supervision/local-run.ts';
import type { SupervisorEvent } from '../engine/supervision/supervisor.machine.ts';
import { tempDir } from './helpers.ts';

let backend: string;
beforeAll(async () => {
  backend = await initBackend('wasm');
});

/** PPO on four devices (the elastic scenario's plan, a small model), elastic, with `extra`. */
const scenarioText = (extra: string) =>
  `name: losses${FOUR_DEVICES.replace('model: { layers: 2, width: 32, heads: 4 }', 'model: { layers: 2, width: 16, heads: 2 }')}` +
  'warmup: { steps: 2, demos: 32, batch: 8 }\nelastic: { search_seconds: 0.25 }\ntimeouts: { join_seconds: 10, recover_seconds: 30 }\n' +
  extra;

/** Where a device is lost: the call (`checkpoint`: its part of a snapshot) of `iteration`, the first of a model's if `model` is given. */
interface Loss {
  device: number;
  call: 'generate' | 'inference' | 'train' | 'realloc' | 'checkpoint';
  iteration: number;
  model?: string;
}

const reaches = (loss: Loss, device: number, call: Call) =>
  device === loss.device &&
  call.iteration === loss.iteration &&
  (call.body.fn === 'snapshot' ? 'checkpoint' : call.body.fn) === loss.call &&
  (loss.model === undefined || call.model.split('@')[0] === loss.model);

interface Ran {
  summary: Summary;
  metrics: Metrics[];
  checkpoint?: { iteration: number; set: CheckpointSet; layouts: Record<string, Layout> };
}

/** A run in one process: with a device lost for good where `loss` says (the call it reaches there fails, the supervisor hears the loss), or resumed. */
async function run(scenario: string | Scenario, o: { loss?: Loss; resume?: { iteration: number; checkpoint: CheckpointSet; history: Metrics[] } } = {}): Promise<Ran> {
  const spec = runSpec(typeof scenario === 'string' ? parseScenario(scenario, 'losses.yaml') : scenario);
  const out: Ran = { summary: undefined as unknown as Summary, metrics: [] };
  let send: (event: SupervisorEvent) => void = () => {};
  let lost = false;
  const dispatcher = new LocalDispatcher(4, undefined, undefined, {
    beforeRun: async (device, call) => {
      const { loss } = o;
      if (!loss || device !== loss.device) return;
      if (!lost && !reaches(loss, device, call)) return;
      // Gone: this call and any after it fail (none should come: the new plan leaves the device out).
      if (!lost) send({ type: 'device.lost', device, trigger: 'chaos', reason: `lost in '${loss.call}' of iteration ${loss.iteration}` });
      lost = true;
      throw new Error(`device ${device} is lost for good`);
    },
  });
  const recorder = {
    phase() {},
    iteration: (m: Metrics) => void out.metrics.push(m),
    // Going back to a snapshot: the metrics after it are computed again.
    rewind: (kept: Metrics[]) => void (out.metrics = [...kept]),
    finished: (s: Summary) => void (out.summary = s),
  };
  const input = {
    saveCheckpoint: async (iteration: number, set: CheckpointSet, layouts: Record<string, Layout>) => void (out.checkpoint = { iteration, set, layouts }),
    ...(o.resume ? { resume: o.resume } : {}),
  };
  await runInProcess(spec, recorder, backend, 'losses', dispatcher, { input, started: (s) => (send = s) });
  expect(out.summary?.status, out.summary?.error).toBe('succeeded');
  return out;
}

/** Twins' legs already run, by their scenario and where they stop or resume. */
const legs = new Map<string, Promise<Ran>>();
const once = (key: string, leg: () => Promise<Ran>) => legs.get(key) ?? legs.set(key, leg()).get(key)!;

/**
 * The twin of a run that re-planned once: `text` stopped at the iteration the re-plan went back to
 * and resumed from its checkpoint on the new plan. A free-running run's twin replays the schedule
 * it recorded (`versions`), each leg its part.
 */
async function twin(text: string, rl: string, replan: NonNullable<Summary['replans']>[number], versions?: readonly number[]): Promise<Ran> {
  // The scenario's rl: line, `n` iterations long.
  const until = (n: number) => `${rl.replace(/iterations: \d+/, `iterations: ${n}`).replace(/ \}$/, versions ? `, versions: [${versions.slice(0, n).join(', ')}] }` : ' }')}\n`;
  const stop = replan.iteration;
  const first = await once(`${text}|${until(stop)}`, () => run(text + until(stop)));
  const onPlan = withPlan(parseScenario(text + until(Number(rl.match(/iterations: (\d+)/)![1])), 'losses.yaml'), replan.plan_after);
  const { iteration, set, layouts } = first.checkpoint!;
  expect(iteration).toBe(stop - 1);
  const resume = { iteration, checkpoint: reshardToPlan(runSpec(onPlan), set, layouts).set, history: first.metrics };
  const second = await once(`${text}|${rl}|${stop}|${JSON.stringify(replan.plan_after)}|${versions}`, () => run(onPlan, { resume }));
  return { ...second, metrics: [...first.metrics, ...second.metrics] };
}

const LOCK_STEP = 'rl: { iterations: 2, batch: 8 }';

describe('a device lost for good while it works: the run ends as its twin resumed on the new plan does', () => {
  it.each([
    // Iteration 1's rollout and scores are recorded (on devices 2-3) when device 3 fails in its first inference.
    { name: 'inference', rl: LOCK_STEP, extra: '', loss: { device: 3, call: 'inference', iteration: 1 } },
    // Everything but training is recorded when a training rank fails (the case issue 38 reported).
    { name: 'train', rl: LOCK_STEP, extra: '', loss: { device: 1, call: 'train', iteration: 1 } },
    // The critic's weights move to its inference layout after the rollout is recorded.
    { name: 'realloc', rl: LOCK_STEP, extra: '', loss: { device: 0, call: 'realloc', iteration: 1, model: 'critic' } },
    // The whole iteration is recorded and trained when its snapshot fails.
    { name: 'checkpoint', rl: LOCK_STEP, extra: '', loss: { device: 2, call: 'checkpoint', iteration: 1 } },
    // A snapshot every two iterations: iteration 2 ran whole on the old plan after the last one.
    { name: 'generate', rl: 'rl: { iterations: 4, batch: 8 }', extra: 'checkpoint: { every: 2 }\n', loss: { device: 2, call: 'generate', iteration: 3 } },
    // rl.lag: iteration 2's rollout was generated ahead in iteration 1; the loss comes as iteration 2 generates iteration 3's.
    // (The twin's first leg must be longer than the lag: the loss comes after the snapshot of iteration 1.)
    { name: 'generate, rl.lag', rl: 'rl: { iterations: 4, batch: 8, lag: 1 }', extra: '', loss: { device: 2, call: 'generate', iteration: 3 } },
    // rl.staleness: free-running, iteration 2's rollout came from version 1 while iteration 1 trained.
    { name: 'train, rl.staleness', rl: 'rl: { iterations: 3, batch: 8, staleness: 1 }', extra: '', loss: { device: 1, call: 'train', iteration: 2 } },
  ] as Array<{ name: string; rl: string; extra: string; loss: Loss }>)(
    '$name',
    async ({ rl, extra, loss }) => {
      const text = scenarioText(extra);
      const chaos = await run(`${text}${rl}\n`, { loss });
      const s = chaos.summary;
      expect(s.replans).toHaveLength(1);
      const [replan] = s.replans!;
      expect(replan).toMatchObject({ trigger: 'chaos', lost: [loss.device], changed: true, parameters_equal_after_migration: true });
      expect(planDevices(runSpec(withPlan(parseScenario(`${text}${rl}\n`, 'losses.yaml'), replan!.plan_after)))).not.toContain(loss.device);
      expect(s.rollouts).toMatchObject({ lost: 0, duplicated: 0 });
      // Asynchronous: the rollouts generated ahead on the old plan are generated again from the snapshot, as a resumed run does.
      if (s.staleness) expect(s.staleness.versions[replan!.iteration]).toBe(replan!.iteration);
      const reference = await twin(text, rl, replan!, rl.includes('staleness') ? s.staleness!.versions : undefined);
      expect(reference.metrics.map((m) => [m.iteration, m.kl, m.critic_loss])).toEqual(chaos.metrics.map((m) => [m.iteration, m.kl, m.critic_loss]));
      expect(s.digests).toEqual(reference.summary.digests);
    },
    120_000,
  );
});

describe('over NATS, through npm run chaos', () => {
  it('free-running (rl.staleness), a training rank lost for good: the digests of its reference, which replays its schedule; nothing lost or trained twice', async () => {
    const dir = tempDir();
    const text = `${scenarioText('')}rl: { iterations: 3, batch: 8, staleness: 1 }\nchaos: { kills: [{ lose: 1, call: train, iteration: 2 }] }\n`;
    const report = await runChaos(parseScenario(text, 'losses.yaml'), join(dir, 'chaos'));
    expect(report.chaos.status, report.chaos.error).toBe('succeeded');
    expect(report).toMatchObject({ reference: 'resumed on each re-plan', clean_replays: true, parameters_equal_after_migration: true, rollouts_lost: 0, rollouts_duplicated: 0 });
    expect(report.replans).toHaveLength(1);
    expect(report.digests_equal).toBe(true);
  }, 180_000);
});
