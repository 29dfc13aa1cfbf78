// Calls on meshes: one call on every rank of a layout, loading a model, moving weights between
// layouts by reallocation, and the views a call on another layout than its model's reads.
import { hasher, type CallBody, type CallOf, type ResultOf } from '../../../mesh/wire/index.ts';
import type { Dispatcher } from '../dispatch/dispatch.ts';
import type { Layout } from '../../../mesh/parallel/index.ts';
import { planRealloc } from '../../../mesh/parallel/index.ts';
import { modelInfo, parameterShapes, trains, type GptSpec } from '../../model/index.ts';
import type { CallName } from '../scenario/scenario.ts';
import { adapterOf, callDecl, checkpointOf, layoutOf, lossModulesOf, modelSpec, nodeOf, ownerOf, viewOf, type RunSpec } from './spec.ts';

/** Collective groups made by this process, so that each mesh call's group name is its own. */
let groups = 0;

/**
 * Runs one call on every rank of a layout at once (they exchange activations and sums among
 * themselves) and gathers the replies: arrays concatenated in rank order (only the ranks that
 * hold a replica's output return rows), losses summed, gradient norms the largest.
 */
export async function callMesh<F extends 'generate' | 'inference' | 'train' | 'sft' | 'manifest'>(
  d: Dispatcher,
  layout: Layout,
  model: string,
  iteration: number,
  body: CallOf<F>,
  /** The graph's call this is (it names the group, so the timeline can show it). */
  call?: CallName,
): Promise<ResultOf<F>> {
  const fn = (body as CallBody).fn;
  const group = `g${d.epoch}-${iteration < 0 ? 'setup' : iteration}-${call === undefined ? `${model.replace('@', '-')}-${fn}` : `[${call}]`}-${groups++}`;
  const outs = (await Promise.all(layout.devices.map((device) => d.call(device, model, iteration, body, group)))) as Array<Record<string, unknown>>;
  if (outs.length === 1) return outs[0] as ResultOf<F>;
  if (fn === 'manifest') {
    // Every rank keeps its own ledger: they are all given back, rank after rank.
    return {
      manifest: outs.flatMap((o) => o.manifest as unknown[]),
      digest: meshDigest(outs.map((o) => o.digest as string)),
      ledger: outs.flatMap((o) => o.ledger as unknown[]),
    } as ResultOf<F>;
  }
  const merged: Record<string, unknown> = {};
  for (const key of Object.keys(outs[0]!)) {
    const values = outs.map((o) => o[key]);
    if (values[0] instanceof Float32Array || values[0] instanceof Int32Array) {
      const arrays = values as Array<Float32Array | Int32Array>;
      const out = new (arrays[0]!.constructor as { new (n: number): Float32Array | Int32Array })(arrays.reduce((n, a) => n + a.length, 0));
      let at = 0;
      for (const a of arrays) {
        out.set(a, at);
        at += a.length;
      }
      merged[key] = out;
    } else if (Array.isArray(values[0])) {
      // Records (a generate call's episodes), replica after replica.
      merged[key] = (values as unknown[][]).flat();
    } else if (typeof values[0] === 'object' && values[0] !== null) {
      // A train call's statistics: each the sum of the ranks' shares (ranks that hold none give none).
      const sums: Record<string, number> = {};
      for (const v of values as Array<Record<string, number>>) for (const [k, x] of Object.entries(v)) sums[k] = (sums[k] ?? 0) + x;
      merged[key] = sums;
    } else {
      const nums = values as number[];
      merged[key] = key === 'grad_norm' ? Math.max(...nums) : nums.reduce((a, b) => a + b, 0);
    }
  }
  return merged as ResultOf<F>;
}

/** One digest for a model held by several ranks: the ranks' digests (as they are written, algorithm named), in rank order, hashed (BLAKE3). */
export function meshDigest(digests: readonly string[]): string {
  return digests.length === 1 ? digests[0]! : hasher().update(digests.join(',')).digest();
}

export interface Moved {
  seconds: number;
  bytes: number;
}

/** Moves `names` (all when absent) of one model's shard to another model's shard over the plan. */
export async function reallocate(
  d: Dispatcher,
  r: RunSpec,
  id: string,
  iteration: number,
  from: { model: string; layout: Layout },
  to: { model: string; layout: Layout },
  spec: GptSpec,
  names?: string[],
  targetSpec: GptSpec = spec,
  beside?: boolean,
): Promise<Moved> {
  const plan = planRealloc(modelInfo(spec), from.layout, to.layout, nodeOf(r), names, modelInfo(targetSpec));
  const out = await d.realloc({ id, iteration, from, to, plan, ...(beside ? { beside } : {}) });
  if (out.received_bytes !== plan.minimumBytes) {
    throw new Error(`reallocation ${id}: received ${out.received_bytes} bytes, the plan's minimum is ${plan.minimumBytes}`);
  }
  return { seconds: out.seconds, bytes: out.received_bytes };
}

type LoadOpts = { seed?: number; lr?: number; serve?: string; skip?: ReadonlySet<number>; beside?: boolean; base?: string };

/** Loads a model on every rank of `layout` (but the ranks in `opts.skip`, which hold it already); returns the parameters loaded. */
export async function loadModel(d: Dispatcher, r: RunSpec, name: string, role: string, layout: Layout, opts: LoadOpts, iteration = -1): Promise<number> {
  const results = await loadRanks(d, r, name, role, layout, opts, iteration);
  return results.reduce((n, x) => n + x.parameters, 0);
}

/** Each rank's answer to its load (a skipped rank's: nothing loaded). */
async function loadRanks(d: Dispatcher, r: RunSpec, name: string, role: string, layout: Layout, opts: LoadOpts, iteration: number): Promise<Array<{ parameters: number; base_kept?: boolean }>> {
  const s = r.scenario;
  return Promise.all(
    layout.devices.map((device, rank) =>
      opts.skip?.has(rank)
        ? { parameters: 0 }
        : d.call(
            device,
            name,
            iteration,
            {
              fn: 'load',
              role,
              spec: modelSpec(r, role),
              layout,
              rank,
              ...(opts.seed === undefined ? {} : { seed: opts.seed }),
              ...(opts.seed !== undefined && checkpointOf(r, name) !== undefined ? { from: checkpointOf(r, name) } : {}),
              ...(opts.seed !== undefined && adapterOf(r, name) !== undefined ? { adapter: adapterOf(r, name) } : {}),
              ...(opts.lr === undefined ? {} : { optim: { lr: opts.lr, beta1: 0.9, beta2: 0.999, eps: 1e-8, clipNorm: s.rl.clip_norm } }),
              ...(opts.lr === undefined ? {} : lossModulesOf(r, name)),
              ...(opts.serve === undefined ? {} : { serve: opts.serve }),
              ...(opts.base === undefined ? {} : { base: opts.base }),
            },
            undefined,
            { beside: opts.beside },
          ),
    ),
  );
}

/**
 * Fills the view a call needs from its owner, runs `body`, and releases the view. Calls on the
 * owner's layout run directly.
 */
export async function onLayout<T>(d: Dispatcher, r: RunSpec, call: CallName, iteration: number, body: (name: string, base: boolean) => Promise<T>): Promise<T & { moved?: Moved }> {
  const held = await holdView(d, r, call, iteration);
  try {
    return { ...(await body(held.name, held.base === true)), ...(held.moved ? { moved: held.moved } : {}) };
  } finally {
    await held.release();
  }
}

/**
 * Frees a view on every device of its layout; `beside`: next to whatever the devices run; `keep`:
 * each device keeps the view's frozen base under this digest of its owner's base (kept-bases.ts).
 */
export async function releaseView(d: Dispatcher, name: string, layout: Layout, iteration: number, beside = false, keep?: string): Promise<void> {
  await Promise.all(layout.devices.map((device) => d.call(device, name, iteration, { fn: 'release', ...(keep === undefined ? {} : { keep }) }, undefined, { beside })));
}

/**
 * The digest of a model's frozen base as its owner holds it (a model with adapters): its ranks'
 * base digests in rank order, hashed. Read before every fill of a view: a base is never assumed.
 */
export async function ownerBaseDigest(d: Dispatcher, r: RunSpec, model: string, iteration: number, beside = false): Promise<string> {
  const layout = layoutOf(r, ownerOf(r, model));
  const answers = await Promise.all(layout.devices.map((device) => d.call(device, model, iteration, { fn: 'manifest', base: true }, undefined, { beside })));
  return meshDigest(answers.map((a) => a.digest));
}

/** A call's view, loaded and filled once, for as many calls as need those weights. */
export interface HeldView {
  name: string;
  isView: boolean;
  /** The call reads `name`'s base: its adapters off (spec.ts's baseOwnerOf). */
  base?: boolean;
  moved?: Moved;
  release(): Promise<void>;
}

/**
 * Loads a call's view and moves its weights into it from the model's own layout, as they are
 * now; they stay, whatever later updates the model, until `release`. A call on its model's own
 * layout holds the model itself (nothing to move or release): what runs there sees each update.
 * `copy` 1: the view's second copy (`<view>~1`), filled while the first may still generate;
 * `beside`: its calls run beside whatever the devices run (engine/asynchrony/next-views.ts).
 */
export async function holdView(d: Dispatcher, r: RunSpec, call: CallName, iteration: number, o: { copy?: 0 | 1; beside?: boolean } = {}): Promise<HeldView> {
  const view = viewOf(r, call);
  const { isView } = view;
  if (!isView) return { name: view.name, isView, ...(view.base ? { base: true } : {}), release: async () => {} };
  const name = o.copy ? `${view.name}~${o.copy}` : view.name;
  const model = callDecl(r, call).model;
  const layout = layoutOf(r, call);
  const spec = modelSpec(r, model) as GptSpec;
  // With adapters, the view's devices keep its frozen base between fills: only what trains moves
  // when every rank still holds the base its owner holds now.
  const base = spec.lora ? await ownerBaseDigest(d, r, model, iteration, o.beside) : undefined;
  const release = () => releaseView(d, name, layout, iteration, false, base);
  const loaded = await loadRanks(d, r, name, model, layout, { beside: o.beside, ...(base === undefined ? {} : { base }) }, iteration);
  const names =
    base !== undefined && loaded.every((x) => x.base_kept === true)
      ? parameterShapes(spec)
          .map(([n]) => n)
          .filter((n) => trains(spec, n))
      : undefined;
  try {
    const moved = await reallocate(
      d,
      r,
      `it${iteration}-${name.replace(/[^A-Za-z0-9_-]/g, '-')}`,
      iteration,
      { model, layout: layoutOf(r, ownerOf(r, model)) },
      { model: name, layout },
      spec,
      names,
      spec,
      o.beside,
    );
    return { name, isView, moved, release };
  } catch (e) {
    await release().catch(() => {});
    throw e;
  }
}
