// A run stopped after iteration k and resumed from its checkpoint ends bit-identical to a run that
// was never stopped: weights and optimizer state come back exactly, and prompts, sampling and
// mini-batches are seeded by iteration.
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { launch } from '../engine/cli/launch.ts';
import { loadScenario } from '../engine/runtime/scenario/scenario.ts';
import { smallScenario, tempDir } from './helpers.ts';

const quiet = { phase() {}, iteration() {}, stop() {} };
const rewards = (dir: string) =>
  readFileSync(join(dir, 'metrics.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l).reward_mean as number);

function withIterations(dir: string, name: string, n: number, extra = ''): string {
  const file = smallScenario(dir, extra, name);
  writeFileSync(file, readFileSync(file, 'utf8').replace('iterations: 3', `iterations: ${n}`));
  return file;
}

describe('npm run scenario -- --resume RUN_DIR', () => {
  it('goes on from the last checkpoint and ends where an unstopped run ends, bit for bit', async () => {
    const dir = tempDir();
    const four = withIterations(dir, 'four', 4);
    const whole = await launch({ scenario: loadScenario(four), run: `whole${Date.now()}`, out: join(dir, 'whole'), progress: quiet, say: () => {} });
    expect(whole.code).toBe(0);

    const stopped = await launch({ scenario: loadScenario(withIterations(dir, 'two', 2)), run: `stopped${Date.now()}`, out: join(dir, 'resumed'), progress: quiet, say: () => {} });
    expect(stopped.code).toBe(0);
    expect(rewards(join(dir, 'resumed'))).toHaveLength(2);

    const resumed = await launch({ scenario: loadScenario(four), run: `resumed${Date.now()}`, out: join(dir, 'resumed'), resume: true, progress: quiet, say: () => {} });
    expect(resumed.code).toBe(0);
    expect(resumed.summary!.iterations).toBe(4);
    expect(resumed.summary!.digests).toEqual(whole.summary!.digests);
    expect(rewards(join(dir, 'resumed'))).toEqual(rewards(join(dir, 'whole')));
  }, 180_000);

  it('says what is missing when a run directory has no checkpoint', async () => {
    const dir = tempDir();
    const file = withIterations(dir, 'none', 1, 'checkpoint: { every: 0 }');
    const r = await launch({ scenario: loadScenario(file), run: `none${Date.now()}`, out: join(dir, 'none'), resume: true, progress: quiet, say: () => {} });
    expect(r.code).not.toBe(0);
    expect(readFileSync(join(dir, 'none', 'logs', 'supervisor.log'), 'utf8')).toMatch(/has no checkpoint\.msgpack to resume from/);
  }, 60_000);
});
