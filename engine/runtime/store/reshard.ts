// A checkpoint taken on one layout, put onto another: each model's ranks joined into whole tensors
// (weights, and the optimizer's two moments, which are elementwise and so slice as the weights
// do), then cut as the new layout's ranks hold them. Every element is copied, never computed, so
// the logical tensors after are the ones before, bit for bit. What a resumed run needs when it
// goes on with another plan (`--resume RUN_DIR --plan PLAN.yaml`), and what a re-planned run will
// restore from its snapshot.
import { cut, layoutKey, paste, shardSlices, sliceShape, type Layout } from '../../../mesh/parallel/index.ts';
import { modelDigest, type Checkpoint, type LedgerEntry, type NamedTensor } from '../../../mesh/wire/index.ts';
import { modelInfo, type GptSpec } from '../../model/index.ts';
import type { CheckpointSet } from '../run/setup.ts';
import { layoutOf, modelSpec, ownerOf, type RunSpec } from '../run/run.ts';

export class ReshardError extends Error {
  override name = 'ReshardError';
}

type Whole = Map<string, Float32Array>;

/** One field of every rank (weights, first or second moment) joined into whole tensors. */
function join(
  spec: GptSpec,
  layout: Layout,
  shards: readonly Checkpoint[],
  model: string,
  field: (c: Checkpoint) => ReadonlyArray<{ name: string; shape?: number[]; data: Float32Array }>,
  what: string,
): Whole {
  const info = modelInfo(spec);
  const whole: Whole = new Map(info.params.map((p) => [p.name, new Float32Array(p.shape.reduce((a, b) => a * b, 1))]));
  const filled = new Map<string, number>();
  shards.forEach((shard, rank) => {
    const slices = new Map(shardSlices(info, layout, rank).map((s) => [s.name, s]));
    for (const t of field(shard)) {
      const s = slices.get(t.name);
      const w = whole.get(t.name);
      if (!s || !w) throw new ReshardError(`'${model}': rank ${rank} of the checkpoint holds ${what} '${t.name}', which its layout does not give it`);
      const shape = sliceShape(s);
      if (t.data.length !== shape.reduce((a, b) => a * b, 1) || (t.shape && t.shape.join('x') !== shape.join('x'))) {
        throw new ReshardError(`'${model}': rank ${rank}'s ${what} '${t.name}' is [${t.shape ?? t.data.length}]; its layout gives it [${shape}]`);
      }
      paste(w, { ...s, axis: null, start: 0, end: s.shape[0]! }, s, t.data);
      filled.set(t.name, (filled.get(t.name) ?? 0) + t.data.length);
    }
  });
  for (const p of info.params) {
    // Replicated slices repeat on every tensor or data-parallel rank: at least the whole must be there.
    if ((filled.get(p.name) ?? 0) < whole.get(p.name)!.length) throw new ReshardError(`'${model}': the checkpoint's ranks do not cover ${what} '${p.name}'`);
  }
  return whole;
}

/** A model's whole weights from the ranks of a checkpoint taken on `layout`, in the canonical order. */
export function wholeTensors(spec: GptSpec, layout: Layout, shards: readonly Checkpoint[], model = 'the model'): NamedTensor[] {
  if (shards.length !== layout.devices.length) throw new ReshardError(`'${model}': the checkpoint holds ${shards.length} rank(s); its layout has ${layout.devices.length}`);
  const whole = join(spec, layout, shards, model, (c) => c.tensors, 'weight');
  return modelInfo(spec).params.map((p) => ({ name: p.name, shape: p.shape, data: whole.get(p.name)! }));
}

/** The slices of whole tensors that rank `rank` of `layout` holds, in its own order. */
function split(spec: GptSpec, layout: Layout, rank: number, whole: Whole): Array<{ name: string; shape: number[]; data: Float32Array }> {
  return shardSlices(modelInfo(spec), layout, rank).map((s) => ({
    name: s.name,
    shape: sliceShape(s),
    data: cut(whole.get(s.name)!, { ...s, axis: null, start: 0, end: s.shape[0]! }, s).slice(),
  }));
}

/**
 * Why a model's checkpoint ranks do not fit `layout`, or undefined: each rank must hold exactly the
 * weights its rank of the layout holds, in their shapes. Checked before anything is sent, so a
 * checkpoint taken on another layout is refused by name instead of failing chunk by chunk.
 */
export function shardsProblem(spec: GptSpec, model: string, layout: Layout, shards: readonly Checkpoint[]): string | undefined {
  if (shards.length !== layout.devices.length) return `the checkpoint holds ${shards.length} rank(s) of '${model}'; the plan gives it ${layout.devices.length}`;
  const info = modelInfo(spec);
  for (const [rank, shard] of shards.entries()) {
    const want = new Map(shardSlices(info, layout, rank).map((s) => [s.name, sliceShape(s)]));
    for (const t of shard.tensors) {
      const shape = want.get(t.name);
      if (!shape) return `rank ${rank} of the checkpoint of '${model}' holds '${t.name}', which rank ${rank} of the plan's layout does not`;
      if (shape.join('x') !== t.shape.join('x'))
        return `rank ${rank} of the checkpoint of '${model}' holds '${t.name}' as [${t.shape}]; the plan's layout gives that rank [${shape}] (a checkpoint taken on another layout, which it does not record)`;
      want.delete(t.name);
    }
    if (want.size) return `rank ${rank} of the checkpoint of '${model}' lacks ${[...want.keys()].map((n) => `'${n}'`).join(', ')}`;
  }
  return undefined;
}

const sameLedger = (a: readonly LedgerEntry[] | undefined, b: readonly LedgerEntry[] | undefined) => JSON.stringify(a ?? []) === JSON.stringify(b ?? []);

/**
 * One model's ranks, taken on layout `from`, as the ranks of layout `to` would hold the same
 * state: weights, optimizer moments (and its step) and the ledger, which every rank keeps alike.
 */
export function reshard(spec: GptSpec, model: string, from: Layout, shards: readonly Checkpoint[], to: Layout): Checkpoint[] {
  if (shards.length !== from.devices.length) throw new ReshardError(`'${model}': the checkpoint holds ${shards.length} rank(s); the layout it was taken on has ${from.devices.length}`);
  if (layoutKey(from) === layoutKey(to)) return [...shards];
  const first = shards[0]!;
  shards.forEach((s, rank) => {
    if (!sameLedger(s.ledger, first.ledger)) throw new ReshardError(`'${model}': ranks 0 and ${rank} of the checkpoint trained on different rollouts (their ledgers differ)`);
    if ((s.optimizer === undefined) !== (first.optimizer === undefined) || (s.optimizer && s.optimizer.step !== first.optimizer!.step)) {
      throw new ReshardError(`'${model}': ranks 0 and ${rank} of the checkpoint hold different optimizer states`);
    }
  });
  const weights = join(spec, from, shards, model, (c) => c.tensors, 'weight');
  const moments = first.optimizer && {
    m: join(spec, from, shards, model, (c) => c.optimizer!.moments.map((x) => ({ name: x.name, data: x.m })), 'first moment'),
    v: join(spec, from, shards, model, (c) => c.optimizer!.moments.map((x) => ({ name: x.name, data: x.v })), 'second moment'),
  };
  return to.devices.map((_, rank) => {
    const tensors = split(spec, to, rank, weights);
    const out: Checkpoint = { tensors };
    if (moments) {
      const m = split(spec, to, rank, moments.m);
      const v = split(spec, to, rank, moments.v);
      out.optimizer = { step: first.optimizer!.step, moments: m.map((t, i) => ({ name: t.name, m: t.data, v: v[i]!.data })) };
    }
    if (first.ledger) out.ledger = first.ledger.map((e) => ({ ...e }));
    return out;
  });
}

/**
 * A run's checkpoint put onto the run's own plan: each model taken on another layout (`layouts`,
 * as the checkpoint recorded them) resharded, and named in `resharded`; a checkpoint that recorded
 * none is taken as it is.
 */
export function reshardToPlan(r: RunSpec, set: CheckpointSet, layouts: Readonly<Record<string, Layout>> | undefined): { set: CheckpointSet; resharded: string[] } {
  const resharded: string[] = [];
  const out = Object.fromEntries(
    Object.entries(set).map(([model, shards]) => {
      const from = layouts?.[model];
      if (!from || !r.graph.models.some((m) => m.name === model)) return [model, shards];
      const to = layoutOf(r, ownerOf(r, model));
      if (layoutKey(from) === layoutKey(to)) return [model, shards];
      resharded.push(model);
      return [model, reshard(modelSpec(r, model) as GptSpec, model, from, shards, to)];
    }),
  );
  return { set: out, resharded };
}

/** Each model's weights as whole tensors, hashed in the canonical order (names, shapes, bytes): equal on any layout for the same parameters. */
export function logicalDigests(r: RunSpec, set: CheckpointSet, layouts: Readonly<Record<string, Layout>>): Record<string, string> {
  return Object.fromEntries(Object.entries(set).map(([model, shards]) => [model, modelDigest(wholeTensors(modelSpec(r, model) as GptSpec, layouts[model]!, shards, model))]));
}
