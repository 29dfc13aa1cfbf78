// The run's durable state in NATS JetStream, so that any process, the supervisor included, can die
// without losing it:
//   - KV bucket `ferry-<run>` key `progress`: where the supervisor is (engine/store.ts Progress);
//   - stream `FERRY-<run>` on `ferry.<run>.results.<iteration>.<stage>`: each iteration's rollout
//     and scores, published with a Nats-Msg-Id so that a repeated publish is stored once;
//   - Object Store `ferry-<run>-snapshots`: every shard's state after an iteration (the same
//     record as a run directory's checkpoint.msgpack), the last two kept.
// All three are file-backed, so they survive a restart of the server.
import { jetstreamManager, jetstream, type JetStreamClient, type JetStreamManager } from '@nats-io/jetstream';
import { Kvm, type KV } from '@nats-io/kv';
import { Objm, type ObjectStore } from '@nats-io/obj';
import type { NatsConnection } from '@nats-io/transport-node';
import { decode, encode } from '../mesh/codec.ts';
import { CheckpointFile, PROTOCOL_VERSION, ProgressRecord, StageRecord } from '../mesh/protocol.ts';
import { subjects, type Subjects } from '../mesh/subjects.ts';
import type { CheckpointSet } from '../engine/rlhf.ts';
import type { Progress, RunStore, Stage } from '../engine/store.ts';

export interface JetStreamStoreOptions {
  /** Copies of each stream on a clustered server (1, 3 or 5). */
  replicas?: number;
  /** How long a JetStream request may take (a cluster electing a leader takes seconds). */
  timeoutMs?: number;
}

export class JetStreamStore implements RunStore {
  private constructor(
    private readonly run: string,
    private readonly subj: Subjects,
    private readonly js: JetStreamClient,
    private readonly jsm: JetStreamManager,
    private readonly stream: string,
    private readonly kv: KV,
    private readonly objects: ObjectStore,
  ) {}

  static async open(nc: NatsConnection, run: string, options: JetStreamStoreOptions = {}): Promise<JetStreamStore> {
    const subj = subjects(run);
    const timeout = options.timeoutMs ?? 20_000;
    const replicas = options.replicas ?? 1;
    const jsm = await jetstreamManager(nc, { timeout });
    const js = jetstream(nc, { timeout });
    const stream = `FERRY-${run}`;
    try {
      await jsm.streams.info(stream);
    } catch {
      await jsm.streams.add({ name: stream, subjects: [subj.allResults], max_msgs_per_subject: 1, num_replicas: replicas });
    }
    const kv = await new Kvm(js).create(`ferry-${run}`, { history: 1, replicas });
    const objects = await new Objm(js).create(`ferry-${run}-snapshots`, { replicas });
    return new JetStreamStore(run, subj, js, jsm, stream, kv, objects);
  }

  async saveProgress(p: Progress): Promise<void> {
    await this.kv.put('progress', encode({ type: 'progress', v: PROTOCOL_VERSION, ...p }));
  }

  async loadProgress(): Promise<Progress | undefined> {
    const entry = await this.kv.get('progress');
    if (!entry || entry.operation !== 'PUT' || entry.value.length === 0) return undefined;
    const { type: _t, v: _v, ...p } = decode(`KV ferry-${this.run}/progress`, entry.value, ProgressRecord);
    return p;
  }

  async saveStage(iteration: number, stage: Stage, value: unknown): Promise<void> {
    // The id makes a second publish of the same result (a retry, a replayed stage) a no-op.
    await this.js.publish(this.subj.results(iteration, stage), encode({ type: 'stage', v: PROTOCOL_VERSION, iteration, stage, value: value as Record<string, unknown> }), {
      msgID: `${this.run}.${iteration}.${stage}`,
    });
  }

  async loadStage<T>(iteration: number, stage: Stage): Promise<T | undefined> {
    const subject = this.subj.results(iteration, stage);
    let msg;
    try {
      msg = await this.jsm.streams.getMessage(this.stream, { last_by_subj: subject });
    } catch (e) {
      if (/no message found|not found/i.test((e as Error).message)) return undefined;
      throw e;
    }
    if (!msg) return undefined;
    return decode(subject, msg.data, StageRecord).value as T;
  }

  async saveSnapshot(iteration: number, set: CheckpointSet): Promise<{ bytes: number }> {
    const bytes = encode({ type: 'checkpoint', v: PROTOCOL_VERSION, iteration, ...set });
    await this.objects.putBlob({ name: `snapshot-${iteration}` }, bytes);
    // Keep the one before too: a failure while this one was being written leaves that one whole.
    for await (const info of await this.objects.list()) {
      const n = Number(info.name.replace('snapshot-', ''));
      if (!info.deleted && n < iteration - 1) await this.objects.delete(info.name);
    }
    return { bytes: bytes.length };
  }

  async loadSnapshot(iteration: number): Promise<CheckpointSet | undefined> {
    const bytes = await this.objects.getBlob(`snapshot-${iteration}`);
    if (!bytes) return undefined;
    const c = decode(`object ferry-${this.run}-snapshots/snapshot-${iteration}`, bytes, CheckpointFile);
    return { actor: c.actor, critic: c.critic, reference: c.reference };
  }

  async close(): Promise<void> {}
}
