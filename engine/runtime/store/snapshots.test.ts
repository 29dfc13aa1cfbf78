// What a store keeps of snapshots the devices wrote: the two newest, whatever iterations they
// follow, and no object of an older one, named by a manifest or not.
import { describe, expect, it } from 'vitest';
import { createHash } from 'node:crypto';
import { encode, MemoryShelf, PROTOCOL_VERSION, type SnapshotManifest } from '../../../mesh/wire/index.ts';
import { MemoryStore } from './store.ts';
import { readSnapshot } from './snapshots.ts';

const one = { devices: [0], dp: 1, tp: 1, pp: 1 };

async function written(store: MemoryStore, iteration: number): Promise<SnapshotManifest> {
  const tensors = [{ name: 'w', shape: [1], data: Float32Array.of(iteration) }];
  const bytes = encode({ type: 'shard', v: PROTOCOL_VERSION, model: 'actor', layout: one, rank: 0, iteration, checkpoint: { tensors } });
  const object = `s${iteration}-e0.actor.r0`;
  const digest = await store.shelf.put(0, object, bytes);
  return { type: 'snapshot', v: PROTOCOL_VERSION, iteration, models: { actor: [{ device: 0, object, bytes: bytes.length, digest, state: 'x' }] }, replicas: { actor: [0] }, layouts: { actor: one } };
}

describe('snapshots in a store', () => {
  it('keeps the two newest (every other iteration too), drops every object of older ones, and says which one is before', async () => {
    const shelf = new MemoryShelf();
    const store = new MemoryStore(shelf);
    for (const i of [-1, 1, 3]) await store.saveSnapshot(await written(store, i));
    // A snapshot of iteration 3 that failed part-way under another epoch, and something that is not a snapshot's.
    await shelf.put(0, 's3-e9.actor.r0', Uint8Array.of(1));
    await shelf.put(0, 'notes', Uint8Array.of(2));
    expect(await store.loadSnapshot(-1)).toBeUndefined();
    expect((await store.loadSnapshot(1))!.set.actor![0]!.tensors[0]!.data).toEqual(Float32Array.of(1));
    expect(await store.previousSnapshot(3)).toBe(1);
    expect(await store.previousSnapshot(1)).toBeUndefined();
    await store.saveSnapshot(await written(store, 5));
    expect((await shelf.names(0)).sort()).toEqual(['notes', 's3-e0.actor.r0', 's3-e9.actor.r0', 's5-e0.actor.r0']);
    await store.saveSnapshot(await written(store, 7));
    expect((await shelf.names(0)).sort()).toEqual(['notes', 's5-e0.actor.r0', 's7-e0.actor.r0']);
    expect(await store.loadSnapshot(3)).toBeUndefined();
    expect(await store.previousSnapshot(7)).toBe(5);
  });

  it("checks each object in the algorithm its manifest's digest names: BLAKE3 as written, and a SHA-256 alone (protocol version 6's) still verifies", async () => {
    const store = new MemoryStore(new MemoryShelf());
    const m = await written(store, 2);
    expect(m.models.actor![0]!.digest).toMatch(/^blake3:[0-9a-f]{64}$/);
    expect((await readSnapshot(store.shelf, m, 'm')).set.actor![0]!.tensors[0]!.data).toEqual(Float32Array.of(2));
    // The same object named by its SHA-256 as version 6 wrote it (64 hex digits, no algorithm).
    const bytes = (await store.shelf.get(0, 's2-e0.actor.r0'))!;
    const old = createHash('sha256').update(bytes).digest('hex');
    const named = (digest: string): SnapshotManifest => ({ ...m, models: { actor: [{ ...m.models.actor![0]!, digest }] } });
    expect((await readSnapshot(store.shelf, named(old), 'm')).set.actor![0]!.tensors[0]!.data).toEqual(Float32Array.of(2));
    expect((await readSnapshot(store.shelf, named(`sha256:${old}`), 'm')).set.actor![0]!.tensors[0]!.data).toEqual(Float32Array.of(2));
    // Changed since: refused in the manifest's algorithm, named.
    await store.shelf.put(0, 's2-e0.actor.r0', Uint8Array.from([...bytes.subarray(0, -1), bytes.at(-1)! ^ 1]));
    await expect(readSnapshot(store.shelf, named(old), 'm')).rejects.toThrow(/changed since it was written: its digest is SHA-256 [0-9a-f]{12}…, the manifest says SHA-256 [0-9a-f]{12}…/);
    await expect(readSnapshot(store.shelf, m, 'm')).rejects.toThrow(/changed since it was written: its digest is BLAKE3 [0-9a-f]{12}…, the manifest says BLAKE3 [0-9a-f]{12}…/);
    await expect(readSnapshot(store.shelf, named('x'), 'm')).rejects.toThrow(/changed since it was written: its digest is BLAKE3 [0-9a-f]{12}…, the manifest says "x"/);
  });
});
