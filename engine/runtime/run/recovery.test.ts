// How a recovery or a migration brings each rank back (restorePlan), from what the devices kept
// through their reset: held (nothing sent), moved onto the plan's layout in place (only the pieces
// it lacks), or restored whole — and the bytes that makes against the least a migration could send.
import { describe, expect, it } from 'vitest';
import { cut, planMigration, shardSlices, sliceShape, type Layout, type Slice } from '../../../mesh/parallel/index.ts';
import { stateDigest, type Checkpoint } from '../../../mesh/wire/index.ts';
import { modelInfo, parameterShapes, trains, type GptSpec } from '../../model/index.ts';
import { baseDigest } from '../../device/index.ts';
import { layoutOf, modelSpec, nodeOf, ownerOf, runSpec, type RunSpec } from './run.ts';
import { checkpointLayouts, keptModels, optimized, type CheckpointSet } from './setup.ts';
import { parseScenario, withPlan } from '../scenario/scenario.ts';
import { reshardToPlan } from '../store/reshard.ts';
import { FOUR_DEVICES, WITHOUT_DEVICE_3 } from './four-devices.fixture.ts';
import { checkpointBytes, restorePlan, setBytes, type KeptShards } from './recovery.ts';

const r = runSpec(parseScenario(`${FOUR_DEVICES}rl: { iterations: 4, batch: 8 }\n`, 'unit.yaml'));

/** Every kept model's ranks on `spec`'s layouts, cut from whole tensors that depend only on the model and name: replicas equal, halves of the same whole. */
function snapshotOn(spec: RunSpec): CheckpointSet {
  return Object.fromEntries(
    keptModels(spec).map((model) => {
      const layout = layoutOf(spec, ownerOf(spec, model));
      const info = modelInfo(modelSpec(spec, model) as GptSpec);
      const whole = (p: { name: string; shape: number[] }, salt: number) => {
        const full: Slice = { name: p.name, shape: p.shape, axis: null, start: 0, end: p.shape[0]! };
        const data = Float32Array.from({ length: p.shape.reduce((a, b) => a * b, 1) }, (_, i) => Math.sin(i + salt + model.length * 7 + p.name.length));
        return (s: Slice) => cut(data, full, s).slice();
      };
      const ranks = layout.devices.map((_, rank): Checkpoint => {
        const slices = shardSlices(info, layout, rank);
        const of = (salt: number) => slices.map((s) => whole(info.params.find((p) => p.name === s.name)!, salt)(s));
        const tensors = slices.map((s, i) => ({ name: s.name, shape: sliceShape(s), data: of(0)[i]! }));
        const m = of(1);
        const v = of(2);
        return {
          tensors,
          ...(optimized(spec, model) ? { optimizer: { step: 3, moments: slices.map((s, i) => ({ name: s.name, m: m[i]!, v: v[i]! })) } } : {}),
          ledger: [{ iteration: 0, rows: 8, sha256: 'ab'.repeat(32) }],
        };
      });
      return [model, ranks];
    }),
  );
}

/**
 * What each device reports keeping: every rank it holds on `layouts`, but those of `gone`, with the
 * state of `changed` (device → models) not the snapshot's; a model with adapters reports its base,
 * the snapshot's unless `rebased` (device → models) says it changed.
 */
function keptFrom(
  set: CheckpointSet,
  layouts: Record<string, Layout>,
  changed: Record<number, string[]> = {},
  gone: number[] = [],
  spec: RunSpec = r,
  rebased: Record<number, string[]> = {},
): KeptShards {
  const kept: KeptShards = new Map();
  for (const [model, ranks] of Object.entries(set)) {
    layouts[model]!.devices.forEach((device, rank) => {
      if (gone.includes(device)) return;
      const c = ranks[rank]!;
      const state = changed[device]?.includes(model) ? 'f'.repeat(64) : stateDigest({ tensors: c.tensors, optimizer: c.optimizer, ledger: c.ledger ?? [] });
      const base = rebased[device]?.includes(model) ? 'e'.repeat(64) : baseDigest(modelSpec(spec, model) as GptSpec, optimized(spec, model), c.tensors);
      const list = kept.get(device) ?? [];
      list.push({ model, layout: layouts[model]!, rank, state, parameters: c.tensors.reduce((n, t) => n + t.data.length, 0), ...(base ? { base } : {}) });
      kept.set(device, list);
    });
  }
  return kept;
}

const kinds = (plan: ReturnType<typeof restorePlan>, model: string, ranks: number) =>
  Array.from({ length: ranks }, (_, rank) => {
    const p = plan[model]?.get(rank);
    return p === undefined ? 'whole' : 'held' in p ? 'held' : `onto:${checkpointBytes(p.pieces)}`;
  });

describe('restorePlan', () => {
  it("a recovery in place: survivors' ranks are held, a replica that lost a rank is built afresh, the dead device's ranks are sent whole", () => {
    const set = snapshotOn(r);
    // Device 1's worker died: it kept nothing. Device 2's reference differs (it had moved on).
    const plan = restorePlan(r, { set, layouts: checkpointLayouts(r) }, set, keptFrom(set, checkpointLayouts(r), { 2: ['reference'] }, [1]));
    // The actor's replicas are one rank each: device 0's is held, device 1's sent whole.
    expect(kinds(plan, 'actor', 2)).toEqual(['held', 'whole']);
    // The critic's pipeline is one replica over devices 0-1: stage 0 is rebuilt in place (nothing sent), stage 1 sent whole.
    expect(kinds(plan, 'critic', 2)).toEqual(['onto:0', 'whole']);
    // The reference's tensor-parallel pair: device 2's half differs, so the replica is rebuilt; device 3's in place.
    expect(kinds(plan, 'reference', 2)).toEqual(['whole', 'onto:0']);
    const whole = setBytes(set);
    expect(setBytes(set, plan)).toBe(whole - checkpointBytes(set.actor![0]!) - checkpointBytes(set.reference![1]!) - checkpointBytes(set.critic![0]!));
  });

  it('a migration after a loss sends the least any migration could: what each rank lacks of what survivors hold, and what only the lost device held', () => {
    const set = snapshotOn(r);
    const layouts = checkpointLayouts(r);
    const after = runSpec(withPlan(r.scenario, { ...r.scenario.plan, ...WITHOUT_DEVICE_3 }));
    const { set: resharded } = reshardToPlan(after, set, layouts);
    const plan = restorePlan(after, { set, layouts }, resharded, keptFrom(set, layouts, {}, [3]));
    expect(kinds(plan, 'actor', 1)).toEqual(['onto:0']);
    let least = 0;
    for (const model of Object.keys(set)) {
      const m = planMigration(modelInfo(modelSpec(r, model) as GptSpec), layouts[model]!, layoutOf(after, ownerOf(after, model)), nodeOf(r), new Set([3]));
      least += (m.minimumBytes + m.snapshotBytes) * (optimized(r, model) ? 3 : 1);
    }
    expect(least).toBeGreaterThan(0);
    expect(setBytes(resharded, plan)).toBe(least);
    // Without what the devices kept, every rank goes whole: far more.
    expect(setBytes(resharded)).toBeGreaterThan(2 * least);
  });

  it("with adapters, a kept shard that went on past the snapshot moves in place where its base is the snapshot's, sent what trains whole; one whose base differs is sent whole", () => {
    const lora = runSpec(parseScenario(`${FOUR_DEVICES.replace('heads: 4 }', 'heads: 4, lora: { rank: 2, alpha: 4 } }')}rl: { iterations: 4, batch: 8 }\n`, 'lora.yaml'));
    const set = snapshotOn(lora);
    const layouts = checkpointLayouts(lora);
    const after = runSpec(withPlan(lora.scenario, { ...lora.scenario.plan, ...WITHOUT_DEVICE_3 }));
    const { set: resharded } = reshardToPlan(after, set, layouts);
    const spec = modelSpec(lora, 'actor') as GptSpec;
    const trained = (c: Checkpoint) => c.tensors.filter((t) => trains(spec, t.name)).reduce((n, t) => n + 3 * t.data.byteLength, 0);
    // Both actor replicas trained on (device 3 is lost): device 0's moves onto the new plan's one rank, sent what trains alone.
    const plan = restorePlan(after, { set, layouts }, resharded, keptFrom(set, layouts, { 0: ['actor', 'critic'], 1: ['actor', 'critic'] }, [3], lora));
    expect(kinds(plan, 'actor', 1)).toEqual([`onto:${trained(resharded.actor![0]!)}`]);
    expect(trained(resharded.actor![0]!)).toBeLessThan(checkpointBytes(resharded.actor![0]!) / 4);
    const onto = plan.actor!.get(0)!;
    expect('onto' in onto && onto.onto.stale).toEqual(parameterShapes(spec).flatMap(([name]) => (trains(spec, name) ? [name] : [])));
    // Its base changed too (never assumed): whole.
    const rebased = restorePlan(after, { set, layouts }, resharded, keptFrom(set, layouts, { 0: ['actor'], 1: ['actor'] }, [3], lora, { 0: ['actor'], 1: ['actor'] }));
    expect(kinds(rebased, 'actor', 1)).toEqual(['whole']);
  });

  it('trusts nothing that differs from the snapshot: a kept shard whose state changed is sent whole, on the old layout or the new', () => {
    const set = snapshotOn(r);
    const layouts = checkpointLayouts(r);
    const plan = restorePlan(r, { set, layouts }, set, keptFrom(set, layouts, { 0: ['actor', 'critic'], 1: ['actor'] }));
    expect(kinds(plan, 'actor', 2)).toEqual(['whole', 'whole']);
    // The critic's stage 1 is intact but its replica is not: rebuilt in place, nothing sent.
    expect(kinds(plan, 'critic', 2)).toEqual(['whole', 'onto:0']);
  });
});
