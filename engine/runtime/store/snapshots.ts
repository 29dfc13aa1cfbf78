// Snapshots as the devices write them: each rank's state is one object in its device's own
// bucket (mesh/wire/transfer/shelf.ts), written by the device in parallel with the others; the supervisor
// keeps only the manifest (which device wrote which rank, its size, digest and state digest).
// Reading a snapshot back fetches each object named there and checks it against the manifest:
// its digest (in the algorithm the manifest names), and that it holds the model, rank, layout and
// iteration the manifest says.
import { ObjectError, ProtocolError, ShardObject, decode, digestMismatch, shortDigest, type Checkpoint, type ShardEntry, type Shelf, type SnapshotManifest } from '../../../mesh/wire/index.ts';
import { layoutKey } from '../../../mesh/parallel/index.ts';
import type { Snapshot } from './store.ts';
import { wholeCheckpoint } from '../../device/index.ts';
import { unpackReplicas } from './replicas.ts';

export class SnapshotError extends Error {
  override name = 'SnapshotError';
}

/**
 * The name of a rank's object in its device's bucket: the iteration it follows, and the recovery
 * epoch, so that a snapshot taken again after a recovery never overwrites one a manifest names.
 */
export const objectName = (iteration: number, epoch: number, model: string, rank: number): string => `s${iteration}-e${epoch}.${model}.r${rank}`;

/** Deletes, from one device's bucket, every snapshot object (objectName's) of an iteration before `cut`; other entries stay. */
export async function dropObjectsBefore(shelf: Shelf, device: number, cut: number): Promise<void> {
  for (const name of await shelf.names(device)) {
    const n = /^s(-?\d+)-e\d+\./.exec(name);
    if (n && Number(n[1]) < cut) await shelf.delete(device, name);
  }
}

/** Every object a manifest names, with the device whose bucket holds it. */
export function manifestObjects(m: SnapshotManifest): Array<{ model: string; device: number; object: string }> {
  return Object.entries(m.models).flatMap(([model, shards]) => shards.map((s) => ({ model, device: s.device, object: s.object })));
}

/** Each rank's object of a model in a manifest (data-parallel replicas share one). */
export function rankObjects(m: SnapshotManifest, model: string): ShardEntry[] {
  const shards = m.models[model] ?? [];
  return (m.replicas[model] ?? shards.map((_, i) => i)).map((i) => shards[i]!);
}

/** Bytes of state the devices wrote for a snapshot (each data-parallel replica once). */
export const manifestBytes = (m: SnapshotManifest): number => Object.values(m.models).reduce((n, shards) => n + shards.reduce((k, s) => k + s.bytes, 0), 0);

/**
 * The snapshot a manifest names, read object by object from the shelf (all at once) and checked:
 * an object missing, changed since it was written, or holding another rank is an error naming it.
 * `where` names the manifest.
 */
export async function readSnapshot(shelf: Pick<Shelf, 'get'>, m: SnapshotManifest, where: string): Promise<Snapshot> {
  const models = Object.fromEntries(
    await Promise.all(
      Object.entries(m.models).map(async ([model, shards]) => {
        const ranks = m.replicas[model] ?? shards.map((_, i) => i);
        const layout = m.layouts[model];
        if (!layout) throw new SnapshotError(`${where}: no layout for '${model}'`);
        const read = await Promise.all(
          shards.map(async (s, i): Promise<Checkpoint> => {
            const at = `${where}: '${model}' object ${JSON.stringify(s.object)} in device ${s.device}'s bucket`;
            let bytes: Uint8Array | undefined;
            try {
              bytes = await shelf.get(s.device, s.object);
            } catch (e) {
              if (e instanceof ObjectError) throw new SnapshotError(`${at}: ${e.message}`, { cause: e });
              throw e;
            }
            if (!bytes) throw new SnapshotError(`${at} is missing`);
            const actual = digestMismatch(bytes, s.digest);
            if (actual !== undefined) throw new SnapshotError(`${at} changed since it was written: its digest is ${shortDigest(actual)}, the manifest says ${shortDigest(s.digest)}`);
            let o: ShardObject;
            try {
              o = decode(at, bytes, ShardObject);
            } catch (e) {
              throw e instanceof ProtocolError ? new SnapshotError(e.message, { cause: e }) : e;
            }
            const rank = ranks.indexOf(i);
            const expected = `'${model}' rank ${rank} of layout [${layout.devices}] after iteration ${m.iteration}`;
            if (o.model !== model || o.rank !== rank || layoutKey(o.layout) !== layoutKey(layout) || o.iteration !== m.iteration)
              throw new SnapshotError(`${at}: expected ${expected}, got '${o.model}' rank ${o.rank} of layout [${o.layout.devices}] after iteration ${o.iteration}`);
            return wholeCheckpoint(
              (name) => shelf.get(s.device, name),
              o,
              at,
              (message) => new SnapshotError(message),
            );
          }),
        );
        return [model, read] as const;
      }),
    ),
  );
  const states = Object.fromEntries(Object.keys(m.models).map((model) => [model, rankObjects(m, model).map((o) => o.state)]));
  return { set: unpackReplicas(models, m.replicas, where), layouts: m.layouts, states };
}
