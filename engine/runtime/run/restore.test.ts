// A recovery in place on devices in this process: ranks a device kept with the snapshot's state
// stay, the others are reloaded by their devices from the snapshot's objects (nothing through the
// supervisor), and a snapshot that cannot be read back sends the recovery to the one before it.
import { beforeAll, describe, expect, it } from 'vitest';
import { MemoryShelf, ShardObject, decode, encode, PROTOCOL_VERSION } from '../../../mesh/wire/index.ts';
import { rankCoords } from '../../../mesh/parallel/index.ts';
import { initBackend } from '../../model/backend/backend.ts';
import { CallError, fence, type Dispatcher } from '../dispatch/dispatch.ts';
import { LocalDispatcher } from '../dispatch/local-dispatch.ts';
import { runSpec } from './run.ts';
import { setupModels, snapshotInto, takeSnapshot } from './setup.ts';
import { parseScenario } from '../scenario/scenario.ts';
import { manifestObjects, rankObjects } from '../store/snapshots.ts';
import { MemoryStore } from '../store/store.ts';
import { FOUR_DEVICES } from './four-devices.fixture.ts';
import { restoreDevices } from './recovery.ts';

const r = runSpec(parseScenario(`${FOUR_DEVICES}warmup: { steps: 0 }\nrl: { iterations: 4, batch: 8 }\n`, 'unit.yaml'));
const devices = [0, 1, 2, 3];

describe('a recovery in place', () => {
  beforeAll(async () => {
    await initBackend('wasm');
  });

  it('keeps what equals the snapshot, has the devices reload the rest themselves, and goes back to the snapshot before one it cannot read', async () => {
    const shelf = new MemoryShelf();
    const d = new LocalDispatcher(4, undefined, shelf);
    const store = new MemoryStore(shelf);
    await setupModels(d, r);
    await snapshotInto(d, r, store, -1);
    await snapshotInto(d, r, store, 0);
    const m0 = (await store.loadManifest(0))!;
    const said: string[] = [];
    const say = (line: string) => said.push(line);

    // Nothing lost: every rank is held, nothing restored.
    const all = manifestObjects(m0);
    const total = Object.keys(m0.models).reduce((n, model) => n + rankObjects(m0, model).reduce((k, o) => k + o.bytes, 0), 0);
    const held = await restoreDevices({ d, r, store, devices, snapshot: 0, say });
    expect(held).toMatchObject({ snapshot: 0, bytes: 0, keptBytes: total, viaSupervisor: 0 });

    // Device 2 loses everything: its ranks are reloaded from their objects — with every rank of a
    // replica it was in (the tensor-parallel reference's other half on device 3 too: a replica is
    // held whole or not at all) — by their devices; the state is the snapshot's again. The
    // reference does not train: its snapshot objects name a base object, written once (at -1);
    // device 2 reads it again, device 3 still holds its half's (checked by digest) and reads the
    // snapshot's object alone.
    await d.call(2, '*', -1, { fn: 'reset', epoch: d.epoch });
    const back = await restoreDevices({ d, r, store, devices, snapshot: 0, say });
    const baseBytes = async (o: { device: number; object: string }) => {
      const base = decode('test', (await shelf.get(o.device, o.object))!, ShardObject).base;
      return base ? (await shelf.get(o.device, base.object))!.length : 0;
    };
    let lost = 0;
    let lostObjects = 0;
    let baseHeld = 0;
    for (const model of Object.keys(m0.models)) {
      const layout = m0.layouts[model]!;
      const broken = new Set(layout.devices.flatMap((device, rank) => (device === 2 ? [rankCoords(layout, rank).dp] : [])));
      for (const [rank, o] of rankObjects(m0, model).entries()) {
        if (!broken.has(rankCoords(layout, rank).dp)) continue;
        lost += o.bytes;
        lostObjects += o.bytes;
        if (layout.devices[rank] === 2) lost += await baseBytes(o);
        else baseHeld += await baseBytes(o);
      }
    }
    expect(baseHeld).toBeGreaterThan(0);
    expect(back).toMatchObject({ snapshot: 0, bytes: lost, keptBytes: total - lostObjects + baseHeld, viaSupervisor: 0 });
    const again = await takeSnapshot(d, r, 0);
    for (const model of Object.keys(m0.models)) expect(rankObjects(again, model).map((o) => o.state)).toEqual(rankObjects(m0, model).map((o) => o.state));
    expect(said).toEqual([]);

    // One of snapshot 0's objects is replaced after its manifest was written: back to the snapshot after setup.
    const theirs = all.find((o) => o.device === 2)!;
    await shelf.put(2, theirs.object, encode({ type: 'forged', v: PROTOCOL_VERSION }));
    await d.call(2, '*', -1, { fn: 'reset', epoch: d.epoch });
    const before = await restoreDevices({ d, r, store, devices, snapshot: 0, say });
    expect(before.snapshot).toBe(-1);
    expect(said).toHaveLength(1);
    expect(said[0]).toMatch(
      new RegExp(
        `the snapshot after iteration 0 cannot be restored \\(.*"${theirs.object.replaceAll('.', '\\.')}" in device 2's bucket changed since it was written.*\\): going back to the one after iteration -1`,
      ),
    );
    // With no snapshot before it, the failure is the caller's, named.
    await shelf.put(2, manifestObjects((await store.loadManifest(-1))!).find((o) => o.device === 2)!.object, encode({ type: 'forged', v: PROTOCOL_VERSION }));
    await d.call(2, '*', -1, { fn: 'reset', epoch: d.epoch });
    await expect(restoreDevices({ d, r, store, devices, snapshot: -1, say })).rejects.toThrow(/in device 2's bucket changed since it was written/);
  }, 60_000);

  it('from a checkpoint, a failure is thrown only once every other call of the setup has ended: none still arrives at a device after it', async () => {
    const shelf = new MemoryShelf();
    const local = new LocalDispatcher(4, undefined, shelf);
    const store = new MemoryStore(shelf);
    await setupModels(local, r);
    await snapshotInto(local, r, store, 0);
    const { set } = (await store.loadSnapshot(0))!;
    for (const device of devices) await local.call(device, '*', -1, { fn: 'reset', epoch: local.epoch });
    const ended: string[] = [];
    const d: Dispatcher = {
      ...fence(local),
      call: (device, model, iteration, body, group, options) =>
        body.fn === 'load' && model === 'reward' ? Promise.reject(new CallError('failed', "the reward's load failed")) : local.call(device, model, iteration, body, group, options),
      restoreShard: async (device, model, iteration, c, o) => {
        await new Promise((res) => setTimeout(res, 100));
        const answer = await local.restoreShard(device, model, iteration, c, o);
        ended.push(`${model}@${device}`);
        return answer;
      },
    };
    await expect(setupModels(d, r, set)).rejects.toThrow("the reward's load failed");
    const ranks = Object.keys(set).flatMap((model) => set[model]!.map((_, rank) => `${model}/${rank}`));
    expect(ended).toHaveLength(ranks.length);
  }, 60_000);
});
