// Every algorithm over real NATS and real worker processes, under fire: three kills each (a
// worker in one of the algorithm's own calls, a worker while it trains, and the supervisor while
// it sends a train call). Each run must end with the clean run's digests and every prompt trained
// on exactly once. A user's algorithm from a file runs the same way. The cases are run by two test
// files (algorithms.test.ts, algorithms-more.test.ts), so that the two halves run side by side.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ROOT, chaosCli, tempDir } from './helpers.ts';

/** Each algorithm, its options, and the worker kill in one of its own calls. */
export const CASES: Array<{ algorithm: string; kill: { actor: string; call: string } }> = [
  { algorithm: '{ name: ppo }', kill: { actor: 'critic', call: 'inference' } },
  { algorithm: '{ name: grpo, group: 2 }', kill: { actor: 'actor', call: 'generate' } },
  { algorithm: '{ name: rloo, group: 2 }', kill: { actor: 'reference', call: 'inference' } },
  { algorithm: '{ name: remax }', kill: { actor: 'reward', call: 'inference' } },
  { algorithm: '{ name: reinforce_pp }', kill: { actor: 'actor', call: 'generate' } },
  { algorithm: '{ name: dpo }', kill: { actor: 'actor', call: 'inference' } },
  { algorithm: `{ name: ${join(ROOT, 'examples/algorithm/rank-grpo.ts')}, group: 2 }`, kill: { actor: 'reference', call: 'inference' } },
  // A loss of the user's own: a restarted worker loads and checks its file again before it trains.
  { algorithm: `{ name: ${join(ROOT, 'examples/algorithm/gmpo.ts')}, group: 2 }`, kill: { actor: 'actor', call: 'generate' } },
];

function scenario(dir: string, algorithm: string, kill: { actor: string; call: string }): string {
  const file = join(dir, 'scenario.yaml');
  writeFileSync(
    file,
    [
      'name: algo',
      'seed: 3',
      'model: { layers: 1, width: 16, heads: 2 }',
      'cluster: { nodes: 1, devices_per_node: 3 }',
      `algorithm: ${algorithm}`,
      'warmup: { steps: 2, demos: 32, batch: 16 }',
      'rl: { iterations: 3, batch: 8, epochs: 1, minibatches: 2 }',
      'timeouts: { heartbeat_seconds: 3 }',
      'chaos:',
      '  kills:',
      `    - { actor: ${kill.actor}, call: ${kill.call}, iteration: 0 }`,
      '    - { actor: actor, call: train, iteration: 1 }',
      '    - { actor: supervisor, call: train, iteration: 2 }',
      '',
    ].join('\n'),
  );
  return file;
}

/** The cases `pick` names (by index), each a test. */
export function chaosCases(title: string, pick: number[]): void {
  describe(title, () => {
    for (const c of pick.map((i) => CASES[i]!)) {
      const name = c.algorithm
        .match(/name: ([^,}]+)/)![1]!
        .trim()
        .split('/')
        .pop();
      it(`${name}: three kills (one of them the supervisor's), the clean run's digests, no rollout lost or doubled`, async () => {
        const dir = tempDir();
        const { code, output, report } = await chaosCli([scenario(dir, c.algorithm, c.kill), '--out', join(dir, 'runs')]);
        expect(report.chaos.error, output).toBeUndefined();
        expect(report.kills).toBe(3);
        expect(report.kills_by_actor.supervisor).toBe(1);
        expect(report.recovered).toBe(3);
        expect(report.digests_equal).toBe(true);
        expect(report.rollouts_lost).toBe(0);
        expect(report.rollouts_duplicated).toBe(0);
        expect(code).toBe(0);
      }, 240_000);
    }
  });
}
