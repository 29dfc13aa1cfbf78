// transferSeconds must price every move exactly as reallocSeconds does from the runtime's
// transfer plan: random pairs of layouts over clusters of one to sixteen nodes, views of the same
// devices, of overlapping ones and of others, with replicas, tensor and pipeline splits.
import { describe, expect, it } from 'vitest';
import type { Cluster } from '../../../mesh/parallel/index.ts';
import { DEVICES, MODELS, localShape, type ModelShape } from './catalog.ts';
import { reallocSeconds } from './cost.ts';
import { meshes, placement, strategies } from './planner.ts';
import { transferSeconds } from './transfer.ts';

function layouts(cluster: Cluster, m: ModelShape) {
  return meshes(cluster).flatMap((mesh) => {
    const size = placement(cluster, mesh, { dp: 1, tp: 1, pp: 1 }).devices.length;
    return strategies(size, cluster.devicesPerNode)
      .filter((s) => m.heads % s.tp === 0 && s.pp <= m.layers)
      .map((s) => placement(cluster, mesh, s));
  });
}

const cases: Array<{ name: string; cluster: Cluster; model: ModelShape; pairs: number }> = [
  { name: 'a small GPT on 2 nodes of 4', cluster: { nodes: 2, devicesPerNode: 4 }, model: localShape('small', 16, 6, 64, 4), pairs: 400 },
  { name: 'LLaMA-2 7B on 4 nodes of 8', cluster: { nodes: 4, devicesPerNode: 8 }, model: MODELS['llama2-7b']!, pairs: 150 },
  { name: 'LLaMA-2 70B on 16 nodes of 8', cluster: { nodes: 16, devicesPerNode: 8 }, model: MODELS['llama2-70b']!, pairs: 25 },
];

describe('transferSeconds', () => {
  for (const c of cases) {
    it(`prices moves as reallocSeconds does, to the bit: ${c.name}`, () => {
      const all = layouts(c.cluster, c.model);
      let s = 2024;
      const rand = () => (s = (s * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
      let moving = 0;
      for (let i = 0; i < c.pairs; i++) {
        const from = all[Math.floor(rand() * all.length)]!;
        // A third of the views share the owner's mesh (another strategy on the same devices).
        const same = all.filter((l) => l.mesh === from.mesh);
        const to = rand() < 0.33 ? same[Math.floor(rand() * same.length)]! : all[Math.floor(rand() * all.length)]!;
        for (const valueHead of [false, true]) {
          const expected = reallocSeconds(c.model, from, to, DEVICES['a100-80gb']!, c.cluster.devicesPerNode, valueHead);
          expect(
            transferSeconds(c.model, from, to, DEVICES['a100-80gb']!, c.cluster.devicesPerNode, valueHead),
            `${from.mesh} ${from.dp}/${from.tp}/${from.pp} -> ${to.mesh} ${to.dp}/${to.tp}/${to.pp}`,
          ).toBe(expected);
          if (expected > 0) moving += 1;
        }
      }
      expect(moving).toBeGreaterThan(c.pairs);
    });
  }
});
