// In-flight weight updates in whole runs (rl.inflight), devices in this process on a real
// nats-server: the generation running on the rollout device when the next version fills the
// view's other copy goes on with it from a pass its device names, written ahead; the run's tokens
// are younger than their rollouts; and a replay of the recorded schedule and decisions ends with
// the run's digests.
import { readFileSync, writeFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { initBackend } from '../engine/model/backend/backend.ts';
import type { Summary } from '../engine/runtime/record/record.ts';
import { runInProcess } from '../engine/supervision/local-run.ts';
import { LocalDispatcher } from '../engine/runtime/dispatch/local-dispatch.ts';
import { runSpec } from '../engine/runtime/run/run.ts';
import { loadScenario } from '../engine/runtime/scenario/scenario.ts';
import { planDevices } from '../engine/runtime/run/iteration.ts';
import { connectBus, type NatsConnection } from '../mesh/wire/bus/bus.ts';
import type { Metrics } from '../mesh/wire/index.ts';
import { startNatsServer, type PrivateNatsServer } from '../mesh/wire/server/nats-server.ts';
import { scenarioRefusal, smallScenario, tempDir } from './helpers.ts';

const dir = tempDir('ferry-inflight-');
let server: PrivateNatsServer;
let nc: NatsConnection;
let backend: string;

beforeAll(async () => {
  backend = await initBackend('wasm');
  server = await startNatsServer();
  nc = await connectBus(server.url, 'inflight-test');
}, 30_000);

afterAll(async () => {
  await nc?.close();
  server?.stop();
});

// Generation on device 0 in 2 slots (responses of up to 32 tokens), training on device 1: a
// generation outlasts the training beside it, so the next version comes while it runs.
const SCENARIO = `task: { name: count, base: 32 }
model: { layers: 1, width: 32, heads: 2 }
cluster: { nodes: 1, devices_per_node: 2 }
plan:
  actor.generate: { mesh: "0:0" }
  actor.train: { mesh: "0:1" }
  reference.inference: { mesh: "0:0" }
  reward.inference: { mesh: "0:0" }
algorithm: { name: grpo, group: 4 }`;

async function run(name: string, rl: string): Promise<{ summary: Summary; metrics: Metrics[] }> {
  const file = smallScenario(dir, SCENARIO, name);
  writeFileSync(file, readFileSync(file, 'utf8').replace('rl: { iterations: 3, batch: 16 }', `rl: { iterations: 4, batch: 4, staleness: 1, slots: 2${rl} }`));
  const spec = runSpec(loadScenario(file));
  const summaries: Summary[] = [];
  const metrics: Metrics[] = [];
  const out = await runInProcess(
    spec,
    { phase() {}, iteration: (m) => metrics.push(m), finished: (s) => summaries.push(s) },
    backend,
    name,
    new LocalDispatcher(Math.max(...planDevices(spec)) + 1, nc),
  );
  expect(out.status, summaries[0]?.error).toBe('succeeded');
  return { summary: summaries[0]!, metrics };
}

describe('in-flight weight updates in a run', () => {
  // keep runs end to end under chaos (test/async-run.test.ts, scenarios/inflight.yaml); both modes are exact per sample (engine/generation/inflight.test.ts).
  for (const kv of ['recompute'] as const) {
    it(`rl.inflight_kv: ${kv}: generations switch version mid-way, tokens are younger than their rollouts, and a replay of the decisions ends with the same digests`, async () => {
      const first = await run(`inflight-${kv}`, `, inflight: true, inflight_kv: ${kv}`);
      const st = first.summary.staleness!;
      // Some generation switched: its decisions are in the summary, by iteration and call.
      const switches = st.switches!;
      expect(Object.keys(switches).length).toBeGreaterThan(0);
      for (const [u, byCall] of Object.entries(switches)) {
        for (const d of byCall['actor.generate']!) {
          expect(d.version).toBe(st.versions[Number(u)]! + 1);
          expect(d.steps[0]).toBeGreaterThan(0);
        }
      }
      // A switched iteration's tokens are partly one update younger than its rollout's version.
      for (const m of first.metrics) {
        expect(m.token_staleness_max as number).toBeLessThanOrEqual(1);
        if (switches[String(m.iteration)]) expect(m.token_staleness_mean as number).toBeLessThan(m.staleness as number);
        else expect(m.token_staleness_mean).toBe(m.staleness);
      }
      expect(st.tokens!.max).toBeLessThanOrEqual(1);
      // The recorded schedule and decisions, without timing: the same digests.
      const replay = await run(`inflight-${kv}-replay`, `, inflight: true, inflight_kv: ${kv}, versions: ${JSON.stringify(st.versions)}, switches: ${JSON.stringify(switches)}`);
      expect(replay.summary.digests).toEqual(first.summary.digests);
      expect(replay.summary.staleness!.switches).toEqual(switches);
    }, 180_000);
  }

  it('refuses rl.inflight without rl.staleness, with pairs, with an environment, on a generation of several stages or the trainer’s own layout, and a bad inflight_kv', () => {
    const refusal = (extra: string, rl: string, name: string) => scenarioRefusal(dir, extra, rl, name);
    expect(refusal(SCENARIO, 'rl: { iterations: 3, batch: 16, inflight: true }', 'no-eta')).toMatch(
      /rl\.inflight: new versions are taken in flight by a free-running run; set rl\.staleness: η of at least 1 \(it is 0\)/,
    );
    expect(refusal(SCENARIO, 'rl: { iterations: 3, batch: 16, lag: 1, inflight: true }', 'lagged')).toMatch(/rl\.lag: 1 fixes each rollout's version/);
    expect(refusal('algorithm: { name: dpo }', 'rl: { iterations: 3, batch: 16, staleness: 1, inflight: true }', 'pairs')).toMatch(/learns from preference pairs/);
    expect(
      refusal(`${SCENARIO}\nenvironment: { name: calculator, max_turns: 2, turn_tokens: 8, command: [node, calculator.js] }`, 'rl: { iterations: 3, batch: 16, staleness: 1, inflight: true }', 'env'),
    ).toMatch(/rl\.inflight with an environment: episodes take no new version in flight/);
    expect(refusal(SCENARIO, 'rl: { iterations: 3, batch: 16, staleness: 1, inflight: true, inflight_kv: drop }', 'kv')).toMatch(/rl\.inflight_kv/);
    expect(refusal(SCENARIO, 'rl: { iterations: 3, batch: 16, staleness: 1, inflight: false, versions: [0, 0, 1], switches: {} }', 'switches')).toMatch(
      /rl\.switches: recorded in-flight decisions replay a free-running in-flight run/,
    );
    expect(refusal(SCENARIO.replace('actor.generate: { mesh: "0:0" }', 'actor.generate: { mesh: "0:0-1", pp: 2 }'), 'rl: { iterations: 3, batch: 16, staleness: 1, inflight: true }', 'pp')).toMatch(
      /plan\.actor\.generate has pp = 2/,
    );
    expect(refusal('', 'rl: { iterations: 3, batch: 16, staleness: 1, inflight: true }', 'own')).toMatch(/rl\.inflight, and plan\.actor\.generate is the layout 'actor' trains on/);
  });
});
