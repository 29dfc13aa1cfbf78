// npm run chaos as a user runs it: scenarios/chaos.yaml kills workers of every model (in setup,
// generation, inference, training, mid-reallocation and at a checkpoint), hangs one, kills the
// supervisor twice and hangs it once; the run must end with the clean run's parameters, every
// prompt trained on exactly once.
import { describe, expect, it } from 'vitest';
import { chaosCli, spawnTs, tempDir } from './helpers.ts';

describe('npm run chaos', () => {
  it('recovers from a kill of every kind of actor and ends bit-identical to the clean run', async () => {
    const dir = tempDir();
    const { code, report } = await chaosCli(['scenarios/chaos.yaml', '--out', dir]);
    expect(report.chaos.error).toBeUndefined();
    expect(report.kills).toBe(11);
    expect(Object.keys(report.kills_by_actor).sort()).toEqual(['actor', 'critic', 'reference', 'reward', 'supervisor']);
    expect(report.kills_by_call.realloc).toBe(2);
    expect(report.hangs).toBe(2);
    expect(report.recovered).toBe(11);
    expect(report.recovery_seconds_median).toBeGreaterThan(0);
    expect(report.recovery_seconds_max).toBeGreaterThanOrEqual(report.recovery_seconds_median);
    // A recovery sends only what the devices lack: survivors that had not moved past the snapshot keep their ranks.
    expect(report.recovery_bytes.restored).toBeGreaterThan(0);
    expect(report.recovery_bytes.kept).toBeGreaterThan(0);
    // The recoveries are in place (no re-plan): every device reloaded its ranks from the buckets itself.
    expect(report.recovery_bytes.via_supervisor).toBe(0);
    // Each device writes its own state; only the manifests (a few hundred bytes each) go through the supervisor.
    expect(report.snapshot_bytes_by_devices).toBeGreaterThan(0);
    expect(report.snapshot_bytes_via_supervisor).toBeGreaterThan(0);
    expect(report.snapshot_bytes_via_supervisor! * 100).toBeLessThan(report.snapshot_bytes_by_devices!);
    expect(report.snapshot_seconds_mean).toBeGreaterThan(0);
    expect(report.digests_equal).toBe(true);
    expect(report.rollouts_lost).toBe(0);
    expect(report.rollouts_duplicated).toBe(0);
    expect(code).toBe(0);
  }, 300_000);

  it('refuses a scenario without kills, and bad flags, with a usage error', async () => {
    const none = spawnTs('engine/cli/chaos.ts', ['scenarios/quickstart.yaml']);
    expect(await none.exited).toBe(2);
    expect(none.output()).toMatch(/has no chaos: section with kills; add one, or pass --kills N/);
    const bad = spawnTs('engine/cli/chaos.ts', ['scenarios/quickstart.yaml', '--kills', 'many']);
    expect(await bad.exited).toBe(2);
    expect(bad.output()).toMatch(/--kills: expected a whole number >= 1, got many/);
    const lone = spawnTs('engine/cli/chaos.ts', ['scenarios/quickstart.yaml', '--seed', '3']);
    expect(await lone.exited).toBe(2);
    expect(lone.output()).toMatch(/--seed and --hang go with --kills/);
  }, 60_000);
});
