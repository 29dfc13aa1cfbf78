// The quickstart as shipped: it must learn. The run is seeded and bit-reproducible, so this is a
// fixed outcome, not a lucky one; the margin guards against a change that quietly breaks learning.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { launch } from '../engine/cli/launch.ts';
import { loadScenario } from '../engine/runtime/scenario/scenario.ts';
import { ROOT, tempDir } from './helpers.ts';
import { SYNC_VERSION, atLeast } from '../mesh/wire/server/server-binary.ts';

describe('scenarios/quickstart.yaml', () => {
  it('raises the reward from the first five iterations to the last five', async () => {
    const out = join(tempDir(), 'quickstart');
    const scenario = loadScenario(join(ROOT, 'scenarios', 'quickstart.yaml'));
    const r = await launch({ scenario, run: `qs${Date.now()}`, out, progress: { phase() {}, iteration() {}, stop() {} }, say: () => {} });
    expect(r.code).toBe(0);
    const s = r.summary!;
    expect(s.status).toBe('succeeded');
    expect(s.iterations).toBe(scenario.rl.iterations);
    expect(s.reward_last5! - s.reward_first5!).toBeGreaterThan(0.2);
    expect(readFileSync(join(out, 'metrics.jsonl'), 'utf8').trim().split('\n')).toHaveLength(scenario.rl.iterations);
    // Its private server syncs every write: a nats-server of 2.10 or later (ferry fetches Debian
    // trixie's where the installed one is older), which the summary names.
    expect(s.bus?.sync).toBe('always');
    expect(atLeast(s.bus?.server_version, SYNC_VERSION)).toBe(true);
  }, 180_000);
});
