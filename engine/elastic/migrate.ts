// An elastic run's migration onto its new plan: the last snapshot, resharded onto the new layouts
// (every element copied, none computed), restored on the devices left — a rank a survivor holds
// with the snapshot's state is sent nothing, one it held on the old layout moves onto the new one
// in place and is sent only the pieces it lacks (recovery.ts's restorePlan) — then checked, model
// by model: the resharded ranks' logical tensors (each model's ranks joined into whole tensors) must
// equal the snapshot's, bit for bit, and each device's digest of the weights it holds must equal
// that of the rank it was sent — so the parameters right after the migration equal the snapshot's.
// The snapshot stays as it was taken (it records its layouts): a later recovery reshards it the same way.
import { layoutKey, planMigration } from '../../mesh/parallel/index.ts';
import { modelInfo, parameterShapes, trains, type GptSpec } from '../model/index.ts';
import { logicalDigests } from '../runtime/index.ts';
import { layoutOf, modelSpec, nodeOf, ownerOf, type RunSpec } from '../runtime/index.ts';
import { checkpointLayouts, optimized, type RestorePlan } from '../runtime/index.ts';
import { modelDigest } from '../../mesh/wire/index.ts';
import { restoreDevices, type RestoreInput, type SetupOutput } from '../runtime/index.ts';
import type { RunStore, Snapshot } from '../runtime/index.ts';

export class MigrationError extends Error {
  override name = 'MigrationError';
  readonly fatal = true;
}

export interface Migrated extends SetupOutput {
  snapshot: number;
  seconds: number;
  /** Bytes sent to the devices: the resharded snapshot's ranks but those a survivor held with the snapshot's state. */
  bytes: number;
  /** The snapshot's bytes not sent: ranks a survivor held with the snapshot's state. */
  keptBytes?: number;
  /** The least any migration could send: what each new rank lacks of what survivors hold, plus what only the lost held (optimizer moments counted). */
  minimumBytes: number;
  /** Models whose layout changed. */
  moved: string[];
  /** How each rank got there (recovery.ts's restorePlan): held, moved onto the new layout in place, else (absent) sent whole. */
  plan?: RestorePlan;
  /** Per model: the snapshot's logical digest and the devices' after the migration. */
  digests: Record<string, { before: string; after: string }>;
  equal: boolean;
}

/** The snapshot a migration goes from, with its models' logical digests (the "before" of its check). */
export interface SnapshotRead {
  loaded: Snapshot;
  before: Record<string, string>;
}

/**
 * Reads the snapshot after `snapshot` (from the devices' buckets) and computes its logical
 * digests: what a migration from the plan `from` needs before it can check anything, so the
 * supervisor does it while the plan is searched. Undefined where the store has no such snapshot.
 */
export async function readSnapshot(store: RunStore, snapshot: number, from: RunSpec): Promise<SnapshotRead | undefined> {
  const loaded = await store.loadSnapshot(snapshot);
  return loaded && { loaded, before: logicalDigests(from, loaded.set, loaded.layouts ?? checkpointLayouts(from)) };
}

/** Moves the run from `from` (its plan before) onto `input.r` (the new plan), without the `lost` devices. */
export async function migrateToPlan(
  input: RestoreInput & { from: RunSpec; lost: readonly number[]; snapshot: number /** The snapshot, read while the plan was searched. */; ahead?: Promise<SnapshotRead | undefined> },
): Promise<Migrated> {
  const t0 = performance.now();
  const { r, from } = input;
  // The snapshot as read while the plan was searched (else now, while the devices reset:
  // restoreDevices sends the resets first).
  const reading = input.ahead?.catch(() => readSnapshot(input.store, input.snapshot, from)) ?? readSnapshot(input.store, input.snapshot, from);
  const restoring = restoreDevices({ ...input, loaded: reading.then((x) => x?.loaded), digests: true });
  let read: SnapshotRead;
  let minimumBytes = 0;
  const moved: string[] = [];
  try {
    const found = await reading;
    if (!found) throw new MigrationError(`the run store has no snapshot after iteration ${input.snapshot} to migrate from`);
    read = found;
    // The least any migration could send, computed while the devices reset.
    const fromLayouts = read.loaded.layouts ?? checkpointLayouts(from);
    const lost = new Set(input.lost);
    for (const model of Object.keys(read.loaded.set)) {
      const a = fromLayouts[model]!;
      const b = layoutOf(r, ownerOf(r, model));
      if (layoutKey(a) !== layoutKey(b)) moved.push(model);
      const spec = modelSpec(r, model) as GptSpec;
      const least = (names?: readonly string[]) => {
        const plan = planMigration(modelInfo(spec), a, b, nodeOf(r), lost, names);
        return plan.minimumBytes + plan.snapshotBytes;
      };
      // What survivors lack that others left hold, plus what only the lost held (from the
      // snapshot): the weights, and both moments of what trains (a frozen base's are zeros).
      const weights = least();
      const trained = spec.lora ? parameterShapes(spec).flatMap(([name]) => (trains(spec, name) ? [name] : [])) : undefined;
      minimumBytes += weights + (optimized(r, model) ? 2 * (trained ? least(trained) : weights) : 0);
    }
  } finally {
    // Awaited whatever happens here: its failure is the caller's, never an unhandled rejection.
    await restoring.catch(() => {});
  }
  const out = await restoring;
  const { before } = read;
  // After: the resharded models' logical tensors (every element copied; a model not resharded is
  // the snapshot's own ranks; restoreDevices computed them while the devices reset), and each
  // device's own digest of what it holds now against the rank it was sent (its restore's answer
  // carries it: 64 characters a rank over the bus, not the state read back). A rank a device held
  // through the reset was proven equal to the snapshot's by its state digest, and nothing ran on it since.
  const restored = out.restored ?? {};
  const afterDigests = { ...before, ...(out.logical ?? {}) };
  const held = Object.entries(restored).flatMap(([model, ranks]) =>
    layoutOf(r, ownerOf(r, model)).devices.map((device, rank) => {
      const p = out.plan?.[model]?.get(rank);
      if (p && 'held' in p) return undefined;
      const digest = out.rankDigests?.[model]?.get(rank);
      if (digest === undefined) return `'${model}' rank ${rank} on device ${device} did not say what it holds after its restore`;
      return digest === modelDigest(ranks[rank]!.tensors) ? undefined : `'${model}' rank ${rank} on device ${device} holds other weights than it was sent`;
    }),
  );
  const digests = Object.fromEntries(Object.keys(before).map((m) => [m, { before: before[m]!, after: afterDigests[m] ?? '' }]));
  const unequal = Object.entries(digests)
    .filter(([, x]) => x.before !== x.after)
    .map(([m, x]) => `'${m}' ${x.before.slice(0, 12)} before, ${x.after.slice(0, 12)} after`);
  const problems = [...unequal, ...held.filter((x): x is string => x !== undefined)];
  const equal = problems.length === 0;
  if (!equal) throw new MigrationError(`the parameters after the migration differ from the snapshot's: ${problems.join('; ')}`);
  return { ...out, snapshot: input.snapshot, seconds: (performance.now() - t0) / 1000, bytes: out.bytes ?? 0, minimumBytes, moved, digests, equal };
}
