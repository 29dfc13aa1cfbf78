import { describe, expect, it } from 'vitest';
import type { Layout } from '../../mesh/parallel/index.ts';
import type { Checkpoint } from '../../mesh/wire/index.ts';
import { modelInfo, type GptSpec } from '../model/index.ts';
import { modelSpec, runSpec } from '../runtime/run/run.ts';
import { parseScenario } from '../runtime/scenario/scenario.ts';
import { reshard } from '../runtime/store/reshard.ts';
import { logicalDigests } from './migrate.ts';
import { setBytes } from '../runtime/supervisor/recovery.ts';

const r = runSpec(
  parseScenario('seed: 1\nmodel: { layers: 2, width: 32, heads: 4 }\ncluster: { nodes: 1, devices_per_node: 4 }\nalgorithm: { name: grpo, group: 2 }\nrl: { iterations: 2, batch: 8 }\n', 'x.yaml'),
);
const spec = modelSpec(r, 'actor') as GptSpec;
const one: Layout = { devices: [0], dp: 1, tp: 1, pp: 1 };

/** The actor's state on one device: distinct values, Adam's two moments, a step. */
function single(): Checkpoint[] {
  const fill = (salt: number, n: number) => Float32Array.from({ length: n }, (_, j) => salt + j / 13);
  const params = modelInfo(spec).params.map((p) => ({ name: p.name, shape: p.shape, n: p.shape.reduce((a, b) => a * b, 1) }));
  return [
    {
      tensors: params.map((p, i) => ({ name: p.name, shape: p.shape, data: fill(i, p.n) })),
      optimizer: { step: 3, moments: params.map((p, i) => ({ name: p.name, m: fill(100 + i, p.n), v: fill(200 + i, p.n) })) },
    },
  ];
}

describe('logicalDigests', () => {
  it('is the same on every layout the state is resharded onto, and changes with any element', () => {
    const base = single();
    const digest = (l: Layout) => logicalDigests(r, { actor: reshard(spec, 'actor', one, base, l) }, { actor: l }).actor;
    const want = digest(one);
    for (const l of [
      { devices: [0, 1], dp: 2, tp: 1, pp: 1 },
      { devices: [0, 1], dp: 1, tp: 2, pp: 1 },
      { devices: [2, 3], dp: 1, tp: 1, pp: 2 },
      { devices: [0, 1, 2, 3], dp: 1, tp: 2, pp: 2 },
    ])
      expect(digest(l), JSON.stringify(l)).toBe(want);
    const changed = single();
    changed[0]!.tensors[1]!.data[5] = Math.fround(changed[0]!.tensors[1]!.data[5]! + 1e-6);
    expect(logicalDigests(r, { actor: changed }, { actor: one }).actor).not.toBe(want);
  });

  it('counts what a restore sends: weights, and both moments where the optimizer has them', () => {
    const base = single();
    const weights = base[0]!.tensors.reduce((n, t) => n + t.data.byteLength, 0);
    expect(setBytes({ actor: base })).toBe(3 * weights);
    expect(setBytes({ actor: [{ tensors: base[0]!.tensors }] })).toBe(weights);
    // Nothing is sent to a rank a device kept with the snapshot's state.
    expect(setBytes({ actor: [...base, ...base] }, { actor: new Map([[1, { held: true as const, parameters: 0 }]]) })).toBe(3 * weights);
    // Replicas send again what they hold alike.
    expect(setBytes({ actor: reshard(spec, 'actor', one, base, { devices: [0, 1], dp: 2, tp: 1, pp: 1 }) })).toBe(6 * weights);
  });
});
