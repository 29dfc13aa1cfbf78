// The new losses in whole runs (in one process; test/user-loss.test.ts runs a user's over NATS):
// each repeats bit for bit, each trains its own model, and decoupled PPO on fresh rollouts (the
// behaviour and proximal log-probs are both the generation's) is the clipped loss exactly.
import { beforeAll, describe, expect, it } from 'vitest';
import { initBackend } from '../engine/model/backend/backend.ts';
import type { Summary } from '../engine/runtime/record/record.ts';
import { runInProcess } from '../engine/supervision/local-run.ts';
import { runSpec } from '../engine/runtime/run/run.ts';
import { loadScenario } from '../engine/runtime/scenario/scenario.ts';
import { smallScenario, tempDir } from './helpers.ts';

const dir = tempDir('ferry-losses-run-');
let backend: string;

async function digestsOf(loss: string, name = loss): Promise<Summary> {
  const file = smallScenario(dir, `algorithm: { name: grpo, group: 2, kl: loss, loss: ${loss} }\ncluster: { nodes: 1, devices_per_node: 2 }`, name);
  const summaries: Summary[] = [];
  const out = await runInProcess(runSpec(loadScenario(file)), { phase() {}, iteration() {}, finished: (s) => summaries.push(s) }, backend);
  expect(out.status, summaries[0]?.error).toBe('succeeded');
  return summaries[0]!;
}

beforeAll(async () => {
  backend = await initBackend('wasm');
});

describe('GRPO with each built-in policy loss, in whole runs', () => {
  it('decoupled PPO with fresh rollouts ends with clip_policy’s digests, bit for bit', async () => {
    const clip = await digestsOf('clip_policy');
    const decoupled = await digestsOf('decoupled');
    expect(decoupled.digests).toEqual(clip.digests);
  }, 120_000);

  it.each(['gspo', 'cispo'])(
    '%s: two runs end with equal digests, and another model than clip_policy’s',
    async (loss) => {
      const first = await digestsOf(loss);
      const second = await digestsOf(loss, `${loss}-again`);
      expect(second.digests).toEqual(first.digests);
      const clip = await digestsOf('clip_policy', `clip-for-${loss}`);
      expect(first.digests.actor).not.toBe(clip.digests.actor);
    },
    180_000,
  );
});
