// A run stopped after iteration k and resumed from its checkpoint ends bit-identical to a run that
// was never stopped: weights and optimizer state come back exactly, and prompts, sampling and
// mini-batches are seeded by iteration.
import { copyFileSync, cpSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { launch } from '../engine/cli/launch.ts';
import { loadScenario } from '../engine/runtime/scenario/scenario.ts';
import { readResume, sampleRun } from '../engine/runtime/index.ts';
import { PROTOCOL_VERSION } from '../mesh/wire/index.ts';
import { Packr } from 'msgpackr';
import { ROOT, smallScenario, spawnTs, tempDir } from './helpers.ts';

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

  it('goes on with another plan: the checkpoint, taken tensor-parallel, resharded onto a pipeline; two such resumes end alike', async () => {
    const dir = tempDir();
    const planned = (name: string, n: number, strategy: string) =>
      withIterations(dir, name, n, `algorithm: { name: grpo, group: 2 }\ncluster: { nodes: 1, devices_per_node: 2 }\nplan:\n  actor.train: { mesh: "0:0-1", ${strategy} }`);
    const first = join(dir, 'tp');
    const stopped = await launch({ scenario: loadScenario(planned('tp', 2, 'tp: 2')), run: `tp${Date.now()}`, out: first, progress: quiet, say: () => {} });
    expect(stopped.code).toBe(0);
    const pp = planned('pp', 3, 'pp: 2');
    const ends: string[][] = [];
    for (const copy of ['a', 'b']) {
      const out = join(dir, `pp-${copy}`);
      cpSync(first, out, { recursive: true });
      const resumed = await launch({ scenario: loadScenario(pp), run: `pp${copy}${Date.now()}`, out, resume: true, progress: quiet, say: () => {} });
      expect(resumed.code, readFileSync(join(out, 'logs', 'supervisor.log'), 'utf8')).toBe(0);
      expect(resumed.summary!.iterations).toBe(3);
      expect(rewards(out)).toHaveLength(3);
      expect(readFileSync(join(out, 'logs', 'supervisor.log'), 'utf8')).toMatch(/resuming after iteration 1 from .*, resharding 'actor' onto this plan/);
      ends.push(resumed.summary!.digests as unknown as string[]);
    }
    expect(ends[1]).toEqual(ends[0]);
    // The iterations before the checkpoint are the tensor-parallel run's own.
    expect(rewards(join(dir, 'pp-a')).slice(0, 2)).toEqual(rewards(first));
    // A resumed run that died before its first checkpoint on the new plan has the new scenario.json
    // beside the old checkpoint: sampling still reads the checkpoint on the layout it was taken on.
    const died = join(dir, 'died');
    cpSync(first, died, { recursive: true });
    writeFileSync(join(died, 'scenario.json'), JSON.stringify(loadScenario(pp)));
    const prompt = [1, 2, 3, 4];
    const before = await sampleRun(first, { tokens: prompt, greedy: true });
    const after = await sampleRun(died, { tokens: prompt, greedy: true });
    expect(after.tokens).toEqual(before.tokens);
  }, 300_000);

  it('a device lost for good, by hand: npm run plan --lose --write plans the devices left, and the run goes on there from its checkpoint', async () => {
    const dir = tempDir();
    const file = withIterations(
      dir,
      'two-devices',
      3,
      'algorithm: { name: grpo, group: 2 }\ncluster: { nodes: 1, devices_per_node: 2 }\nplan:\n  actor.train: { mesh: "0:0-1", dp: 2 }\n  actor.generate: { mesh: "0:0-1", dp: 2 }',
    );
    const out = join(dir, 'run');
    const two = withIterations(
      dir,
      'two-devices-2',
      2,
      'algorithm: { name: grpo, group: 2 }\ncluster: { nodes: 1, devices_per_node: 2 }\nplan:\n  actor.train: { mesh: "0:0-1", dp: 2 }\n  actor.generate: { mesh: "0:0-1", dp: 2 }',
    );
    const stopped = await launch({ scenario: loadScenario(two), run: `two${Date.now()}`, out, progress: quiet, say: () => {} });
    expect(stopped.code).toBe(0);
    // Device 1 is gone: plan the rest of the run without it.
    const planFile = join(dir, 'without-1.yaml');
    // The planner prices a local scenario with this machine's profile (profiles/local.json where it
    // runs): ferry's shipped one stands in for `npm run profile`.
    mkdirSync(join(dir, 'profiles'));
    copyFileSync(join(ROOT, 'profiles', 'default-local.json'), join(dir, 'profiles', 'local.json'));
    const p = spawnTs('engine/cli/plan.ts', [file, '--lose', '1', '--remaining', '1', '--budget', '1', '--max-lag', '0', '--write', planFile], {}, { cwd: dir });
    expect(await p.exited, p.output()).toBe(0);
    expect(p.output()).toMatch(/device\(s\) 1 lost: a new plan on 1 device\(s\)/);
    const resumed = await launch({ scenario: loadScenario(file, planFile), run: `one${Date.now()}`, out, resume: true, progress: quiet, say: () => {} });
    expect(resumed.code, readFileSync(join(out, 'logs', 'supervisor.log'), 'utf8')).toBe(0);
    expect(resumed.summary!.iterations).toBe(3);
    expect(readFileSync(join(out, 'logs', 'supervisor.log'), 'utf8')).toMatch(/resharding 'actor'/);
    // Every call of the rest of the run on device 0.
    const plan = JSON.parse(readFileSync(join(out, 'summary.json'), 'utf8')).plan as Record<string, { mesh: string }>;
    expect(Object.keys(plan).length).toBeGreaterThan(1);
    for (const [call, p] of Object.entries(plan)) expect(p.mesh, call).toBe('0:0');
  }, 300_000);

  it("reads a checkpoint written by protocol 1 to 8 (only how chunks travel, the reset call, where snapshots are written, calls beside, a restore answer, the chunk path digests, a view's kept base and in-flight updates changed since), and refuses one of an unknown version", () => {
    const dir = tempDir();
    const packr = new Packr({ useRecords: false, moreTypes: true, mapsAsObjects: true });
    const models = { actor: [{ tensors: [{ name: 'wte', shape: [2], data: new Float32Array([1, -0]) }] }] };
    writeFileSync(join(dir, 'checkpoint.msgpack'), packr.pack({ type: 'checkpoint', v: 1, iteration: 4, models }));
    const old = readResume(dir);
    expect(old.iteration).toBe(4);
    expect(old.layouts).toBeUndefined();
    expect(Array.from(old.checkpoint.actor![0]!.tensors[0]!.data)).toEqual([1, -0]);
    writeFileSync(join(dir, 'checkpoint.msgpack'), packr.pack({ type: 'checkpoint', v: 2, iteration: 5, models }));
    expect(readResume(dir).iteration).toBe(5);
    writeFileSync(join(dir, 'checkpoint.msgpack'), packr.pack({ type: 'checkpoint', v: 3, iteration: 6, models }));
    expect(readResume(dir).iteration).toBe(6);
    writeFileSync(join(dir, 'checkpoint.msgpack'), packr.pack({ type: 'checkpoint', v: 4, iteration: 7, models }));
    expect(readResume(dir).iteration).toBe(7);
    writeFileSync(join(dir, 'checkpoint.msgpack'), packr.pack({ type: 'checkpoint', v: 5, iteration: 8, models }));
    expect(readResume(dir).iteration).toBe(8);
    // Version 6's, with a ledger: its tokens' SHA-256 is what a ledger still holds (the chunk path's digests are BLAKE3 since 7; a checkpoint file holds none of them).
    const ledger = [{ iteration: 8, rows: 16, sha256: 'ab'.repeat(32) }];
    writeFileSync(join(dir, 'checkpoint.msgpack'), packr.pack({ type: 'checkpoint', v: 6, iteration: 9, models: { actor: [{ ...models.actor[0]!, ledger }] } }));
    expect(readResume(dir).iteration).toBe(9);
    expect(readResume(dir).checkpoint.actor![0]!.ledger).toEqual(ledger);
    writeFileSync(join(dir, 'checkpoint.msgpack'), packr.pack({ type: 'checkpoint', v: 7, iteration: 10, models }));
    expect(readResume(dir).iteration).toBe(10);
    writeFileSync(join(dir, 'checkpoint.msgpack'), packr.pack({ type: 'checkpoint', v: 8, iteration: 11, models }));
    expect(readResume(dir).iteration).toBe(11);
    writeFileSync(join(dir, 'checkpoint.msgpack'), packr.pack({ type: 'checkpoint', v: 10, iteration: 4, models }));
    expect(() => readResume(dir)).toThrow(`expected protocol version v=1, v=2, v=3, v=4, v=5, v=6, v=7, v=8 or v=${PROTOCOL_VERSION}, got 10`);
  });

  it('says what is missing when a run directory has no checkpoint', async () => {
    const dir = tempDir();
    const file = withIterations(dir, 'none', 1, 'checkpoint: { every: 0 }');
    const r = await launch({ scenario: loadScenario(file), run: `none${Date.now()}`, out: join(dir, 'none'), resume: true, progress: quiet, say: () => {} });
    expect(r.code).not.toBe(0);
    expect(readFileSync(join(dir, 'none', 'logs', 'supervisor.log'), 'utf8')).toMatch(/has no checkpoint\.msgpack to resume from/);
  }, 60_000);
});
