// Runs with reward actors on the bus: the external example (a process that imports nothing from
// ferry) rewarding a short scenario; a run whose reward actor never comes, which waits, says so
// and stops after its deadline; and the learned reward model served over the same protocol.
import { spawn } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { launch } from '../engine/cli/launch.ts';
import { loadScenario } from '../engine/runtime/scenario/scenario.ts';
import { startNatsServer, type PrivateNatsServer } from '../mesh/wire/server/nats-server.ts';
import type { Metrics } from '../mesh/wire/messages/protocol.ts';
import { chaosCli, ROOT, tempDir } from './helpers.ts';

const quiet = { phase() {}, iteration() {}, stop() {} };
const metrics = (dir: string) =>
  readFileSync(join(dir, 'metrics.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as Metrics);

describe('reward actors in a run', () => {
  let server: PrivateNatsServer;
  beforeAll(async () => {
    server = await startNatsServer();
  });
  afterAll(() => server.stop());

  it('the external example rewards the example scenario, started and stopped as its own process', async () => {
    const dir = tempDir();
    const actor = spawn(process.execPath, [join(ROOT, 'examples/reward-actor/ascending.mjs'), '--nats', server.url], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
    let log = '';
    actor.stdout!.on('data', (b: Buffer) => (log += b.toString()));
    const exited = new Promise<number | null>((r) => actor.once('exit', (code) => r(code)));
    try {
      const file = join(dir, 'scenario.yaml');
      writeFileSync(file, readFileSync(join(ROOT, 'examples/reward-actor/scenario.yaml'), 'utf8').replace('iterations: 20', 'iterations: 3'));
      const r = await launch({ scenario: loadScenario(file), run: `ext${Date.now()}`, out: join(dir, 'run'), natsUrl: server.url, progress: quiet, say: () => {} });
      expect(r.summary?.error).toBeUndefined();
      expect(r.code).toBe(0);
      const m = metrics(join(dir, 'run'));
      expect(m).toHaveLength(3);
      for (const x of m) {
        expect(Object.keys(x.rewards!).sort()).toEqual(['ascending', 'rule']);
        // The reward is the weighted sum: 0.5 × rule + 0.5 × ascending.
        expect(x.reward_mean).toBeCloseTo(0.5 * x.rewards!.rule! + 0.5 * x.rewards!.ascending!, 5);
        expect(x.rewards!.ascending).toBeGreaterThan(0);
      }
      expect(log).toMatch(/scored 64 responses for ext\d+, iteration 2/);
    } finally {
      actor.kill('SIGTERM');
      expect(await exited).toBe(0);
    }
  }, 120_000);

  it('learns a reward model from pairs the hidden rule labels, serves it over the reward protocol, and PPO against it raises the rule too', async () => {
    const dir = tempDir();
    const file = join(dir, 'learned.yaml');
    writeFileSync(file, readFileSync(join(ROOT, 'scenarios/learned-reward.yaml'), 'utf8').replace('iterations: 30', 'iterations: 12'));
    const said: string[] = [];
    const r = await launch({ scenario: loadScenario(file), run: `rm${Date.now()}`, out: join(dir, 'run'), natsUrl: server.url, progress: quiet, say: (l) => said.push(l) });
    expect(r.summary?.error).toBeUndefined();
    const rm = r.summary!.reward_model!;
    expect(rm.drawn).toBe(1024);
    expect(rm.pairs).toBeGreaterThan(1024);
    expect(rm.loss).toBeLessThan(rm.first_loss);
    expect(rm.accuracy).toBeGreaterThan(0.75);
    // The reward model answered as reward actor rm-<run>, from the reward device (device 3).
    expect(said.join('\n')).toMatch(new RegExp(`reward actor 'rm-${r.summary!.run}': instance d3-\\w+ is serving`));
    const m = metrics(join(dir, 'run'));
    const avg = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
    for (const x of m) expect(Object.keys(x.rewards!)).toEqual(['learned']);
    const learned = m.map((x) => x.rewards!.learned!);
    const rule = m.map((x) => x.rule_score!);
    expect(avg(learned.slice(-5))).toBeGreaterThan(avg(learned.slice(0, 5)) + 0.5);
    expect(avg(rule.slice(-5))).toBeGreaterThan(avg(rule.slice(0, 5)) + 0.02);
  }, 420_000);

  it('a learned reward model survives kills of its device (in setup and at a checkpoint) and of the supervisor: the digests equal a clean run', async () => {
    const dir = tempDir();
    const file = join(dir, 'lrc.yaml');
    writeFileSync(
      file,
      [
        'name: lrc',
        'seed: 1',
        'model: { layers: 2, width: 32, heads: 4 }',
        'warmup: { steps: 8, demos: 256, batch: 32 }',
        'reward:',
        '  model: { pairs: 128, steps: 30, batch: 32 }',
        'rl: { iterations: 5, batch: 32, kl_coef: 0.1 }',
        'timeouts: { heartbeat_seconds: 3 }',
        'supervision: { intensity: 30 }',
        'chaos:',
        '  kills:',
        '    - { actor: reward, call: load, iteration: -1 }',
        '    - { actor: reward, call: checkpoint, iteration: 1 }',
        '    - { actor: supervisor, call: inference, iteration: 3 }',
        '',
      ].join('\n'),
    );
    const { code, output, report } = await chaosCli([file, '--out', join(dir, 'out')]);
    expect(code, output).toBe(0);
    expect(report.kills).toBe(3);
    expect(report.recovered).toBe(3);
    expect(report.digests_equal).toBe(true);
    expect([report.rollouts_lost, report.rollouts_duplicated]).toEqual([0, 0]);
  }, 180_000);

  it('waits for a reward actor that never comes, says so, and stops after wait_seconds', async () => {
    const dir = tempDir();
    const file = join(dir, 'absent.yaml');
    writeFileSync(
      file,
      ['name: absent', 'seed: 2', 'warmup: { steps: 2, demos: 32, batch: 16 }', 'rl: { iterations: 2, batch: 16 }', 'reward:', '  actors:', '    - { name: nobody-here, wait_seconds: 2 }', ''].join(
        '\n',
      ),
    );
    const said: string[] = [];
    const r = await launch({ scenario: loadScenario(file), run: `absent${Date.now()}`, out: join(dir, 'run'), natsUrl: server.url, progress: quiet, say: (l) => said.push(l) });
    expect(r.code).toBe(1);
    expect(r.summary?.status).toBe('failed');
    expect(r.summary!.error).toMatch(/iteration 0, reward\.inference: RewardCallError: no reward actor 'nobody-here' appeared on ferry\.reward\.nobody-here\.hb within 2 s \(its wait_seconds\)/);
    expect(r.summary!.recoveries).toEqual([]);
    expect(said.join('\n')).toMatch(/waiting for a reward actor 'nobody-here'/);
  }, 120_000);
});
