// Recovery against real failures: the NATS server restarted mid-run, one server of a three-server
// cluster killed mid-run, the run's durable state in JetStream, and a run whose actors keep dying
// past the supervision intensity. Every run that recovers must end with the parameters of a run
// that lost nothing.
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { JetStreamStore, sealProgress } from '../engine/runtime/store/jetstream-store.ts';
import { launch, type LaunchResult } from '../engine/cli/launch.ts';
import { loadScenario, type Scenario } from '../engine/runtime/scenario/scenario.ts';
import { connectBus } from '../mesh/wire/bus/bus.ts';
import { startNatsCluster, startNatsServer, type PrivateNatsServer } from '../mesh/wire/server/nats-server.ts';
import { PROTOCOL_VERSION, type Metrics } from '../mesh/wire/messages/protocol.ts';
import { encode } from '../mesh/wire/messages/codec.ts';
import { subjects } from '../mesh/wire/bus/subjects.ts';
import { jetstream } from '@nats-io/jetstream';
import { Kvm } from '@nats-io/kv';
import { smallScenario, tempDir } from './helpers.ts';
import type { RunStore } from '../engine/runtime/store/store.ts';
import type { SnapshotManifest } from '../mesh/wire/messages/protocol.ts';

const one = { devices: [0], dp: 1, tp: 1, pp: 1 };

/** What a device's `snapshot` call does (its state into its own bucket) and the manifest the supervisor keeps of it. */
async function deviceWrites(store: RunStore, iteration: number, tensors: Array<{ name: string; shape: number[]; data: Float32Array }>): Promise<SnapshotManifest> {
  const bytes = encode({ type: 'shard', v: PROTOCOL_VERSION, model: 'actor', layout: one, rank: 0, iteration, checkpoint: { tensors } });
  const object = `s${iteration}-e0.actor.r0`;
  const digest = await store.shelf.put(0, object, bytes);
  return {
    type: 'snapshot',
    v: PROTOCOL_VERSION,
    iteration,
    models: { actor: [{ device: 0, object, bytes: bytes.length, digest, state: `state-${iteration}` }] },
    replicas: { actor: [0] },
    layouts: { actor: one },
  };
}

const quiet = { phase() {}, iteration() {}, stop() {} };

/** A progress bar that runs `act` once, when iteration `at` has completed. */
function after(at: number, act: () => Promise<void>) {
  let fired = false;
  return {
    ...quiet,
    iteration(m: Metrics) {
      if (fired || m.iteration < at) return;
      fired = true;
      void act();
    },
  };
}

describe('recovery from failures of the bus and of the actors', () => {
  const dir = tempDir();
  let scenario: Scenario;
  let clean: LaunchResult;

  beforeAll(async () => {
    const file = smallScenario(dir, 'timeouts: { heartbeat_seconds: 4 }', 'rec');
    writeFileSync(file, readFileSync(file, 'utf8').replace('iterations: 3', 'iterations: 5'));
    scenario = loadScenario(file);
    clean = await launch({ scenario, run: `clean${Date.now()}`, out: join(dir, 'clean'), progress: quiet, say: () => {} });
    expect(clean.code).toBe(0);
  }, 120_000);

  it('the NATS server restarted mid-run: clients reconnect, the run recovers and ends as a clean run does', async () => {
    const server = await startNatsServer();
    try {
      const r = await launch({
        scenario,
        run: `restart${Date.now()}`,
        out: join(dir, 'restart'),
        natsUrl: server.url,
        progress: after(1, () => server.restart({ downMs: 500 })),
        say: () => {},
      });
      expect(r.summary?.error).toBeUndefined();
      expect(r.code).toBe(0);
      expect(r.summary!.recoveries.length).toBeGreaterThanOrEqual(1);
      expect(r.summary!.recoveries.map((x) => x.reason).join('\n')).toMatch(/reconnected to NATS|connection disconnected/);
      expect(r.summary!.digests).toEqual(clean.summary!.digests);
      expect(r.summary!.rollouts).toEqual({ prompts: 2 * 5 * 16, lost: 0, duplicated: 0 });
    } finally {
      await server.stop();
    }
  }, 180_000);

  it('a three-server cluster with the workers spread over it: killing one server does not stop the run', async () => {
    const servers = await startNatsCluster(3);
    try {
      const r = await launch({
        scenario,
        run: `cluster${Date.now()}`,
        out: join(dir, 'cluster'),
        natsUrl: servers.map((s) => s.url).join(','),
        progress: after(1, () => servers[1]!.kill()),
        say: () => {},
      });
      expect(r.summary?.error).toBeUndefined();
      expect(r.code).toBe(0);
      // Worker 1 was connected to the server killed (the launcher rotates the list per worker): the
      // run saw it go (a reconnect, a dropped connection, or its subject unserved for a moment).
      expect(r.summary!.recoveries.map((x) => x.reason).join('\n')).toMatch(/reconnected to NATS|disconnected|no one is subscribed/);
      expect(r.summary!.digests).toEqual(clean.summary!.digests);
      expect(r.summary!.rollouts).toEqual({ prompts: 2 * 5 * 16, lost: 0, duplicated: 0 });
    } finally {
      await Promise.all(servers.map((s) => s.stop()));
    }
  }, 240_000);

  it('one_for_all restarts every worker with the dead one, and the run still ends as a clean run does', async () => {
    const all: Scenario = {
      ...scenario,
      supervision: { ...scenario.supervision, strategy: 'one_for_all' },
      chaos: { kills: [{ actor: 'critic', call: 'train', iteration: 2, how: 'kill' }], joins: [] },
    };
    const r = await launch({ scenario: all, run: `all${Date.now()}`, out: join(dir, 'all'), progress: quiet, say: () => {} });
    expect(r.summary?.error).toBeUndefined();
    expect(r.chaos.kills).toHaveLength(1);
    // The killed worker, and the three others taken down with it.
    expect(r.chaos.restarts.map((x) => x.reason).sort()).toEqual(['killed by SIGKILL', ...Array(3).fill('taken down with another (one_for_all)')]);
    expect(r.summary!.digests).toEqual(clean.summary!.digests);
    expect(r.summary!.rollouts).toEqual({ prompts: 2 * 5 * 16, lost: 0, duplicated: 0 });
  }, 120_000);

  it('actors that keep dying past the supervision intensity end the run with an error naming them', async () => {
    const doomed = loadScenario(
      smallScenario(
        dir,
        [
          'supervision: { intensity: 1, period_seconds: 600 }',
          'chaos:',
          '  kills:',
          '    - { actor: critic, call: train, iteration: 0 }',
          '    - { actor: critic, call: train, iteration: 0 }',
          '    - { actor: critic, call: train, iteration: 0 }',
        ].join('\n'),
        'doomed',
      ),
    );
    const r = await launch({ scenario: doomed, run: `doomed${Date.now()}`, out: join(dir, 'doomed'), progress: quiet, say: () => {} });
    expect(r.code).not.toBe(0);
    expect(r.summary?.status).toBe('failed');
    expect(r.summary!.error).toMatch(/supervision: .*2 failures within 600 s \(supervision\.intensity allows 1\)/s);
    // The supervisor (which counts recoveries) or the launcher (which counts restarts) gives up first.
    expect(r.summary!.error).toMatch(/(device 1 \(worker |worker \d \(pid \d+\)).*killed by SIGKILL/s);
  }, 120_000);
});

describe('the run store in JetStream', () => {
  let server: PrivateNatsServer;
  beforeAll(async () => {
    server = await startNatsServer();
  });
  afterAll(() => server.stop());

  it('keeps progress, stage results and snapshots across a server restart, and stores a repeated result once', async () => {
    const nc = await connectBus(server.url, 'store-test');
    try {
      const store = await JetStreamStore.open(nc, 'st1', { devices: [0] });
      expect(await store.loadProgress()).toBeUndefined();
      expect(await store.loadStage(0, 'rollout')).toBeUndefined();
      const tokens = Int32Array.from([1, 2, 3, 4]);
      await store.saveStage(0, 'rollout', { iteration: 0, batch: 1, tokens });
      await store.saveStage(0, 'rollout', { iteration: 0, batch: 1, tokens: Int32Array.from([9, 9, 9, 9]) });
      await store.saveProgress({ epoch: 2, iteration: 1, snapshot: 0, history: [], startedAt: 5, recoveries: [] });
      const w = { name: 'w', shape: [2], data: Float32Array.from([0.5, -1]) };
      for (const it of [-1, 0, 1, 2]) await store.saveSnapshot(await deviceWrites(store, it, [w]));

      await server.restart({ downMs: 200 });

      // The second publish had the same id: the first result is the one kept.
      expect((await store.loadStage<{ tokens: Int32Array }>(0, 'rollout'))!.tokens).toEqual(tokens);
      expect(await store.loadProgress()).toEqual({ epoch: 2, iteration: 1, snapshot: 0, history: [], startedAt: 5, recoveries: [] });
      expect((await store.loadSnapshot(2))!.set.actor[0]!.tensors[0]!.data).toEqual(w.data);
      // A supervisor taking the run over reads it the same way; the device's state digest comes with it.
      const takeOver = await JetStreamStore.open(nc, 'st1');
      const back = (await takeOver.loadSnapshot(2))!;
      expect(back.set.actor[0]!.tensors[0]!.data).toEqual(w.data);
      expect(back.states).toEqual({ actor: ['state-2'] });
      expect(await store.loadSnapshot(1)).toBeDefined();
      // Only the last two snapshots are kept, and the objects of the others are gone from the device's bucket.
      expect(await store.loadSnapshot(0)).toBeUndefined();
      expect(await store.loadSnapshot(-1)).toBeUndefined();
      expect(await store.shelf.get(0, 's0-e0.actor.r0')).toBeUndefined();
      expect(await store.shelf.get(0, 's1-e0.actor.r0')).toBeDefined();
      // So are objects no manifest names (a snapshot that failed part-way), once older than both kept.
      await store.shelf.put(0, 's1-e7.actor.r0', encode({ type: 'forged', v: PROTOCOL_VERSION }));
      await store.shelf.put(0, 'not-a-snapshot', encode({ type: 'forged', v: PROTOCOL_VERSION }));
      await store.saveSnapshot(await deviceWrites(store, 3, [w]));
      expect((await store.shelf.names(0)).sort()).toEqual(['not-a-snapshot', 's2-e0.actor.r0', 's3-e0.actor.r0']);
      expect(await store.loadSnapshot(1)).toBeUndefined();
      // The one a recovery goes back to when the newest cannot be read.
      expect(await store.previousSnapshot(3)).toBe(2);
      // An object changed after its manifest was written is refused, named, not restored.
      await store.shelf.put(
        0,
        's2-e0.actor.r0',
        encode({ type: 'shard', v: PROTOCOL_VERSION, model: 'actor', layout: one, rank: 0, iteration: 2, checkpoint: { tensors: [{ ...w, data: Float32Array.from([9, 9]) }] } }),
      );
      await expect(store.loadSnapshot(2)).rejects.toThrow(
        /'actor' object "s2-e0.actor.r0" in device 0's bucket changed since it was written: its digest is BLAKE3 [0-9a-f]{12}…, the manifest says BLAKE3 [0-9a-f]{12}…/,
      );
      // One the manifest names but its device's bucket lacks, the same.
      await store.shelf.delete(0, 's3-e0.actor.r0');
      await expect(store.loadSnapshot(3)).rejects.toThrow(/'actor' object "s3-e0.actor.r0" in device 0's bucket is missing/);
    } finally {
      await nc.close();
    }
  }, 60_000);

  it('seals its progress records: garbage written over the newest is passed over, and a supervisor taking over reads the last whole one', async () => {
    const nc = await connectBus(server.url, 'store-sealed');
    try {
      const logs: string[] = [];
      const store = await JetStreamStore.open(nc, 'st3', { log: (l) => logs.push(l) });
      const good = { epoch: 1, iteration: 4, snapshot: 3, history: [], startedAt: 7, recoveries: [] };
      await store.saveProgress({ ...good, iteration: 3, snapshot: 2 });
      await store.saveProgress(good);
      const kv = await new Kvm(jetstream(nc)).open('ferry-st3');
      const record = encode({ type: 'progress', v: PROTOCOL_VERSION, ...good, iteration: 9 });
      const sealed = sealProgress(record);
      const forged = [
        new Uint8Array([0xc1, 0x00, 0xff]), // random bytes
        record, // a record without its seal
        Uint8Array.from([...sealed.subarray(0, 40), ...sealed.subarray(40).map((b, i) => (i === 3 ? b ^ 1 : b))]), // a seal that does not match
        sealProgress(encode({ type: 'progress', v: PROTOCOL_VERSION, epoch: 'x' })), // sealed, not a progress record
      ];
      for (const bytes of forged) await kv.put('progress', bytes);
      const taker = await JetStreamStore.open(nc, 'st3', { log: (l) => logs.push(l) });
      expect(await taker.loadProgress()).toEqual(good);
      expect(logs.join('\n')).toMatch(/not a sealed progress record \(3 bytes\): passed over/);
      expect(logs.join('\n')).toMatch(/its seal does not match its contents: passed over/);
      expect(logs).toHaveLength(4);
      // Nothing whole at all: no progress (the take-over starts the run again, as before any progress).
      const empty = await JetStreamStore.open(nc, 'st4', { log: () => {} });
      await (await new Kvm(jetstream(nc)).open('ferry-st4')).put('progress', forged[0]!);
      expect(await empty.loadProgress()).toBeUndefined();
    } finally {
      await nc.close();
    }
  }, 60_000);

  it('reads back what it wrote, not what others published on the subject since; a store without that memory refuses a bad record as missing', async () => {
    const nc = await connectBus(server.url, 'store-poison');
    try {
      const logs: string[] = [];
      const store = await JetStreamStore.open(nc, 'st2', { log: (l) => logs.push(l) });
      const tokens = Int32Array.from([5, 6, 7]);
      await store.saveStage(3, 'rollout', { ports: { tokens } });
      const subject = subjects('st2').results(3, 'rollout');
      const js = jetstream(nc);
      // Random bytes, a record of the wrong type, one of another version, one of another iteration.
      const forged = [
        new Uint8Array([0xc1, 0x00, 0xff]),
        encode({ type: 'progress', v: PROTOCOL_VERSION }),
        encode({ type: 'stage', v: PROTOCOL_VERSION + 1, iteration: 3, stage: 'rollout', value: {} }),
        encode({ type: 'stage', v: PROTOCOL_VERSION, iteration: 2, stage: 'rollout', value: { ports: { tokens: Int32Array.from([0]) } } }),
      ];
      for (const bytes of forged) await js.publish(subject, bytes);
      expect((await store.loadStage<{ ports: { tokens: Int32Array } }>(3, 'rollout'))!.ports.tokens).toEqual(tokens);
      // A supervisor that took the run over reads the newest record, checks it, and finds it bad.
      const other: string[] = [];
      const fresh = await JetStreamStore.open(nc, 'st2', { log: (l) => other.push(l) });
      expect(await fresh.loadStage(3, 'rollout')).toBeUndefined();
      expect(other[0]).toMatch(new RegExp(`the run store's ${subject.replace(/\./g, '\\.')} \\(message \\d+\\) holds the rollout of iteration 2: treated as missing, computed again`));
      for (const bytes of forged.slice(0, 3)) {
        await js.publish(subject, bytes);
        expect(await fresh.loadStage(3, 'rollout')).toBeUndefined();
      }
      expect(other.slice(1).join('\n')).toMatch(/does not read as a stage record/);
      expect(logs).toEqual([]);
    } finally {
      await nc.close();
    }
  }, 60_000);
});
