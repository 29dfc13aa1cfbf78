// 3D-parallel layouts over a real nats-server with worker processes: a plan whose calls use
// different meshes and strategies, so that every iteration moves weights between layouts and
// every call runs across several ranks. The run over NATS must equal, bit for bit, the same plan
// run in one process (same devices, in-memory bus), and move exactly the planned minimum.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { launch } from '../engine/cli/launch.ts';
import { loadScenario } from '../engine/runtime/scenario/scenario.ts';
import { runSpec } from '../engine/runtime/run/run.ts';
import { initBackend } from '../engine/model/backend/backend.ts';
import type { Summary } from '../engine/runtime/record/record.ts';
import { runInProcess } from '../engine/supervision/local-run.ts';
import { smallScenario, tempDir } from './helpers.ts';

const PLAN = `model: { layers: 2, width: 32, heads: 4 }
plan:
  actor.train: { mesh: "0:0-1", dp: 2 }
  actor.generate: { mesh: "0:2-3", tp: 2 }
  critic.train: { mesh: "0:0-1", pp: 2 }
  critic.inference: { mesh: "0:2-3", dp: 2 }
  reference.inference: { mesh: "0:0-3", dp: 2, tp: 2 }
  reward.inference: { mesh: "0:3" }`;

describe('a run whose calls use different 3D-parallel layouts', () => {
  it('runs over NATS, reallocates every iteration, and equals the in-process run bit for bit', async () => {
    const dir = tempDir();
    const file = smallScenario(dir, PLAN, 'layouts');
    const scenario = loadScenario(file);
    const bus = await launch({ scenario, run: `layouts${Date.now()}`, out: join(dir, 'bus'), progress: { phase() {}, iteration() {}, stop() {} }, say: () => {} });
    expect(bus.code).toBe(0);
    const metrics = readFileSync(join(dir, 'bus', 'metrics.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(metrics).toHaveLength(3);
    for (const m of metrics) expect(m.realloc_bytes).toBeGreaterThan(0);
    expect(new Set(metrics.map((m) => m.realloc_bytes)).size).toBe(1);

    const backend = await initBackend('wasm');
    const local: Summary[] = [];
    const localMetrics: number[] = [];
    await runInProcess(runSpec(scenario), { phase() {}, iteration: (m) => localMetrics.push(m.reward_mean), finished: (s) => local.push(s) }, backend);
    expect(local[0]!.status).toBe('succeeded');
    expect(local[0]!.digests).toEqual(bus.summary!.digests);
    expect(localMetrics).toEqual(metrics.map((m) => m.reward_mean));
  }, 180_000);
});
