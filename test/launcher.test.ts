// The launcher as users meet it: `npm run scenario` is engine/cli/scenario.ts. It must stop
// everything it started — on success, on failure and on Ctrl-C — let workers join by hand, use a
// server it is given, and refuse bad scenario files with the path of the bad key.
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { launch } from '../engine/cli/launch.ts';
import { loadScenario } from '../engine/runtime/scenario/scenario.ts';
import { startNatsServer, type PrivateNatsServer } from '../mesh/wire/server/nats-server.ts';
import type { Summary } from '../engine/runtime/record/record.ts';
import { ROOT, portOpen, smallScenario, spawnTs, tempDir } from './helpers.ts';

const quiet = { phase() {}, iteration() {}, stop() {} };
const dir = tempDir();

function processesMentioning(text: string): string[] {
  return execFileSync('ps', ['-eo', 'pid,args'], { encoding: 'utf8' })
    .split('\n')
    .filter((l) => l.includes(text) && !l.includes('ps -eo'));
}

describe('npm run scenario', () => {
  it('fails with a clear error when no worker joins in time, and stops its nats-server', async () => {
    const file = smallScenario(dir, 'timeouts: { join_seconds: 2 }', 'lonely');
    const child = spawnTs('engine/cli/scenario.ts', [file, '--workers', '0', '--out', join(dir, 'lonely')]);
    const code = await child.exited;
    expect(code).toBe(1);
    const port = Number(child.output().match(/nats-server on nats:\/\/127\.0\.0\.1:(\d+)/)![1]);
    expect(await portOpen(port)).toBe(false);
    expect(child.output()).toMatch(/no worker joined for device\(s\) 0, 1, 2, 3 within 2 s/);
    const summary = JSON.parse(readFileSync(join(dir, 'lonely', 'summary.json'), 'utf8')) as Summary;
    expect(summary.status).toBe('failed');
    expect(summary.error).toMatch(/no worker joined/);
  }, 60_000);

  it('on Ctrl-C, stops the server and every process it started, and the summary says so', async () => {
    const file = smallScenario(dir, '', 'long');
    writeFileSync(file, readFileSync(file, 'utf8').replace('iterations: 3', 'iterations: 500'));
    const child = spawnTs('engine/cli/scenario.ts', [file, '--out', join(dir, 'long')], {}, { group: true });
    const [, run] = await child.waitFor(/run (long-[0-9-]+)/);
    const [, port] = await child.waitFor(/nats-server on nats:\/\/127\.0\.0\.1:(\d+)/);
    await child.waitFor(/iteration 2\/500/, 90_000);
    expect(processesMentioning(run!).length).toBeGreaterThanOrEqual(5);
    // As a terminal does: the signal goes to the launcher's whole process group.
    process.kill(-child.child.pid!, 'SIGINT');
    expect(await child.exited).toBe(130);
    expect(await portOpen(Number(port))).toBe(false);
    expect(processesMentioning(run!)).toEqual([]);
    const summary = JSON.parse(readFileSync(join(dir, 'long', 'summary.json'), 'utf8')) as Summary;
    expect(summary).toMatchObject({ status: 'failed', error: 'interrupted: the supervisor received SIGTERM' });
    expect(summary.iterations).toBeGreaterThanOrEqual(2);
  }, 120_000);

  it('refuses a scenario with a misspelt key, naming the path, before starting anything', async () => {
    const file = join(dir, 'typo.yaml');
    writeFileSync(file, 'rl:\n  iterations: 2\n  kl_coeff: 0.1\n');
    const child = spawnTs('engine/cli/scenario.ts', [file]);
    expect(await child.exited).not.toBe(0);
    expect(child.output()).toMatch(/typo\.yaml: 1 problem\(s\):\n\s+rl\.kl_coeff: unknown key \(expected one of: .*kl_coef/);
    expect(child.output()).not.toMatch(/nats-server on/);
  }, 30_000);

  it('refuses a model too large for the workers, and an empty file, before starting anything or writing a run directory', async () => {
    const big = join(dir, 'big.yaml');
    writeFileSync(big, 'name: big\nmodel: { width: 4096, layers: 24, heads: 32 }\n');
    const out = join(dir, 'big-run');
    const child = spawnTs('engine/cli/scenario.ts', [big, '--out', out]);
    expect(await child.exited).not.toBe(0);
    expect(child.output()).toMatch(
      /ScenarioError: big: model: the plan does not fit the workers' memory: actor\.\w+ needs [\d.]+ GB on a device of \d+ GB .*make model\.width or model\.layers smaller/,
    );
    expect(child.output()).not.toMatch(/nats-server on/);
    expect(existsSync(out)).toBe(false);
    const empty = join(dir, 'empty.yaml');
    writeFileSync(empty, '# a scenario to fill in\n');
    const second = spawnTs('engine/cli/scenario.ts', [empty]);
    expect(await second.exited).not.toBe(0);
    expect(second.output()).toMatch(/empty\.yaml: expected a mapping of settings/);
  }, 30_000);

  it('refuses an unknown algorithm, listing the known ones, and a user graph with a cycle, naming it, before starting anything', async () => {
    const unknown = join(dir, 'unknown.yaml');
    writeFileSync(unknown, 'algorithm: ppo2\n');
    const a = spawnTs('engine/cli/scenario.ts', [unknown]);
    expect(await a.exited).not.toBe(0);
    expect(a.output()).toMatch(/unknown algorithm 'ppo2'; known: ppo, grpo, rloo, remax, reinforce_pp, dpo/);
    expect(a.output()).not.toMatch(/nats-server on/);
    // A user's GRPO whose advantage step also reads the train call's loss: advantages → train → advantages.
    const algo = join(dir, 'loop.ts');
    writeFileSync(
      algo,
      [
        `import { BUILTIN, defineAlgorithm } from ${JSON.stringify(join(ROOT, 'engine/api.ts'))};`,
        'const grpo = BUILTIN.grpo!;',
        'export default defineAlgorithm({ name: "loop", summary: "a cycle", options: grpo.options, graph: (o, rl) => {',
        '  const g = grpo.graph(o, rl);',
        '  g.steps[0]!.reads.push("actor_loss");',
        '  return g;',
        '} });',
        '',
      ].join('\n'),
    );
    const looped = join(dir, 'loop.yaml');
    writeFileSync(looped, 'algorithm: ./loop.ts\n');
    const b = spawnTs('engine/cli/scenario.ts', [looped]);
    expect(await b.exited).not.toBe(0);
    expect(b.output()).toMatch(/algorithm 'loop' cannot run:\n\s+a cycle: .*(advantages.*actor\.train|actor\.train.*advantages)/);
    expect(b.output()).not.toMatch(/nats-server on/);
  }, 60_000);
});

describe('a run on a server it is given, with a worker started by hand', () => {
  let server: PrivateNatsServer;
  beforeAll(async () => {
    server = await startNatsServer();
  });
  afterAll(async () => {
    await server?.stop();
  });

  it('uses that server, waits for the hand-started worker, and succeeds', async () => {
    const file = smallScenario(dir, '', 'byhand');
    const run = `byhand${Date.now()}`;
    const lines: string[] = [];
    const running = launch({ scenario: loadScenario(file), run, out: join(dir, 'byhand'), natsUrl: server.url, workers: 3, progress: quiet, say: (l) => lines.push(l) });
    const worker = spawnTs('actors/worker.ts', ['--nats', server.url, '--run', run, '--backend', 'wasm']);
    onTestFinished(() => void worker.child.kill('SIGKILL'));
    const result = await running;
    expect(result.code).toBe(0);
    expect(result.natsUrl).toBe(server.url);
    expect(lines.join('\n')).toMatch(/waiting for 1 worker\(s\) to join by hand: npm run worker -- --nats nats:\/\/127\.0\.0\.1:\d+ --run byhand/);
    expect(await worker.exited).toBe(0);
    expect(worker.output()).toMatch(/joined run byhand\d+ as device \d/);
    // The server the run was given keeps running.
    expect(await portOpen(server.port)).toBe(true);
  }, 120_000);

  it('a worker leaves by itself when the run it joined fails', async () => {
    const file = smallScenario(dir, 'timeouts: { join_seconds: 8 }', 'doomed');
    const run = `doomed${Date.now()}`;
    const running = launch({ scenario: loadScenario(file), run, out: join(dir, 'doomed'), natsUrl: server.url, workers: 0, progress: quiet, say: () => {} });
    const worker = spawnTs('actors/worker.ts', ['--nats', server.url, '--run', run, '--backend', 'cpu']);
    onTestFinished(() => void worker.child.kill('SIGKILL'));
    expect((await running).code).toBe(1);
    expect(await worker.exited).toBe(0);
    expect(worker.output()).toMatch(/the run is over \(failed\): leaving/);
  }, 60_000);

  it('refuses a worker that asks for a device the plan does not use', async () => {
    const file = smallScenario(dir, 'timeouts: { join_seconds: 60 }', 'strict');
    const run = `strict${Date.now()}`;
    // Three workers of four: the run cannot end before the stray has been answered.
    const running = launch({ scenario: loadScenario(file), run, out: join(dir, 'strict'), natsUrl: server.url, workers: 3, progress: quiet, say: () => {} });
    const stray = spawnTs('actors/worker.ts', ['--nats', server.url, '--run', run, '--device', '9', '--backend', 'cpu']);
    onTestFinished(() => void stray.child.kill('SIGKILL'));
    expect(await stray.exited).not.toBe(0);
    expect(stray.output()).toMatch(/refused this worker: device 9 is not in this run's plan \(devices 0, 1, 2, 3\)/);
    const fourth = spawnTs('actors/worker.ts', ['--nats', server.url, '--run', run, '--backend', 'wasm']);
    onTestFinished(() => void fourth.child.kill('SIGKILL'));
    expect((await running).code).toBe(0);
  }, 120_000);
});
