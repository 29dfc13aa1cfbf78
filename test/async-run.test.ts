// Rollouts generated while the policy trains (rl.lag), in whole runs in one process: the schedule
// is a function of the iteration and the lag, so a lagged run repeats bit for bit; iteration u's
// rollouts come from version max(0, u − lag) (the same rollouts as another lag's run where that
// version is the same); the actor trains with the decoupled loss against the proximal policy.
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Metrics } from '../mesh/wire/index.ts';
import { initBackend } from '../engine/model/backend/backend.ts';
import type { Summary } from '../engine/runtime/record/record.ts';
import { runInProcess } from '../engine/supervision/local-run.ts';
import { LocalDispatcher } from '../engine/runtime/dispatch/local-dispatch.ts';
import type { ReallocRequest } from '../engine/runtime/dispatch/dispatch.ts';
import { runSpec } from '../engine/runtime/run/run.ts';
import { loadScenario } from '../engine/runtime/scenario/scenario.ts';
import { runChaos } from '../engine/cli/chaos-run.ts';
import { loadScenarioFile } from '../engine/runtime/scenario/scenario.ts';
import { join } from 'node:path';
import { ROOT, scenarioRefusal, smallScenario, tempDir } from './helpers.ts';

const dir = tempDir('ferry-async-run-');
let backend: string;

async function run(lag: number | undefined, name: string, algorithm = 'algorithm: { name: grpo, group: 2, kl: loss }'): Promise<{ summary: Summary; metrics: Metrics[] }> {
  const rl = `rl: { iterations: 4, batch: 16${lag === undefined ? '' : `, lag: ${lag}`} }`;
  const file = smallScenario(dir, `${algorithm}\ncluster: { nodes: 1, devices_per_node: 2 }`, name);
  writeFileSync(file, readFileSync(file, 'utf8').replace('rl: { iterations: 3, batch: 16 }', rl));
  const summaries: Summary[] = [];
  const metrics: Metrics[] = [];
  const out = await runInProcess(runSpec(loadScenario(file)), { phase() {}, iteration: (m) => metrics.push(m), finished: (s) => summaries.push(s) }, backend);
  expect(out.status, summaries[0]?.error).toBe('succeeded');
  return { summary: summaries[0]!, metrics };
}

beforeAll(async () => {
  backend = await initBackend('wasm');
});

/** scenarios/async.yaml made small (4 iterations, a short warm-up), as `name`, changed by `edit`. */
function smallAsync(name: string, edit: (text: string) => string = (t) => t): string {
  const file = join(dir, `${name}.yaml`);
  writeFileSync(
    file,
    edit(
      readFileSync(join(ROOT, 'scenarios/async.yaml'), 'utf8')
        .replace('name: async', `name: ${name}`)
        .replace('warmup: { steps: 15, demos: 1024, batch: 32, lr: 3.0e-3 }', 'warmup: { steps: 3, demos: 64, batch: 16, lr: 3.0e-3 }')
        .replace('iterations: 40', 'iterations: 4')
        .replace('batch: 16\n', 'batch: 8\n'),
    ),
  );
  return file;
}

/** The message a scenario with `extra` and the `rl` line is refused with, before any work starts. */
const refusal = (extra: string, rl: string, name: string): string => scenarioRefusal(dir, extra, rl, name);

describe('rl.lag: rollouts of an older policy, generated ahead', () => {
  it('lag 1 repeats bit for bit, trains another model than lock-step, and says which version made each rollout', async () => {
    const a = await run(1, 'lag1');
    const b = await run(1, 'lag1-again');
    expect(b.summary.digests).toEqual(a.summary.digests);
    const sync = await run(undefined, 'sync');
    expect(sync.summary.digests).not.toEqual(a.summary.digests);
    expect(a.metrics.map((m) => m.policy_version)).toEqual([0, 0, 1, 2]);
    expect(a.metrics.map((m) => m.staleness)).toEqual([0, 1, 1, 1]);
    // Lock-step runs report no versions (their metrics are as they were).
    expect(sync.metrics.every((m) => m.policy_version === undefined && m.staleness === undefined)).toBe(true);
  }, 300_000);

  it("iteration u's rollout comes from version max(0, u − lag): where two lags give the same version, the same rollout", async () => {
    const one = await run(1, 'same-1');
    const two = await run(2, 'same-2');
    expect(two.metrics.map((m) => m.policy_version)).toEqual([0, 0, 0, 1]);
    // Iterations 0 and 1: version 0 under both lags, so the same sequences, rewards and tokens.
    for (const i of [0, 1]) {
      expect(two.metrics[i]!.reward_mean).toBe(one.metrics[i]!.reward_mean);
      expect(two.metrics[i]!.rule_score).toBe(one.metrics[i]!.rule_score);
      expect(two.metrics[i]!.response_length).toBe(one.metrics[i]!.response_length);
    }
    expect(two.summary.digests).not.toEqual(one.summary.digests);
  }, 300_000);

  it('the next version moves into a second copy on the rollout device beside the generation still running on the last: each move ends while a generation is held open', async () => {
    // Generation on device 0, everything else on device 1 (nothing of the training waits on device 0).
    const file = smallAsync('beside', (text) =>
      text.replace('reference.inference: { mesh: "0:0" }', 'reference.inference: { mesh: "0:1" }').replace('reward.inference: { mesh: "0:0" }', 'reward.inference: { mesh: "0:1" }'),
    );
    const runOn = async (d?: LocalDispatcher) => {
      const summaries: Summary[] = [];
      const out = await runInProcess(runSpec(loadScenario(file)), { phase() {}, iteration() {}, finished: (x) => summaries.push(x) }, backend, 'beside', d);
      expect(out.status, summaries[0]?.error).toBe('succeeded');
      return summaries[0]!;
    };
    // Iteration t generates iteration t + 1's rollout while it trains, then moves version t + 1
    // (a reallocation marked beside, of iteration t). Each generation of iterations 1 and 2 is held
    // open on its device until the move of the version after it has ended: were the move queued
    // behind the generation, it never would.
    const moved = new Map<number, () => void>();
    const moves = new Map<number, Promise<void>>();
    const moveOf = (t: number) => {
      if (!moves.has(t)) moves.set(t, new Promise<void>((done) => moved.set(t, done)));
      return moves.get(t)!;
    };
    const held: number[] = [];
    const late: string[] = [];
    class Gated extends LocalDispatcher {
      override async realloc(r: ReallocRequest) {
        const out = await super.realloc(r);
        if (r.beside) void moveOf(r.iteration), moved.get(r.iteration)!();
        return out;
      }
    }
    const gated = new Gated(2, undefined, undefined, {
      beforeRun: async (device, call) => {
        // (Only in the first epoch: a recovery after a failed wait runs ungated, and the test fails below.)
        if (call.body.fn !== 'generate' || device !== 0 || call.iteration < 1 || call.iteration > 2 || call.epoch !== 0) return;
        held.push(call.iteration);
        let timer: NodeJS.Timeout | undefined;
        const tooLate = new Promise<never>(
          (_, fail) => (timer = setTimeout(() => (late.push(`version ${call.iteration}`), fail(new Error(`version ${call.iteration} did not move while the generation ran`))), 20_000)),
        );
        await Promise.race([moveOf(call.iteration - 1), tooLate]).finally(() => clearTimeout(timer));
      },
    });
    const a = await runOn(gated);
    expect(late).toEqual([]);
    expect(held).toEqual([1, 2]);
    expect([...moves.keys()].sort()).toEqual([0, 1]);
    // The same run, ungated: the same parameters.
    const b = await runOn();
    expect(a.digests).toEqual(b.digests);
  }, 300_000);

  it('is refused before work starts where it cannot hold: a lag as long as the run, an algorithm of pairs', () => {
    const refused = (extra: string, rl: string) => refusal(extra, rl, 'refused');
    expect(refused('', 'rl: { iterations: 3, batch: 16, lag: 3 }')).toMatch(/rl\.lag: 3 is not less than rl\.iterations \(3\)/);
    expect(refused('algorithm: dpo', 'rl: { iterations: 3, batch: 16, lag: 1 }')).toMatch(/rl\.lag: this algorithm learns from preference pairs and generates nothing/);
    expect(refused('', 'rl: { iterations: 3, batch: 16, lag: -1 }')).toMatch(/rl\.lag/);
  });

  it("chaos over NATS under lag 1: the generating and the training device and the supervisor killed while the next version's rollouts are in flight; the clean run's digests, nothing lost or repeated", async () => {
    const file = smallAsync('async-chaos', (text) =>
      text.concat(
        // The ahead generation of iteration 2 runs during iteration 1; the supervisor dies while iteration 3's is in flight.
        'chaos: { kills: [{ actor: actor, call: generate, iteration: 2 }, { actor: actor, call: train, iteration: 1 }, { actor: supervisor, call: train, iteration: 2 }] }\n',
      ),
    );
    const lines: string[] = [];
    const report = await runChaos(await loadScenarioFile(file), join(dir, 'chaos'), (l) => lines.push(l));
    if (report.chaos.status !== 'succeeded') console.log(lines.join('\n'));
    expect(report.chaos.status, report.chaos.error).toBe('succeeded');
    expect(report.kills_by_actor).toEqual({ actor: 2, supervisor: 1 });
    expect(report.digests_equal).toBe(true);
    expect(report.rollouts_lost).toBe(0);
    expect(report.rollouts_duplicated).toBe(0);
    // The supervisor process builds the stale graph from the resolved scenario it reads back: the
    // proximal policy's pass is planned, on the train mesh.
    const summary = JSON.parse(readFileSync(join(dir, 'chaos', 'clean', 'summary.json'), 'utf8')) as { plan: Record<string, { mesh: string }> };
    expect(summary.plan['actor.prox']).toMatchObject({ mesh: '0:1' });
  }, 300_000);
});

/** A free-running (or replayed) run of scenarios/async-staleness.yaml made small: generation on device 0, training on device 1. */
async function staleRun(name: string, rl: string): Promise<{ summary: Summary; metrics: Metrics[]; file: string }> {
  const file = join(dir, `${name}.yaml`);
  writeFileSync(
    file,
    readFileSync(join(ROOT, 'scenarios/async-staleness.yaml'), 'utf8')
      .replace('name: async-staleness', `name: ${name}`)
      .replace('warmup: { steps: 15, demos: 1024, batch: 32, lr: 3.0e-3 }', 'warmup: { steps: 3, demos: 64, batch: 16, lr: 3.0e-3 }')
      .replace(/rl:\n(  .*\n)+/, `rl: ${rl}\n`),
  );
  const summaries: Summary[] = [];
  const metrics: Metrics[] = [];
  const out = await runInProcess(runSpec(loadScenario(file)), { phase() {}, iteration: (m) => metrics.push(m), finished: (s) => summaries.push(s) }, backend);
  expect(out.status, summaries[0]?.error).toBe('succeeded');
  return { summary: summaries[0]!, metrics, file };
}

describe('rl.staleness: free-running rollouts within η, written ahead, replayed without timing', () => {
  it('admits nothing older than η, says so in the metrics and the summary, and its recorded schedule replays to the same digests', async () => {
    const free = await staleRun('free', '{ iterations: 6, batch: 8, staleness: 2 }');
    const versions = free.metrics.map((m) => m.policy_version as number);
    expect(free.summary.staleness?.versions).toEqual(versions);
    versions.forEach((v, u) => {
      expect(v).toBeLessThanOrEqual(u);
      expect(u - v).toBeLessThanOrEqual(2);
      expect(free.metrics[u]!.staleness).toBe(u - v);
    });
    // The first admitted iteration is decided before each iteration trains: at least one-step-off.
    expect(versions.slice(1).every((v, i) => v <= i)).toBe(true);
    const ages = versions.map((v, u) => u - v);
    expect(free.summary.staleness).toMatchObject({ max: Math.max(...ages), mean: ages.reduce((a, b) => a + b, 0) / ages.length });
    expect(Object.values(free.summary.staleness!.histogram).reduce((a, b) => a + b, 0)).toBe(6);
    expect(free.summary.rollouts).toEqual({ prompts: 6 * 8 * 4, lost: 0, duplicated: 0 });
    const again = await staleRun('free-replayed', `{ iterations: 6, batch: 8, staleness: 2, versions: [${versions.join(', ')}] }`);
    expect(again.metrics.map((m) => m.policy_version)).toEqual(versions);
    expect(again.summary.digests).toEqual(free.summary.digests);
  }, 300_000);

  it('a recorded schedule decides the versions, whatever the timing: one no lag gives replays as recorded, to its own digests', async () => {
    // Ages 0, 1, 1, 2, 1, 2: a timing no fixed lag has.
    const versions = [0, 0, 1, 1, 3, 3];
    const a = await staleRun('recorded', `{ iterations: 6, batch: 8, staleness: 2, versions: [${versions.join(', ')}] }`);
    expect(a.metrics.map((m) => m.policy_version)).toEqual(versions);
    expect(a.summary.staleness).toMatchObject({ versions, max: 2, histogram: { 0: 1, 1: 3, 2: 2 } });
    const b = await staleRun('recorded-again', `{ iterations: 6, batch: 8, staleness: 2, versions: [${versions.join(', ')}] }`);
    expect(b.summary.digests).toEqual(a.summary.digests);
    const lag2 = await staleRun('recorded-lag2', '{ iterations: 6, batch: 8, lag: 2 }');
    expect(lag2.summary.digests).not.toEqual(a.summary.digests);
  }, 300_000);

  it('is refused before work starts where it cannot hold, naming the key', () => {
    const refused = (extra: string, rl: string) => refusal(extra, rl, 'refused-staleness');
    expect(refused('', 'rl: { iterations: 3, batch: 16, staleness: 3 }')).toMatch(/rl\.staleness: 3 is not less than rl\.iterations \(3\)/);
    expect(refused('', 'rl: { iterations: 3, batch: 16, staleness: -1 }')).toMatch(/rl\.staleness/);
    expect(refused('algorithm: dpo', 'rl: { iterations: 3, batch: 16, staleness: 1 }')).toMatch(/rl\.staleness: this algorithm learns from preference pairs and generates nothing/);
    expect(refused('', 'rl: { iterations: 3, batch: 16, lag: 1, staleness: 1 }')).toMatch(/rl\.lag \(1\) and rl\.staleness \(1\): .* set one of them/);
    expect(refused('', 'rl: { iterations: 3, batch: 16, versions: [0, 0, 1] }')).toMatch(/rl\.versions: a recorded schedule replays a free-running run; it needs the rl\.staleness/);
    expect(refused('', 'rl: { iterations: 3, batch: 16, staleness: 1, versions: [0, 0, 0] }')).toMatch(
      /rl\.versions: iteration 2's rollouts from version 0 are 2 updates old, more than rl\.staleness \(1\)/,
    );
  });

  it('--replay takes only a finished free-running run, and says why not', async () => {
    const { replayOf } = await import('../engine/cli/replay.ts');
    await expect(replayOf(join(dir, 'nowhere'), join(dir, 'replay-out'))).rejects.toThrow(/expected a run directory with scenario.json and summary.json/);
    const lagged = join(dir, 'lagged-run');
    mkdirSync(lagged, { recursive: true });
    writeFileSync(join(lagged, 'scenario.json'), JSON.stringify({ rl: { iterations: 4, lag: 1, staleness: 0 } }));
    writeFileSync(join(lagged, 'summary.json'), JSON.stringify({ status: 'succeeded', digests: { actor: 'x' } }));
    await expect(replayOf(lagged, join(dir, 'replay-out'))).rejects.toThrow(/is not a free-running run \(its rl.staleness is 0\); a lagged run's schedule is a function of rl.lag/);
    writeFileSync(join(lagged, 'scenario.json'), JSON.stringify({ rl: { iterations: 4, staleness: 1 } }));
    writeFileSync(join(lagged, 'summary.json'), JSON.stringify({ status: 'failed' }));
    await expect(replayOf(lagged, join(dir, 'replay-out'))).rejects.toThrow(/did not succeed \(status failed\)/);
  });

  it("chaos over NATS, free-running with in-flight updates: the generating device (mid-switch and mid-generation) and the supervisor (mid-switch) killed; the chaos run's recorded schedule and switches, replayed, end with its digests, nothing lost or repeated", async () => {
    // scenarios/inflight.yaml made small: generation on device 0 in 2 slots outlasts the training
    // on device 1 (the training device is killed under lag 1, above), so the next version is handed to it mid-way (a kill in 'switch' lands there; on
    // a machine so loaded that a generation ends first, that kill has nothing to land in: optional).
    const file = join(dir, 'stale-chaos.yaml');
    writeFileSync(
      file,
      readFileSync(join(ROOT, 'scenarios/inflight.yaml'), 'utf8')
        .replace('name: inflight', 'name: stale-chaos')
        .replace('warmup: { steps: 30, demos: 1024, batch: 32, lr: 3.0e-3 }', 'warmup: { steps: 3, demos: 64, batch: 16, lr: 3.0e-3 }')
        .replace('model: { layers: 2, width: 64, heads: 4 }', 'model: { layers: 1, width: 32, heads: 2 }')
        .replace('iterations: 30', 'iterations: 6')
        .concat(
          'chaos: { kills: [{ actor: actor, call: switch, iteration: 1, optional: true }, { actor: supervisor, call: switch, iteration: 2, optional: true }, { actor: actor, call: generate, iteration: 4 }] }\n',
        ),
    );
    const lines: string[] = [];
    const report = await runChaos(await loadScenarioFile(file), join(dir, 'stale-chaos'), (l) => lines.push(l));
    if (report.chaos.status !== 'succeeded' || !report.digests_equal) console.log(lines.join('\n'));
    expect(report.chaos.status, report.chaos.error).toBe('succeeded');
    expect(report.clean_replays).toBe(true);
    expect(report.kills_by_call.generate).toBe(1);
    expect(report.digests_equal).toBe(true);
    expect(report.rollouts_lost).toBe(0);
    expect(report.rollouts_duplicated).toBe(0);
    const chaos = JSON.parse(readFileSync(join(dir, 'stale-chaos', 'chaos', 'summary.json'), 'utf8')) as Summary;
    const clean = JSON.parse(readFileSync(join(dir, 'stale-chaos', 'clean', 'scenario.json'), 'utf8')) as { rl: { versions: number[]; switches?: unknown } };
    expect(clean.rl.versions).toEqual(chaos.staleness!.versions);
    // The replay was given the switches the chaos run recorded, and made the same.
    expect(clean.rl.switches).toEqual(chaos.staleness!.switches);
    expect(Object.keys(chaos.staleness!.switches ?? {}).length).toBeGreaterThan(0);
  }, 300_000);
});
