// Putting every device of the plan back to a snapshot: reset them all (whatever they were
// running), keeping the shards whose state equals the snapshot's (a survivor that had not moved
// past it), then load and restore the rest. On the plan the snapshot was taken on, the devices
// reload their ranks from the snapshot's objects themselves (the supervisor reads the manifest
// alone); a snapshot taken on another layout (before an elastic re-plan) is read here and
// resharded onto the plan; with no snapshot yet, the models are set up again, from the
// checkpoint a resumed run started from, else from scratch.
import type { Demonstrate } from '../../environments/index.ts';
import { CallError, type Dispatcher } from '../dispatch/dispatch.ts';
import { cut, layoutKey, pieceName, rankCoords, relaidSlices, sliceShape, type RelaidSlice } from '../../../mesh/parallel/index.ts';
import { logicalDigests, reshardToPlan } from '../store/reshard.ts';
import type { RunStore, Snapshot } from '../store/store.ts';
import { baseOwnerOf, layoutOf, learnedReward, loadModel, modelSpec, ownerOf, type RunSpec } from './run.ts';
import { allSettled, checkpointLayouts, keptModels, lrOf, optimized, setupModels, snapshotInto, type CheckpointSet, type RankRestore, type RestorePlan } from './setup.ts';
import { SnapshotError, rankObjects } from '../store/snapshots.ts';
import { ProtocolError, stateDigest, type Checkpoint, type ResultOf, type SnapshotManifest } from '../../../mesh/wire/index.ts';
import { modelInfo, parameterShapes, trains, type GptSpec } from '../../model/index.ts';
import { baseDigest } from '../../device/index.ts';

export interface RestoreInput {
  d: Dispatcher;
  r: RunSpec;
  store: RunStore;
  devices: number[];
  /** The iteration after which the snapshot to go back to was taken; undefined: none yet. */
  snapshot?: number;
  resume?: { iteration: number; checkpoint: CheckpointSet };
  demonstrate?: Demonstrate;
  /** The snapshot, when the caller reads it already (it may still be coming). */
  loaded?: Promise<Snapshot | undefined>;
  /** Where a recovery says what it did that its result does not (a snapshot it could not restore). */
  say?: (line: string) => void;
  /**
   * Whether a restore from a resharded snapshot is to be checked: each rank sent a restore answers
   * with the digest of the weights it holds then (setupModels' `rankDigests`), and the resharded
   * models' logical digests are computed while the devices reset (`logical`).
   */
  digests?: boolean;
}

export type SetupOutput = Awaited<ReturnType<typeof setupModels>>;

/** What a device kept through a reset: per model, where it is, its state's digest and parameter count. */
export type KeptShards = Map<number, ResultOf<'reset'>['kept']>;

/** How long a reset waits for calls abandoned on shards it would keep to end (one blocked on a collective ends at once). */
const BUSY_MS = 2000;

/**
 * Waits (up to timeouts.recover_seconds) for each device to answer a reset: one that has just
 * reconnected may not be subscribed yet. `keep`: the models each device is to keep where it holds
 * them; a shard an abandoned call still runs on is asked about again (the same epoch) for up to
 * BUSY_MS, then dropped. Returns, per device, the shards it kept.
 */
export async function resetDevices(d: Dispatcher, r: RunSpec, devices: readonly number[], keep: ReadonlyMap<number, readonly string[]> = new Map()): Promise<KeptShards> {
  const deadline = Date.now() + r.scenario.timeouts.recover_seconds * 1000;
  const reset = async (device: number, k: readonly string[]): Promise<ResultOf<'reset'>> => {
    try {
      return await d.call(device, '*', -1, { fn: 'reset', epoch: d.epoch, ...(k.length ? { keep: [...k] } : {}) });
    } catch (e) {
      if (!(e instanceof CallError && (e.code === 'unreachable' || e.code === 'timeout')) || Date.now() > deadline) throw e;
      await new Promise((res) => setTimeout(res, 250));
      return reset(device, k);
    }
  };
  const settled = async (device: number): Promise<ResultOf<'reset'>['kept']> => {
    const k = keep.get(device) ?? [];
    const until = Date.now() + BUSY_MS;
    let out = await reset(device, k);
    while (out.busy.length && Date.now() < until) {
      await new Promise((res) => setTimeout(res, 50));
      out = await reset(device, k);
    }
    // Still busy: dropped, and restored whole.
    if (out.busy.length)
      out = await reset(
        device,
        k.filter((m) => !out.busy.includes(m)),
      );
    return out.kept;
  };
  return new Map(await Promise.all(devices.map(async (device) => [device, await settled(device)] as const)));
}

/**
 * How each rank of the plan comes back to the snapshot, from what the devices kept through their
 * reset (each proven by its state digest to equal the snapshot's rank it held):
 * - held: a device holds the rank as the plan has it, with the snapshot's state: nothing is sent.
 *   A data-parallel replica is held whole or not at all: its ranks see the same calls and keep
 *   state in step (a tied head's copy on the last stage is sent again when the first stage's
 *   weights are replaced);
 * - onto: a device holds a rank of the snapshot's layout (or the plan's, in a replica not held
 *   whole): it moves onto the plan's rank in place, sent only the pieces of it that it lacks. A
 *   shard with adapters that went on past the snapshot, its frozen base the snapshot's (`base` in
 *   the reset's answer against the snapshot rank's, both baseDigest), moves so too, sent what
 *   trains whole (`stale`);
 * - neither (absent): loaded and sent whole.
 */
export function restorePlan(r: RunSpec, snapshot: Snapshot, set: CheckpointSet, kept: KeptShards): RestorePlan {
  const plan: Record<string, Map<number, RankRestore>> = {};
  for (const [model, ranks] of Object.entries(set)) {
    const layout = layoutOf(r, ownerOf(r, model));
    const taken = snapshot.layouts?.[model] ?? layout;
    const spec = modelSpec(r, model) as GptSpec;
    // The digest of a rank of the snapshot, as its device computed it when it wrote it (else here).
    const digests = snapshot.states?.[model];
    const takenDigest = (rank: number) => digests?.[rank] ?? stateDigest(snapshot.set[model]![rank]!);
    const planDigest = (rank: number) => (layoutKey(taken) === layoutKey(layout) ? takenDigest(rank) : stateDigest(ranks[rank]!));
    // Of a model with adapters, the digest of a snapshot rank's frozen base (hashed here once, where a shard kept one to compare).
    const bases = new Map<number, string | undefined>();
    const takenBase = (rank: number) => {
      if (!bases.has(rank)) bases.set(rank, baseDigest(spec, optimized(r, model), snapshot.set[model]![rank]!.tensors));
      return bases.get(rank);
    };
    const found = layout.devices.map((device, rank) => {
      const k = kept.get(device)?.find((x) => x.model === model);
      if (!k) return undefined;
      const here = layoutKey(k.layout) === layoutKey(layout) && k.rank === rank;
      if (here && k.state === planDigest(rank)) return { here, k, stale: false };
      // A served reward model is restored whole (its server holds the shard).
      if (learnedReward(r, model) || layoutKey(k.layout) !== layoutKey(taken)) return undefined;
      if (k.state === takenDigest(k.rank)) return { here: false, k, stale: false };
      // A shard with adapters that went on past the snapshot, its frozen base the snapshot's: what
      // trains is sent whole, the base moves in place.
      return k.base !== undefined && k.base === takenBase(k.rank) ? { here: false, k, stale: true } : undefined;
    });
    const trained = parameterShapes(spec)
      .map(([name]) => name)
      .filter((name) => trains(spec, name));
    layout.devices.forEach((_, rank) => {
      const f = found[rank];
      if (!f) return;
      const replica = rankCoords(layout, rank).dp;
      const whole = layout.devices.every((_d, other) => rankCoords(layout, other).dp !== replica || found[other]?.here);
      const parameters = ranks[rank]!.tensors.reduce((n, t) => n + t.data.length, 0);
      const to = plan[model] ?? (plan[model] = new Map());
      if (whole) to.set(rank, { held: true, parameters });
      else {
        const stale = f.stale ? new Set(trained) : new Set<string>();
        const pieces = piecesOf(
          ranks[rank]!,
          relaidSlices(modelInfo(spec), f.k, { layout, rank }, (name) => stale.has(name)),
          (name) => trains(spec, name),
        );
        to.set(rank, { onto: { layout, rank, ...(f.stale ? { stale: trained } : {}) }, pieces, parameters });
      }
    });
  }
  return plan;
}

/**
 * The pieces of a rank's checkpoint that a device moving onto it lacks (named as relaid.ts names
 * them), with the step and ledger; moments only of what `trains` (a frozen base's are zeros, as a
 * snapshot holds them, and the device makes them so).
 */
export function piecesOf(c: Checkpoint, slices: readonly RelaidSlice[], trains: (name: string) => boolean = () => true): Checkpoint {
  const byName = new Map(c.tensors.map((t) => [t.name, t.data]));
  const moments = new Map((c.optimizer?.moments ?? []).map((m) => [m.name, m]));
  const missing = slices.flatMap((sl) => sl.missing.map((p) => ({ sl, p })));
  return {
    tensors: missing.map(({ sl, p }) => ({ name: pieceName(p), shape: sliceShape(p), data: cut(byName.get(sl.slice.name)!, sl.slice, p).slice() })),
    ...(c.optimizer
      ? {
          optimizer: {
            step: c.optimizer.step,
            moments: missing
              .filter(({ sl }) => trains(sl.slice.name))
              .map(({ sl, p }) => {
                // A parameter never stepped has zero moments (as a device's checkpoint and the state digest hold it).
                const zeros = () => new Float32Array(byName.get(sl.slice.name)!.length);
                const m = moments.get(sl.slice.name);
                return { name: pieceName(p), m: cut(m?.m ?? zeros(), sl.slice, p).slice(), v: cut(m?.v ?? zeros(), sl.slice, p).slice() };
              }),
          },
        }
      : {}),
    ledger: c.ledger ?? [],
  };
}

/** Bytes a checkpoint's restore sends: weights, and the optimizer's two moments where it has them. */
export function checkpointBytes(c: Checkpoint): number {
  let n = 0;
  for (const t of c.tensors) n += t.data.byteLength;
  for (const m of c.optimizer?.moments ?? []) n += m.m.byteLength + m.v.byteLength;
  return n;
}

/** Bytes a restore of `set` sends under `plan`: nothing to a held rank, the pieces a rank moved in place lacks, every other rank whole. */
export function setBytes(set: CheckpointSet, plan: RestorePlan = {}): number {
  let n = 0;
  for (const [model, shards] of Object.entries(set)) {
    for (const [rank, c] of shards.entries()) {
      const p = plan[model]?.get(rank);
      n += p === undefined ? checkpointBytes(c) : 'held' in p ? 0 : checkpointBytes(p.pieces);
    }
  }
  return n;
}

/** The checkpointed models the plan puts on each device: what a reset before a restore may keep. */
function plannedModels(r: RunSpec, devices: readonly number[]): Map<number, string[]> {
  const keep = new Map<number, string[]>(devices.map((x) => [x, []]));
  for (const model of keptModels(r)) for (const device of layoutOf(r, ownerOf(r, model)).devices) keep.get(device)?.push(model);
  return keep;
}

/**
 * Resets `devices` keeping every shard the plan `r` put on them: what a re-plan sends as soon as a
 * device is lost, so that the calls abandoned there (and their collectives) end while the new plan
 * is searched; the migration's own reset then only drops what the new plan does not keep there.
 */
export function resetKeepingShards(d: Dispatcher, r: RunSpec, devices: readonly number[]): Promise<KeptShards> {
  return resetDevices(d, r, devices, plannedModels(r, devices));
}

/**
 * A recovery onto the plan the snapshot was taken on: each rank a device kept with the snapshot's
 * state (its digest equal to the manifest's) stays as it is, a data-parallel replica whole or not
 * at all (restorePlan's rule); every other rank reloads its state itself from the snapshot's
 * object (`reload`), all at once — onto the shard its device kept of it, else loaded first.
 * Nothing of the state passes through this process. `bytes`: what the devices read; `keptBytes`:
 * the held ranks' objects and the bases the reloaded shards still held.
 */
async function reloadInPlace(d: Dispatcher, r: RunSpec, m: SnapshotManifest, kept: KeptShards): Promise<SetupOutput & { plan: RestorePlan; bytes: number; keptBytes: number }> {
  const plan: Record<string, Map<number, RankRestore>> = {};
  const parameters: Record<string, number> = {};
  const keptNames = new Set(keptModels(r));
  let bytes = 0;
  let keptBytes = 0;
  // Every call settles before a failure is thrown: a recovery that goes on to another snapshot
  // (restoreDevices) must not meet a reload of this one still arriving at a device.
  await allSettled(
    r.graph.models.map(async ({ name }) => {
      const layout = layoutOf(r, ownerOf(r, name));
      const serve = learnedReward(r, name) ? r.rewardService : undefined;
      // A model that is its policy's base is the policy's shards, restored with it.
      if (baseOwnerOf(r, name) !== undefined) return;
      if (!keptNames.has(name)) {
        parameters[name] = await loadModel(d, r, name, name, layout, { lr: lrOf(r, name), serve });
        return;
      }
      const objects = rankObjects(m, name);
      if (objects.length !== layout.devices.length)
        throw new SnapshotError(`the snapshot after iteration ${m.iteration} has ${objects.length} rank(s) of '${name}'; its layout has ${layout.devices.length}`);
      // The shard each device kept where the plan has this rank, whatever its state.
      const here = layout.devices.map((device, rank) => kept.get(device)?.find((k) => k.model === name && k.rank === rank && layoutKey(k.layout) === layoutKey(layout)));
      const equal = here.map((k, rank) => (k?.state === objects[rank]!.state ? k : undefined));
      const held = new Map<number, RankRestore>();
      layout.devices.forEach((_, rank) => {
        const replica = rankCoords(layout, rank).dp;
        const whole = layout.devices.every((_d, other) => rankCoords(layout, other).dp !== replica || equal[other]);
        if (whole) held.set(rank, { held: true, parameters: equal[rank]!.parameters });
      });
      plan[name] = held;
      // Any other rank kept in place (it went on past the snapshot, or its replica was not held
      // whole) reloads onto the shard it holds instead of a fresh one: with adapters, the frozen
      // base it still holds — its digest checked on the device — is not read again. A served
      // reward model is loaded again (its server holds the shard).
      const onto = new Set(layout.devices.flatMap((_, rank) => (!held.has(rank) && here[rank] && !serve ? [rank] : [])));
      const loaded = await loadModel(d, r, name, name, layout, { lr: lrOf(r, name), serve, skip: new Set([...held.keys(), ...onto]) });
      parameters[name] = loaded + [...held.values()].reduce((n, x) => n + x.parameters, 0) + [...onto].reduce((n, rank) => n + here[rank]!.parameters, 0);
      await allSettled(
        layout.devices.map(async (device, rank) => {
          if (held.has(rank)) {
            keptBytes += objects[rank]!.bytes;
            return;
          }
          const got = await d.call(device, name, -1, { fn: 'reload', object: objects[rank]!, optimizer: optimized(r, name) });
          bytes += got.bytes;
          keptBytes += got.base_kept_bytes ?? 0;
        }),
      );
    }),
  );
  return { parameters, plan, bytes, keptBytes };
}

/**
 * Every device back to a snapshot; returns what setup returns, the snapshot gone back to, what
 * the devices hold of it now (`restored`, where this process read it), and how each rank got there
 * (`plan`). `bytes`: what was restored; `keptBytes`: what a whole restore would have restored
 * beyond that; `viaSupervisor`: of `bytes`, what went through this process.
 */
export async function restoreDevices(
  input: RestoreInput,
): Promise<
  SetupOutput & { snapshot: number; restored?: CheckpointSet; plan?: RestorePlan; resharded?: string[]; logical?: Record<string, string>; bytes?: number; keptBytes?: number; viaSupervisor?: number }
> {
  const { d, r, store } = input;
  if (input.snapshot === undefined) {
    await resetDevices(d, r, input.devices);
    const after = input.resume?.iteration ?? -1;
    const out = await setupModels(d, r, input.resume?.checkpoint, input.demonstrate);
    await snapshotInto(d, r, store, after);
    return { ...out, snapshot: after, resharded: [] };
  }
  try {
    return await backTo(input, input.snapshot);
  } catch (e) {
    // A snapshot that cannot be read back whole (an object changed, missing, or not the rank the
    // manifest says): the recovery goes back to the one before it, which the store keeps, and the
    // iterations since are run again (their rollouts and scores are in the stream). Not for a
    // migration, whose caller read the snapshot itself.
    if (input.loaded || !(e instanceof SnapshotError || e instanceof ProtocolError || (e instanceof CallError && e.code === 'digest_mismatch'))) throw e;
    const before = await store.previousSnapshot(input.snapshot);
    if (before === undefined) throw e;
    input.say?.(`the snapshot after iteration ${input.snapshot} cannot be restored (${e.message}): going back to the one after iteration ${before}`);
    return restoreDevices({ ...input, snapshot: before });
  }
}

/** restoreDevices onto the snapshot after `snapshot` (there is one). */
async function backTo(input: RestoreInput, snapshot: number): ReturnType<typeof restoreDevices> {
  const { d, r, store } = input;
  // The snapshot (its manifest, for a recovery in place) is read while the devices reset.
  const manifest = input.loaded ? undefined : store.loadManifest(snapshot);
  manifest?.catch(() => {}); // a failed reset is what the caller hears of first
  const resetting = resetDevices(d, r, input.devices, plannedModels(r, input.devices));
  if (manifest) {
    const kept = await resetting;
    const m = await manifest;
    if (m && keptModels(r).every((model) => m.layouts[model] && layoutKey(m.layouts[model]) === layoutKey(layoutOf(r, ownerOf(r, model))))) {
      return { ...(await reloadInPlace(d, r, m, kept)), snapshot, resharded: [], viaSupervisor: 0 };
    }
  }
  // Resharded here (and, to be checked, its logical digests computed) while the devices' resets
  // are answered; a failure here is thrown once they are (a failed reset is heard of first).
  const prepared = (async () => {
    const found = await (input.loaded ?? store.loadSnapshot(snapshot));
    if (!found) throw new SnapshotError(`the run store has no snapshot after iteration ${snapshot} to recover from`);
    const { set, resharded } = reshardToPlan(r, found.set, found.layouts);
    const logical = input.digests ? logicalDigests(r, Object.fromEntries(resharded.map((m) => [m, set[m]!])), checkpointLayouts(r)) : undefined;
    return { found, set, resharded, logical };
  })();
  let ready: Awaited<typeof prepared>;
  try {
    ready = await prepared;
  } catch (e) {
    await resetting;
    throw e;
  }
  const { found, set, resharded, logical } = ready;
  const plan = restorePlan(r, found, set, await resetting);
  const out = await setupModels(d, r, set, undefined, plan, { digests: input.digests });
  const bytes = setBytes(set, plan);
  // All of it read into this process and streamed from here.
  return { ...out, snapshot, restored: set, plan, resharded, ...(logical ? { logical } : {}), bytes, keptBytes: setBytes(set) - bytes, viaSupervisor: bytes };
}
