// Continuous generation in whole runs (rl.slots), devices in this process on a real nats-server:
// each row goes to the supervisor on the bus the moment it ends and its reward actor is asked
// then, and the run ends with the digests of the same run generated a batch at a time.
import { readFileSync, writeFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { initBackend } from '../engine/model/backend/backend.ts';
import type { Summary } from '../engine/runtime/record/record.ts';
import { runInProcess } from '../engine/supervision/local-run.ts';
import { LocalDispatcher } from '../engine/runtime/dispatch/local-dispatch.ts';
import { CallError, type CallOptions } from '../engine/runtime/dispatch/dispatch.ts';
import type { CallBody, CallFn, CallOf, ResultOf } from '../mesh/wire/index.ts';
import { RewardClient } from '../engine/runtime/index.ts';
import { runSpec } from '../engine/runtime/run/run.ts';
import { loadScenario } from '../engine/runtime/scenario/scenario.ts';
import { planDevices } from '../engine/runtime/run/iteration.ts';
import { connectBus, type NatsConnection } from '../mesh/wire/bus/bus.ts';
import { serveReward, type RewardActor } from '../mesh/wire/index.ts';
import type { Metrics } from '../mesh/wire/index.ts';
import { startNatsServer, type PrivateNatsServer } from '../mesh/wire/server/nats-server.ts';
import { scenarioRefusal, smallScenario, tempDir } from './helpers.ts';

const dir = tempDir('ferry-continuous-');
let server: PrivateNatsServer;
let nc: NatsConnection;
let actor: RewardActor;
let backend: string;
/** Each request the reward actor answered: its iteration and items. */
const requests: Array<{ run: string; iteration: number; items: number }> = [];

beforeAll(async () => {
  backend = await initBackend('wasm');
  server = await startNatsServer();
  nc = await connectBus(server.url, 'continuous-test');
  // Rewards ascending digits in a response: a score of the item alone.
  actor = await serveReward({
    nats: nc,
    name: 'ascending',
    score: async (items, req) => {
      requests.push({ run: req.run, iteration: req.iteration, items: items.length });
      await new Promise((r) => setTimeout(r, 5));
      return items.map((it) => it.response.reduce((n, t, i) => n + (i > 0 && t > it.response[i - 1]! ? 1 : 0), 0) / Math.max(1, it.response.length));
    },
  });
}, 30_000);

afterAll(async () => {
  await actor?.stop();
  await nc?.close();
  server?.stop();
});

const COUNT = `task: { name: count, base: 10 }
model: { layers: 1, width: 32, heads: 2 }
cluster: { nodes: 1, devices_per_node: 2 }
algorithm: { name: grpo, group: 4 }
reward: { weight: 0.5, actors: [{ name: ascending, weight: 0.5 }] }`;

async function run(name: string, rl: string, dispatcher?: LocalDispatcher): Promise<{ summary: Summary; metrics: Metrics[] }> {
  const file = smallScenario(dir, COUNT, name);
  writeFileSync(file, readFileSync(file, 'utf8').replace('rl: { iterations: 3, batch: 16 }', `rl: { iterations: 3, batch: 4${rl} }`));
  const spec = runSpec(loadScenario(file));
  const client = new RewardClient(nc, 'ascending', { timeoutMs: 10_000, retries: 1, waitMs: 10_000 });
  const summaries: Summary[] = [];
  const metrics: Metrics[] = [];
  try {
    const out = await runInProcess(
      spec,
      { phase() {}, iteration: (m) => metrics.push(m), finished: (s) => summaries.push(s) },
      backend,
      name,
      dispatcher ?? new LocalDispatcher(Math.max(...planDevices(spec)) + 1, nc),
      { input: { rewards: { score: (_actor, iteration, items) => client.score(name, iteration, items) } } },
    );
    expect(out.status, summaries[0]?.error).toBe('succeeded');
  } finally {
    client.close();
  }
  return { summary: summaries[0]!, metrics };
}

describe('continuous generation in a run', () => {
  beforeAll(async () => {
    // The reward actor is heard from before a run asks it.
    await new Promise((r) => setTimeout(r, 300));
  });

  it('rl.slots: every row asked of the reward actor the moment it ends, and the digests of the run generated a batch at a time', async () => {
    const batch = await run('batch', '');
    const continuous = await run('slots', ', slots: 3');
    expect(continuous.summary.digests).toEqual(batch.summary.digests);
    expect(continuous.metrics.map((m) => m.reward_mean)).toEqual(batch.metrics.map((m) => m.reward_mean));
    expect(continuous.metrics.map((m) => m.rewards)).toEqual(batch.metrics.map((m) => m.rewards));
    // A batch at a time: one request of the iteration's 16 rows. Continuously: each row asked once,
    // most of them alone as they ended (a row whose message comes after the call's reply is asked
    // with the others that did, in one request).
    const of = (run: string, iteration: number) => requests.filter((q) => q.run === run && q.iteration === iteration).map((q) => q.items);
    for (let i = 0; i < 3; i++) {
      expect(of('batch', i)).toEqual([16]);
      expect(of('slots', i).reduce((a, b) => a + b, 0)).toBe(16);
      expect(of('slots', i).filter((n) => n === 1).length).toBeGreaterThan(8);
    }
  }, 120_000);

  it('rl.lag 1 with rl.slots: the digests of the lagged run generated a batch at a time', async () => {
    const batch = await run('lag-batch', ', lag: 1');
    const continuous = await run('lag-slots', ', lag: 1, slots: 2');
    expect(continuous.summary.digests).toEqual(batch.summary.digests);
  }, 120_000);

  it('a generation that fails once some of its rows were kept is called again for the others only, and the run ends with the digests of one that did not fail', async () => {
    // Iteration 1's generation: rows 0-5 reach the supervisor, then the call fails (as if its
    // device died); the recovery plays iteration 1 again, and its generation asks for rows 6-15.
    class Failing extends LocalDispatcher {
      failed = false;
      readonly batches: number[] = [];
      override samples(listener: Parameters<LocalDispatcher['samples']>[0]) {
        return super.samples((log, device) => {
          if (this.failed || log.iteration !== 1 || log.row < 6) listener(log, device);
        });
      }
      override async call<F extends CallFn>(device: number, model: string, iteration: number, body: CallOf<F>, group?: string, options?: CallOptions): Promise<ResultOf<F>> {
        const out = await super.call(device, model, iteration, body, group, options);
        if ((body as CallBody).fn === 'generate' && iteration === 1) {
          this.batches.push((body as CallOf<'generate'>).batch);
          if (!this.failed) {
            this.failed = true;
            throw new CallError('failed', `device ${device} died after rows 0-5 of iteration 1 were sent`);
          }
        }
        return out;
      }
    }
    const failing = new Failing(2, nc);
    const broken = await run('failing', ', slots: 3', failing);
    expect(broken.summary.recoveries).toHaveLength(1);
    expect(failing.batches).toEqual([16, 10]);
    const clean = await run('not-failing', ', slots: 3');
    expect(broken.summary.digests).toEqual(clean.summary.digests);
  }, 120_000);

  it('refuses rl.slots where it cannot run: with pairs, on a generation of several stages', () => {
    const refusal = (extra: string, rl: string, name: string) => scenarioRefusal(dir, extra, rl, name);
    expect(refusal('algorithm: { name: dpo }', 'rl: { iterations: 3, batch: 16, slots: 4 }', 'dpo')).toMatch(/rl\.slots: 4, and 'dpo' learns from preference pairs/);
    expect(
      refusal(
        'cluster: { nodes: 1, devices_per_node: 2 }\nplan:\n  actor.generate: { mesh: "0:0-1", pp: 2 }\n  actor.train: { mesh: "0:0-1" }\n  reference.inference: { mesh: "0:0" }\n  reward.inference: { mesh: "0:1" }',
        'rl: { iterations: 3, batch: 16, slots: 4 }',
        'staged',
      ),
    ).toMatch(/rl\.slots: 4, and plan\.actor\.generate has pp = 2: continuous generation decodes on replicas of one stage/);
  });
});
