// End to end: a scenario over a real nats-server with the supervisor and four workers as real
// processes. The run must succeed, write its files, and be bit-for-bit reproducible — and equal to
// the same computation in one process with no bus.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { launch } from '../engine/cli/launch.ts';
import { loadScenario } from '../engine/runtime/scenario/scenario.ts';
import { runSpec } from '../engine/runtime/run/run.ts';
import { initBackend } from '../engine/model/backend/backend.ts';
import type { Summary } from '../engine/runtime/record/record.ts';
import { runInProcess } from '../engine/supervision/local-run.ts';
import { smallScenario, tempDir } from './helpers.ts';

const quiet = { phase() {}, iteration() {}, stop() {} };

async function runOverBus(file: string, out: string) {
  return launch({ scenario: loadScenario(file), run: `t${Date.now()}`, out, progress: quiet, say: () => {} });
}

describe('a PPO run over NATS with worker processes', () => {
  const dir = tempDir();
  const file = smallScenario(dir);
  let first: Awaited<ReturnType<typeof runOverBus>>;

  beforeAll(async () => {
    first = await runOverBus(file, join(dir, 'run1'));
  }, 120_000);

  it('succeeds and writes metrics.jsonl and summary.json', () => {
    expect(first.code).toBe(0);
    const lines = readFileSync(join(dir, 'run1', 'metrics.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(lines).toHaveLength(3);
    for (const [i, m] of lines.entries()) {
      expect(m.iteration).toBe(i);
      for (const key of ['reward_mean', 'kl', 'actor_loss', 'critic_loss', 'seconds', 'tokens']) expect(Number.isFinite(m[key])).toBe(true);
      expect(m.tokens).toBe(16 * 4);
    }
    const s = JSON.parse(readFileSync(join(dir, 'run1', 'summary.json'), 'utf8')) as Summary;
    expect(s).toMatchObject({ status: 'succeeded', iterations: 3, seed: 3, backend: 'wasm' });
    expect(s.reward_first5).toBeCloseTo(lines.reduce((a, m) => a + m.reward_mean, 0) / 3, 10);
    expect(Object.keys(s.plan)).toHaveLength(6);
    expect(s.digests.actor).toMatch(/^blake3:[0-9a-f]{64}$/);
    expect(s.digests.critic).toMatch(/^blake3:[0-9a-f]{64}$/);
    // Every process wrote a log, and the workers stopped cleanly.
    for (const name of ['supervisor', 'worker-0', 'worker-1', 'worker-2', 'worker-3']) {
      expect(readFileSync(join(dir, 'run1', 'logs', `${name}.log`), 'utf8')).not.toBe('');
    }
    expect(readFileSync(join(dir, 'run1', 'logs', 'worker-0.log'), 'utf8')).toMatch(/stopped/);
  });

  it('ends with bit-identical parameters when run again with the same seed', async () => {
    const second = await runOverBus(file, join(dir, 'run2'));
    expect(second.code).toBe(0);
    expect(second.summary!.digests).toEqual(first.summary!.digests);
    const m1 = readFileSync(join(dir, 'run1', 'metrics.jsonl'), 'utf8')
      .split('\n')
      .map((l) => l && JSON.parse(l).reward_mean);
    const m2 = readFileSync(join(dir, 'run2', 'metrics.jsonl'), 'utf8')
      .split('\n')
      .map((l) => l && JSON.parse(l).reward_mean);
    expect(m2).toEqual(m1);
  }, 120_000);

  it('computes exactly what the same run computes in one process without a bus', async () => {
    const backend = await initBackend('wasm');
    const summaries: Summary[] = [];
    const out = await runInProcess(runSpec(loadScenario(file)), { phase() {}, iteration() {}, finished: (s) => summaries.push(s) }, backend);
    expect(out.status).toBe('succeeded');
    expect(summaries[0]!.digests).toEqual(first.summary!.digests);
  }, 120_000);

  it('reallocates every iteration when generation and training use different devices, and ends bit-identical', async () => {
    const moved = smallScenario(
      dir,
      `plan:
  actor.train: { mesh: "0:0" }
  actor.generate: { mesh: "0:2" }
  critic.train: { mesh: "0:1" }
  critic.inference: { mesh: "0:3" }
  reference.inference: { mesh: "0:2" }
  reward.inference: { mesh: "0:3" }`,
      'moved',
    );
    const run = await runOverBus(moved, join(dir, 'moved'));
    expect(run.code).toBe(0);
    // The same weights, moved: nothing about the arithmetic changes.
    expect(run.summary!.digests).toEqual(first.summary!.digests);
    const metrics = readFileSync(join(dir, 'moved', 'metrics.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    const [actor, critic] = [run.summary!.parameters.actor!, run.summary!.parameters.critic!];
    // Each iteration fills an actor view for generation and a critic view for inference.
    for (const m of metrics) expect(m.realloc_bytes).toBe((actor + critic) * 4);
    const still = readFileSync(join(dir, 'run1', 'metrics.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    for (const m of still) expect(m.realloc_bytes).toBe(0);
  }, 120_000);

  it('ends elsewhere with another seed', async () => {
    const other = smallScenario(dir, '', 'other');
    const text = readFileSync(other, 'utf8').replace('seed: 3', 'seed: 4');
    const { writeFileSync } = await import('node:fs');
    writeFileSync(other, text);
    const backend = await initBackend('wasm');
    const summaries: Summary[] = [];
    await runInProcess(runSpec(loadScenario(other)), { phase() {}, iteration() {}, finished: (s) => summaries.push(s) }, backend);
    expect(summaries[0]!.digests.actor).not.toBe(first.summary!.digests.actor);
  }, 120_000);
});

describe('a run whose answers end at an end token (count, GRPO) over NATS', () => {
  const dir = tempDir();
  const file = smallScenario(dir, 'task: { name: count, base: 6 }\nalgorithm: { name: grpo, group: 2 }\ncluster: { devices_per_node: 3 }', 'count');

  it('records ragged rollouts, counts only real tokens, and equals the same run in one process', async () => {
    const run = await runOverBus(file, join(dir, 'count'));
    expect(run.code).toBe(0);
    const metrics = readFileSync(join(dir, 'count', 'metrics.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    const rows = 16 * 2;
    for (const m of metrics) {
      // Budget base + 1 = 7 tokens; responses end earlier, and the tokens generated are the real ones.
      expect(m.response_length).toBeGreaterThan(1);
      expect(m.response_length).toBeLessThan(7);
      expect(m.response_at_limit).toBeGreaterThanOrEqual(0);
      expect(m.response_at_limit).toBeLessThan(1);
      expect(m.tokens).toBe(Math.round(m.response_length * rows));
    }
    const backend = await initBackend('wasm');
    const summaries: Summary[] = [];
    await runInProcess(runSpec(loadScenario(file)), { phase() {}, iteration() {}, finished: (s) => summaries.push(s) }, backend);
    expect(summaries[0]!.digests).toEqual(run.summary!.digests);
  }, 120_000);
});
