// A checkpoint is a plain record of a shard — weights and optimizer state — that restores training
// exactly: training on from a restored checkpoint ends bit-identical to training on uninterrupted,
// on one device and across the ranks of a 3D-parallel layout. A shard kept through a reset is
// proven equal to a checkpoint by its state digest.
import { beforeAll, describe, expect, it, vi } from 'vitest';
import { shardSlices, sliceShape, type Layout } from '../../mesh/parallel/layout.ts';
import { PROTOCOL_VERSION, type Call, type CallBody, type Checkpoint, type Optim, type SnapshotManifest } from '../../mesh/wire/messages/protocol.ts';
import { MemoryBus } from '../../mesh/wire/bus/memory-bus.ts';
import { subjects } from '../../mesh/wire/bus/subjects.ts';
import { Device } from './device.ts';
import { modelDigest, stateDigest, tensorDigest } from '../../mesh/wire/transfer/chunks.ts';
import { relaidSlices } from '../../mesh/parallel/relaid.ts';
import { reshard } from '../runtime/store/reshard.ts';
import { checkpointBytes, piecesOf } from '../runtime/run/recovery.ts';
import { initBackend } from '../model/backend/backend.ts';
import { LocalDispatcher } from '../runtime/dispatch/local-dispatch.ts';
import { MemoryShelf } from '../../mesh/wire/transfer/shelf.ts';
import { readSnapshot } from '../runtime/store/snapshots.ts';
import { modelInfo, parameterShapes, trains, type GptSpec } from '../model/params.ts';
import { baseDigest } from './snapshot.ts';
import { callMesh } from '../runtime/run/run.ts';

const spec: GptSpec = { kind: 'policy', vocab: 11, context: 9, layers: 2, width: 16, heads: 4 };
const optim: Optim = { lr: 1e-2, beta1: 0.9, beta2: 0.999, eps: 1e-8, clipNorm: 1 };
const B = 8;
const tokens = Int32Array.from({ length: B * 9 }, (_, i) => (i * 7 + 3) % 10);
const train = (seed: number): CallBody => ({
  fn: 'train',
  tokens,
  batch: B,
  promptLen: 5,
  responseLen: 4,
  seed,
  epochs: 2,
  minibatches: 2,
  loss: { name: 'clip_policy', params: { clip: 0.2 } },
  data: {
    old: new Float32Array(B * 4).fill(-2),
    advantages: Float32Array.from({ length: B * 4 }, (_, i) => Math.sin(i)),
  },
});

async function digest(d: LocalDispatcher, layout: Layout) {
  return (await callMesh(d, layout, 'actor', 0, { fn: 'manifest' })).digest;
}

describe('checkpoints', () => {
  beforeAll(async () => {
    await initBackend('wasm');
  });

  for (const layout of [
    { devices: [0], dp: 1, tp: 1, pp: 1 },
    { devices: [0, 1, 2, 3], dp: 1, tp: 2, pp: 2 },
    { devices: [0, 1], dp: 2, tp: 1, pp: 1 },
  ] satisfies Layout[]) {
    it(`restore training exactly (dp=${layout.dp} tp=${layout.tp} pp=${layout.pp})`, async () => {
      const load = (d: LocalDispatcher, seed?: number) =>
        Promise.all(layout.devices.map((dev, rank) => d.call(dev, 'actor', 0, { fn: 'load', role: 'actor', spec, layout, rank, ...(seed === undefined ? {} : { seed }), optim })));
      // Uninterrupted: three training calls.
      const a = new LocalDispatcher(4);
      await load(a, 3);
      await callMesh(a, layout, 'actor', 0, train(1) as never);
      await callMesh(a, layout, 'actor', 0, train(2) as never);
      const shapes = (rank: number) => shardSlices(modelInfo(spec), layout, rank).map((s) => ({ name: s.name, shape: sliceShape(s) }));
      const saved: Checkpoint[] = [];
      for (const [rank, dev] of layout.devices.entries()) saved.push(await a.checkpointShard(dev, 'actor', 0, shapes(rank), true));
      expect(saved[0]!.optimizer!.step).toBe(8); // 2 calls × 2 epochs × 2 mini-batches
      await callMesh(a, layout, 'actor', 0, train(3) as never);
      const uninterrupted = await digest(a, layout);
      // Interrupted: fresh devices, the checkpoint put back, the third call.
      const b = new LocalDispatcher(4);
      await load(b);
      for (const [rank, dev] of layout.devices.entries()) await b.restoreShard(dev, 'actor', 0, saved[rank]!);
      await callMesh(b, layout, 'actor', 0, train(3) as never);
      expect(await digest(b, layout)).toBe(uninterrupted);
    }, 30_000);
  }

  it('a checkpoint of half a chunk or less travels in the restore call itself, one of more is streamed in chunks: both put back the same state', async () => {
    const layout: Layout = { devices: [0], dp: 1, tp: 1, pp: 1 };
    const a = new LocalDispatcher(1);
    await a.call(0, 'actor', 0, { fn: 'load', role: 'actor', spec, layout, rank: 0, seed: 3, optim });
    await callMesh(a, layout, 'actor', 0, train(1) as never);
    const saved = await a.checkpointShard(
      0,
      'actor',
      0,
      shardSlices(modelInfo(spec), layout, 0).map((s) => ({ name: s.name, shape: sliceShape(s) })),
      true,
    );
    const want = await digest(a, layout);
    // Weights and both moments: more than half of a one-block chunk, less than half of a 1 MiB one.
    expect(checkpointBytes(saved)).toBeGreaterThan((64 * 1024 + 1024) / 2);
    expect(checkpointBytes(saved)).toBeLessThan((1 << 20) / 2);
    for (const [bus, streamed] of [
      [new MemoryBus(64 * 1024 + 1024), true],
      [new MemoryBus(1 << 20), false],
    ] as const) {
      const published = vi.spyOn(bus, 'publish');
      const b = new LocalDispatcher(1, bus);
      await b.call(0, 'actor', 0, { fn: 'load', role: 'actor', spec, layout, rank: 0, optim });
      expect((await b.restoreShard(0, 'actor', 0, saved, { digest: true })).digest).toBe(want);
      expect(published.mock.calls.some(([subject]) => subject.includes('.chunk.'))).toBe(streamed);
      await callMesh(a, layout, 'actor', 0, train(2) as never);
      await callMesh(b, layout, 'actor', 0, train(2) as never);
      expect(await digest(b, layout)).toBe(await digest(a, layout));
      // The next round starts from a again.
      await a.restoreShard(0, 'actor', 0, saved);
    }
  });

  it('a restore whose call carries its tensors is refused, naming the tensor, where one is not expected, comes twice, has another shape or another digest, or is missing; the shard is unchanged', async () => {
    const layout: Layout = { devices: [0], dp: 1, tp: 1, pp: 1 };
    const d = new LocalDispatcher(1);
    await d.call(0, 'actor', 0, { fn: 'load', role: 'actor', spec, layout, rank: 0, seed: 3 });
    const before = await digest(d, layout);
    const tensors = shardSlices(modelInfo(spec), layout, 0).map((s) => {
      const data = new Float32Array(sliceShape(s).reduce((a, b) => a * b, 1)).fill(0.5);
      return { name: `w:${s.name}`, shape: sliceShape(s), data, digest: tensorDigest(data) };
    });
    const restore = (inline: typeof tensors) => d.call(0, 'actor', 0, { fn: 'restore', realloc: 'r1', transfer: 'r1', step: 0, optimizer: false, ledger: [], inline });
    const [first, second] = tensors;
    await expect(restore([...tensors, { ...first!, name: 'w:nope' }])).rejects.toThrow(/restore r1: 'w:nope' is not a tensor this restore expects/);
    await expect(restore([...tensors, first!])).rejects.toThrow(`restore r1: '${first!.name}' comes twice`);
    await expect(restore([{ ...first!, shape: [first!.data.length] }, ...tensors.slice(1)])).rejects.toThrow(`restore r1: '${first!.name}' is [${first!.data.length}]`);
    const flipped = Float32Array.from(second!.data, (x, i) => (i === 3 ? -x : x));
    await expect(restore([first!, { ...second!, data: flipped }, ...tensors.slice(2)])).rejects.toMatchObject({
      code: 'digest_mismatch',
      message: expect.stringContaining(`'${second!.name}' digest`),
    });
    await expect(restore(tensors.slice(1))).rejects.toThrow(`restore r1: the call lacks '${first!.name}' of the ${tensors.length} tensors it restores`);
    expect(await digest(d, layout)).toBe(before);
    await restore(tensors);
    expect(await digest(d, layout)).not.toBe(before);
  });

  it('a snapshot written by each device into its own bucket reads back, by its manifest, as the streamed checkpoint, and restores training exactly, pushed or reloaded by the devices themselves', async () => {
    const layout: Layout = { devices: [0, 1, 2, 3], dp: 1, tp: 2, pp: 2 };
    const shelf = new MemoryShelf();
    const a = new LocalDispatcher(4, undefined, shelf);
    const load = (d: LocalDispatcher, seed?: number) =>
      Promise.all(layout.devices.map((dev, rank) => d.call(dev, 'actor', 0, { fn: 'load', role: 'actor', spec, layout, rank, ...(seed === undefined ? {} : { seed }), optim })));
    await load(a, 3);
    await callMesh(a, layout, 'actor', 0, train(1) as never);
    const shards = await Promise.all(
      layout.devices.map(async (device, rank) => ({
        device,
        object: `s0-e0.actor.r${rank}`,
        ...(await a.call(device, 'actor', 0, { fn: 'snapshot', object: `s0-e0.actor.r${rank}`, optimizer: true })),
      })),
    );
    // Each device wrote its own object; nothing of it passed through the caller.
    expect(shelf.all().sort()).toEqual(layout.devices.map((d, rank) => `${d}/s0-e0.actor.r${rank}`).sort());
    const manifest: SnapshotManifest = { type: 'snapshot', v: PROTOCOL_VERSION, iteration: 0, models: { actor: shards }, replicas: { actor: [0, 1, 2, 3] }, layouts: { actor: layout } };
    const back = await readSnapshot(shelf, manifest, 'test');
    const shapes = (rank: number) => shardSlices(modelInfo(spec), layout, rank).map((sl) => ({ name: sl.name, shape: sliceShape(sl) }));
    for (const [rank, dev] of layout.devices.entries()) {
      const streamed = await a.checkpointShard(dev, 'actor', 0, shapes(rank), true);
      expect(stateDigest(back.set.actor![rank]!)).toBe(stateDigest(streamed));
      expect(back.states!.actor![rank]).toBe(stateDigest(streamed));
    }
    await callMesh(a, layout, 'actor', 0, train(2) as never);
    const uninterrupted = await digest(a, layout);
    const b = new LocalDispatcher(4);
    await load(b);
    for (const [rank, dev] of layout.devices.entries()) await b.restoreShard(dev, 'actor', 0, back.set.actor![rank]!);
    await callMesh(b, layout, 'actor', 0, train(2) as never);
    expect(await digest(b, layout)).toBe(uninterrupted);
    // Each device reloading its rank from the object itself (a recovery in place) ends the same.
    const c = new LocalDispatcher(4, undefined, shelf);
    await load(c);
    // Refused whole before anything changes: another rank's object, one changed since it was written.
    await expect(c.call(0, 'actor', 0, { fn: 'reload', object: shards[1]!, optimizer: true })).rejects.toThrow(/holds 'actor' rank 1 of layout \[0,1,2,3\], not the slices of rank 0/);
    await expect(c.call(0, 'actor', 0, { fn: 'reload', object: { ...shards[0]!, digest: shards[1]!.digest }, optimizer: true })).rejects.toThrow(/changed since it was written/);
    await expect(c.call(0, 'actor', 0, { fn: 'reload', object: { ...shards[0]!, object: 'gone' }, optimizer: true })).rejects.toThrow(/"gone" in device 0's bucket is missing/);
    for (const [rank, dev] of layout.devices.entries()) expect((await c.call(dev, 'actor', 0, { fn: 'reload', object: shards[rank]!, optimizer: true })).bytes).toBe(shards[rank]!.bytes);
    await callMesh(c, layout, 'actor', 0, train(2) as never);
    expect(await digest(c, layout)).toBe(uninterrupted);
    // A snapshot that claims another rank's place is refused, naming it; so is one whose optimizer the shard does not have.
    await expect(readSnapshot(shelf, { ...manifest, models: { actor: [shards[1]!, shards[0]!, shards[2]!, shards[3]!] } }, 'test')).rejects.toThrow(
      /test: 'actor' object "s0-e0.actor.r1" in device 1's bucket: expected 'actor' rank 0 of layout \[0,1,2,3\] after iteration 0, got 'actor' rank 1/,
    );
    await expect(a.call(0, 'actor', 0, { fn: 'snapshot', object: 'x', optimizer: false })).rejects.toThrow(/expected no optimizer state, the shard has one/);
  }, 30_000);

  it("a reload onto a shard that still holds its snapshot's frozen base (LoRA) reads what trains alone, and replays exactly; a base that differs is read again", async () => {
    const lora: GptSpec = { ...spec, lora: { rank: 2, alpha: 4, targets: ['c_attn', 'c_proj', 'c_fc'] } };
    const one: Layout = { devices: [0], dp: 1, tp: 1, pp: 1 };
    const shelf = new MemoryShelf();
    const d = new LocalDispatcher(1, undefined, shelf);
    const load = (seed: number) => d.call(0, 'actor', 0, { fn: 'load', role: 'actor', spec: lora, layout: one, rank: 0, seed, optim });
    const weights = async () => (await d.call(0, 'actor', 0, { fn: 'manifest' })).digest;
    await load(3);
    await callMesh(d, one, 'actor', 0, train(1) as never);
    const written = await d.call(0, 'actor', 0, { fn: 'snapshot', object: 's0', optimizer: true });
    const entry = { device: 0, object: 's0', ...written };
    const at0 = await weights();
    await callMesh(d, one, 'actor', 0, train(2) as never);
    const after = await weights();
    expect(after).not.toBe(at0);
    // The frozen base is as the snapshot wrote it (its digest says so): the snapshot's own object alone is read.
    const own = (await shelf.get(0, 's0'))!.length;
    expect(written.bytes).toBeGreaterThan(3 * own);
    expect(await d.call(0, 'actor', 0, { fn: 'reload', object: entry, optimizer: true })).toEqual({ bytes: own, base_kept_bytes: written.bytes - own });
    expect(await weights()).toBe(at0);
    await callMesh(d, one, 'actor', 0, train(2) as never);
    expect(await weights()).toBe(after);
    // Another base (loaded again from another seed) is read from the bucket and checked: never assumed.
    await load(4);
    expect(await d.call(0, 'actor', 0, { fn: 'reload', object: entry, optimizer: true })).toEqual({ bytes: written.bytes });
    expect(await weights()).toBe(at0);
    await d.close();
  });

  it("a reset keeps the shards of the models it is told to keep, with their place and their checkpoint's state digest; others go", async () => {
    const layout: Layout = { devices: [0, 1], dp: 2, tp: 1, pp: 1 };
    const d = new LocalDispatcher(2);
    await Promise.all(layout.devices.map((dev, rank) => d.call(dev, 'actor', 0, { fn: 'load', role: 'actor', spec, layout, rank, seed: 3, optim })));
    await d.call(0, 'frozen', 0, { fn: 'load', role: 'reference', spec, layout: { devices: [0], dp: 1, tp: 1, pp: 1 }, rank: 0, seed: 4 });
    await callMesh(d, layout, 'actor', 0, train(1) as never);
    const shapes = shardSlices(modelInfo(spec), layout, 0).map((s) => ({ name: s.name, shape: sliceShape(s) }));
    const saved = await d.checkpointShard(0, 'actor', 0, shapes, true);
    const state = stateDigest({ tensors: saved.tensors, optimizer: saved.optimizer, ledger: saved.ledger ?? [] });
    const kept = await d.call(0, '*', 0, { fn: 'reset', epoch: d.epoch, keep: ['actor'] });
    expect(kept.dropped).toEqual(['frozen']);
    expect(kept.kept).toEqual([{ model: 'actor', layout, rank: 0, state, parameters: saved.tensors.reduce((n, t) => n + t.data.length, 0) }]);
    // Trained once more, the state differs: the digest says so.
    await callMesh(d, layout, 'actor', 0, train(2) as never);
    const again = await d.call(0, '*', 0, { fn: 'reset', epoch: d.epoch, keep: ['actor'] });
    expect(again.kept[0]!.state).not.toBe(state);
  });

  it('a reset leaves a shard a call still runs on busy (neither kept nor dropped); once the abandoned call has failed, a reset again keeps it as it was', async () => {
    const layout: Layout = { devices: [0, 1], dp: 2, tp: 1, pp: 1 };
    const d = new LocalDispatcher(2);
    await Promise.all(layout.devices.map((dev, rank) => d.call(dev, 'actor', 0, { fn: 'load', role: 'actor', spec, layout, rank, seed: 3, optim })));
    const shapes = shardSlices(modelInfo(spec), layout, 0).map((s) => ({ name: s.name, shape: sliceShape(s) }));
    const before = await d.checkpointShard(0, 'actor', 0, shapes, true);
    // Device 0 trains alone: it waits for its replica's gradients, which never come.
    const stuck = d.call(0, 'actor', 0, train(1), 'g-stuck');
    stuck.catch(() => {});
    await new Promise((res) => setTimeout(res, 50));
    d.interrupt('the test gives up on the train call');
    expect(await d.call(0, '*', 0, { fn: 'reset', epoch: d.epoch, keep: ['actor'] })).toMatchObject({ dropped: [], kept: [], busy: ['actor'] });
    // The reset ended its collective: the call fails without a step.
    await expect(stuck).rejects.toThrow();
    const again = await d.call(0, '*', 0, { fn: 'reset', epoch: d.epoch, keep: ['actor'] });
    expect(again).toMatchObject({ busy: [], kept: [{ model: 'actor', state: stateDigest({ tensors: before.tensors, optimizer: before.optimizer, ledger: [] }) }] });
    // Left out of keep, it goes.
    expect(await d.call(0, '*', 0, { fn: 'reset', epoch: d.epoch })).toMatchObject({ dropped: ['actor'], kept: [] });
  });

  for (const from of [
    { devices: [0, 1], dp: 2, tp: 1, pp: 1 },
    { devices: [0, 1], dp: 1, tp: 2, pp: 1 },
    { devices: [0, 1], dp: 1, tp: 1, pp: 2 },
  ] satisfies Layout[]) {
    it(`a restore onto another layout moves the shard a device kept in place, sent only the pieces it lacks; it trains as one restored whole there does (from dp=${from.dp} tp=${from.tp} pp=${from.pp})`, async () => {
      const alone: Layout = { devices: [0], dp: 1, tp: 1, pp: 1 };
      const info = modelInfo(spec);
      const d = new LocalDispatcher(2);
      await Promise.all(from.devices.map((dev, rank) => d.call(dev, 'actor', 0, { fn: 'load', role: 'actor', spec, layout: from, rank, seed: 3, optim })));
      await callMesh(d, from, 'actor', 0, train(1) as never);
      const ranks = await Promise.all(
        from.devices.map((dev, rank) =>
          d.checkpointShard(
            dev,
            'actor',
            0,
            shardSlices(info, from, rank).map((s) => ({ name: s.name, shape: sliceShape(s) })),
            true,
          ),
        ),
      );
      // The snapshot's ranks on the new layout: device 1 is gone, device 0 takes the whole model.
      const whole = reshard(spec, 'actor', from, ranks, alone)[0]!;
      await d.call(0, '*', 0, { fn: 'reset', epoch: d.epoch, keep: ['actor'] });
      const pieces = piecesOf(whole, relaidSlices(info, { layout: from, rank: 0 }, { layout: alone, rank: 0 }));
      expect(checkpointBytes(pieces)).toBeLessThan(checkpointBytes(whole));
      if (from.dp === 2) expect(pieces.tensors).toEqual([]);
      // Asked, the restore's answer carries the digest of what the device holds after it (as manifest gives it); else none.
      const moved = await d.restoreShard(0, 'actor', 0, pieces, { onto: { layout: alone, rank: 0 }, digest: true });
      const fresh = new LocalDispatcher(1);
      await fresh.call(0, 'actor', 0, { fn: 'load', role: 'actor', spec, layout: alone, rank: 0, optim });
      expect(await fresh.restoreShard(0, 'actor', 0, whole)).toEqual({});
      expect(await digest(d, alone)).toBe(await digest(fresh, alone));
      expect(moved.digest).toBe(await digest(d, alone));
      expect(moved.digest).toBe(modelDigest(whole.tensors));
      expect((await fresh.restoreShard(0, 'actor', 0, whole, { digest: true })).digest).toBe(moved.digest);
      await callMesh(d, alone, 'actor', 0, train(2) as never);
      await callMesh(fresh, alone, 'actor', 0, train(2) as never);
      expect(await digest(d, alone)).toBe(await digest(fresh, alone));
    });
  }

  for (const from of [
    { devices: [0, 1], dp: 2, tp: 1, pp: 1 },
    { devices: [0, 1], dp: 1, tp: 2, pp: 1 },
  ] satisfies Layout[]) {
    it(`with adapters, a shard that trained past the snapshot moves onto another layout keeping its frozen base (its digest the snapshot's), sent what trains whole; it trains as one restored whole does (from dp=${from.dp} tp=${from.tp})`, async () => {
      const lora: GptSpec = { ...spec, lora: { rank: 2, alpha: 4, targets: ['c_attn', 'c_proj', 'c_fc'] } };
      const alone: Layout = { devices: [0], dp: 1, tp: 1, pp: 1 };
      const info = modelInfo(lora);
      const shelf = new MemoryShelf();
      const d = new LocalDispatcher(2, undefined, shelf);
      await Promise.all(from.devices.map((dev, rank) => d.call(dev, 'actor', 0, { fn: 'load', role: 'actor', spec: lora, layout: from, rank, seed: 3, optim })));
      await callMesh(d, from, 'actor', 0, train(1) as never);
      // A snapshot on the old layout writes rank 0's base object (a data-parallel rank's is the whole base).
      await d.call(0, 'actor', 0, { fn: 'snapshot', object: 'old', optimizer: true });
      const shapes = (rank: number) => shardSlices(info, from, rank).map((s) => ({ name: s.name, shape: sliceShape(s) }));
      const ranks = await Promise.all(from.devices.map((dev, rank) => d.checkpointShard(dev, 'actor', 0, shapes(rank), true)));
      const whole = reshard(lora, 'actor', from, ranks, alone)[0]!;
      // The run went on past the snapshot: what trains changed, the base did not; the reset says both.
      await callMesh(d, from, 'actor', 0, train(2) as never);
      const { kept } = await d.call(0, '*', 0, { fn: 'reset', epoch: d.epoch, keep: ['actor'] });
      expect(kept[0]!.state).not.toBe(stateDigest({ tensors: ranks[0]!.tensors, optimizer: ranks[0]!.optimizer, ledger: ranks[0]!.ledger ?? [] }));
      expect(kept[0]!.base).toBe(baseDigest(lora, true, ranks[0]!.tensors));
      const trained = parameterShapes(lora)
        .map(([name]) => name)
        .filter((name) => trains(lora, name));
      const stale = new Set(trained);
      const pieces = piecesOf(
        whole,
        relaidSlices(info, { layout: from, rank: 0 }, { layout: alone, rank: 0 }, (name) => stale.has(name)),
        (name) => trains(lora, name),
      );
      const trainedBytes = whole.tensors.filter((t) => stale.has(t.name)).reduce((n, t) => n + 3 * t.data.byteLength, 0);
      if (from.dp === 2) expect(checkpointBytes(pieces)).toBe(trainedBytes);
      expect(checkpointBytes(pieces)).toBeLessThan(checkpointBytes(whole) / 2);
      const moved = await d.restoreShard(0, 'actor', 0, pieces, { onto: { layout: alone, rank: 0, stale: trained }, digest: true });
      expect(moved.digest).toBe(modelDigest(whole.tensors));
      const fresh = new LocalDispatcher(1, undefined, shelf);
      await fresh.call(0, 'actor', 0, { fn: 'load', role: 'actor', spec: lora, layout: alone, rank: 0, optim });
      await fresh.restoreShard(0, 'actor', 0, whole);
      // A snapshot on the new layout names a base object of its own (the same bytes, on another
      // layout), which a device that never held it reads back.
      const written = await d.call(0, 'actor', 0, { fn: 'snapshot', object: 'new', optimizer: true });
      expect(await fresh.call(0, 'actor', 0, { fn: 'reload', object: { device: 0, object: 'new', ...written }, optimizer: true })).toMatchObject({ bytes: written.bytes });
      await callMesh(d, alone, 'actor', 0, train(2) as never);
      await callMesh(fresh, alone, 'actor', 0, train(2) as never);
      expect(await digest(d, alone)).toBe(await digest(fresh, alone));
    });
  }

  it('a restore onto a rank of another device is refused, and the shard stays', async () => {
    const d = new LocalDispatcher(1);
    const layout: Layout = { devices: [0], dp: 1, tp: 1, pp: 1 };
    await d.call(0, 'actor', 0, { fn: 'load', role: 'actor', spec, layout, rank: 0, seed: 3, optim });
    const before = await digest(d, layout);
    const empty = { tensors: [], optimizer: { step: 0, moments: [] }, ledger: [] };
    await expect(d.restoreShard(0, 'actor', 0, empty, { onto: { layout: { devices: [1], dp: 1, tp: 1, pp: 1 }, rank: 0 } })).rejects.toThrow(/rank 0 of layout \[1\] is device 1, not this device 0/);
    expect(await digest(d, layout)).toBe(before);
  });

  it('a kept shard starts as a fresh one: a tied head on a pipeline, its last stage abandoned mid-call, answers as a restored one does', async () => {
    const tied: GptSpec = { ...spec, tied: true };
    const pp2: Layout = { devices: [0, 1], dp: 1, tp: 1, pp: 2 };
    const load = (x: LocalDispatcher, seed?: number) =>
      Promise.all(pp2.devices.map((dev, rank) => x.call(dev, 'actor', 0, { fn: 'load', role: 'actor', spec: tied, layout: pp2, rank, ...(seed === undefined ? {} : { seed }) })));
    const infer = async (x: LocalDispatcher) => ((await callMesh(x, pp2, 'actor', 0, { fn: 'inference', tokens, batch: B, promptLen: 5, responseLen: 4 })) as { logprobs: Float32Array }).logprobs;
    const d = new LocalDispatcher(2);
    await load(d, 3);
    const ranks = await Promise.all(
      pp2.devices.map((dev, rank) =>
        d.checkpointShard(
          dev,
          'actor',
          0,
          shardSlices(modelInfo(tied), pp2, rank).map((s) => ({ name: s.name, shape: sliceShape(s) })),
          false,
        ),
      ),
    );
    // The last stage alone starts an inference: it takes the tied head's copy (waiting for the first stage's, which never comes).
    const stuck = d.call(1, 'actor', 0, { fn: 'inference', tokens, batch: B, promptLen: 5, responseLen: 4 }, 'g-stuck');
    stuck.catch(() => {});
    await new Promise((res) => setTimeout(res, 50));
    d.interrupt('the test gives up on the inference');
    for (const dev of pp2.devices) await d.call(dev, '*', 0, { fn: 'reset', epoch: d.epoch, keep: ['actor'] });
    await expect(stuck).rejects.toThrow();
    const out = await Promise.all(pp2.devices.map((dev) => d.call(dev, '*', 0, { fn: 'reset', epoch: d.epoch, keep: ['actor'] })));
    expect(out.map((o) => o.kept.length)).toEqual([1, 1]);
    const fresh = new LocalDispatcher(2);
    await load(fresh);
    for (const [rank, dev] of pp2.devices.entries()) await fresh.restoreShard(dev, 'actor', 0, ranks[rank]!);
    expect(Array.from(await infer(d))).toEqual(Array.from(await infer(fresh)));
  });

  it('a device refuses a call of an epoch before its last reset, even one that reaches it after the reset', async () => {
    const device = new Device(0, new MemoryBus(), subjects('epochs'));
    const call = (epoch: number, body: CallBody): Call => ({ type: 'call', v: PROTOCOL_VERSION, id: `c${epoch}-${body.fn}`, model: 'actor', iteration: 0, epoch, body });
    const layout: Layout = { devices: [0], dp: 1, tp: 1, pp: 1 };
    await device.run(call(0, { fn: 'load', role: 'actor', spec, layout, rank: 0, seed: 3, optim }));
    await device.run({ ...call(2, { fn: 'reset', epoch: 2, keep: ['actor'] }), model: '*' });
    await expect(device.run(call(1, train(1)))).rejects.toThrow(/belongs to epoch 1; device 0 was reset for epoch 2/);
    await expect(device.run(call(2, { fn: 'manifest' }))).resolves.toBeDefined();
    device.close();
  });

  it('refuses optimizer state for a shard that does not train, and changes nothing', async () => {
    const d = new LocalDispatcher(1);
    const layout: Layout = { devices: [0], dp: 1, tp: 1, pp: 1 };
    const shapes = shardSlices(modelInfo(spec), layout, 0).map((s) => ({ name: s.name, shape: sliceShape(s) }));
    await d.call(0, 'actor', 0, { fn: 'load', role: 'actor', spec, layout, rank: 0, seed: 3, optim });
    const checkpoint = await d.checkpointShard(0, 'actor', 0, shapes, true);
    await d.call(0, 'frozen', 0, { fn: 'load', role: 'reference', spec, layout, rank: 0, seed: 4 });
    const before = (await d.call(0, 'frozen', 0, { fn: 'manifest' })).digest;
    await expect(d.restoreShard(0, 'frozen', 0, checkpoint)).rejects.toThrow(/holds no optimizer/);
    expect((await d.call(0, 'frozen', 0, { fn: 'manifest' })).digest).toBe(before);
    // Asking a frozen shard for optimizer state it does not have is an error too.
    await expect(d.checkpointShard(0, 'frozen', 0, shapes, true)).rejects.toThrow(/expected an optimizer state, the shard has none/);
  });
});
