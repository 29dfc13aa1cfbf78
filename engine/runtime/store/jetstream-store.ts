// The run's durable state in NATS JetStream, so that any process, the supervisor included, can die
// without losing it:
//   - KV bucket `ferry-<run>` key `progress`: where the supervisor is (engine/store.ts Progress);
//   - stream `FERRY-<run>` on `ferry.<run>.results.<iteration>.<stage>`: each iteration's rollout
//     and scores, published with a Nats-Msg-Id so that a repeated publish is stored once, the
//     last few per subject kept. Nothing read back is trusted blindly: the supervisor keeps each
//     record's sequence number and SHA-256 when it writes it and reads that message back, checked;
//     a supervisor that started the run takes no record it did not write; one that took the run
//     over reads the newest record of the subject and checks its bytes, schema, version,
//     iteration and stage. A record that fails is treated as missing — the stage is computed
//     again, deterministically — and logged with its subject;
//   - Object Store `ferry-<run>-snapshots`: every shard's state after an iteration (the same
//     record as a run directory's checkpoint.msgpack), the last two kept.
// All three are file-backed, so they survive a restart of the server.
import { jetstreamManager, jetstream, type JetStreamClient, type JetStreamManager } from '@nats-io/jetstream';
import { Kvm, type KV } from '@nats-io/kv';
import { Objm, type ObjectStore } from '@nats-io/obj';
import type { NatsConnection } from '@nats-io/transport-node';
import { decode, encode } from '../../../mesh/wire/index.ts';
import { CheckpointFile, PROTOCOL_VERSION, ProgressRecord, StageRecord } from '../../../mesh/wire/index.ts';
import { createHash } from 'node:crypto';
import { subjects, type Subjects } from '../../../mesh/wire/index.ts';
import type { CheckpointSet } from '../run/setup.ts';
import type { Progress, RunStore, Stage } from './store.ts';

export interface JetStreamStoreOptions {
  /** Copies of each stream (1, 3 or 5); default 3 on a clustered server, else 1. */
  replicas?: number;
  /** How long one JetStream request may take before it is tried again. */
  timeoutMs?: number;
  /** How long an operation keeps being tried (a cluster electing a leader, a server restarting). */
  patienceMs?: number;
  /** Where a record that fails its checks is reported. */
  log?: (line: string) => void;
  /**
   * The supervisor started the run (it did not take it over): every record it may use, it wrote,
   * so one it did not write is treated as missing, however well it reads.
   */
  ownOnly?: boolean;
}

/** Messages kept per results subject: a few forged ones after the real record do not push it out. */
const KEPT_PER_SUBJECT = 16;

/** Tries `op` until it succeeds or `patienceMs` has passed; the last error says what failed. */
async function patiently<T>(what: string, patienceMs: number, op: () => Promise<T>): Promise<T> {
  const deadline = Date.now() + patienceMs;
  for (let attempt = 1; ; attempt++) {
    try {
      return await op();
    } catch (e) {
      if (Date.now() > deadline) throw new Error(`JetStream: ${what} failed ${attempt} time(s) over ${patienceMs / 1000} s; last: ${(e as Error).message}`, { cause: e });
      await new Promise((r) => setTimeout(r, Math.min(1000, 100 * attempt)));
    }
  }
}

export class JetStreamStore implements RunStore {
  private constructor(
    private readonly patienceMs: number,
    private readonly run: string,
    private readonly subj: Subjects,
    private readonly js: JetStreamClient,
    private readonly jsm: JetStreamManager,
    private readonly stream: string,
    private readonly kv: KV,
    private readonly objects: ObjectStore,
    private readonly log: (line: string) => void,
    private readonly ownOnly: boolean,
  ) {}

  /** Per results subject, the sequence number and SHA-256 of the record this store wrote. */
  private readonly written = new Map<string, { seq: number; sha256: string }>();

  static async open(nc: NatsConnection, run: string, options: JetStreamStoreOptions = {}): Promise<JetStreamStore> {
    const subj = subjects(run);
    const timeout = options.timeoutMs ?? 5_000;
    const patience = options.patienceMs ?? 60_000;
    const replicas = options.replicas ?? Number(process.env.FERRY_JS_REPLICAS ?? (nc.info?.cluster ? 3 : 1));
    const jsm = await patiently('connecting to JetStream', patience, () => jetstreamManager(nc, { timeout }));
    const js = jetstream(nc, { timeout });
    const stream = `FERRY-${run}`;
    await patiently(`creating stream ${stream}`, patience, async () => {
      try {
        await jsm.streams.info(stream);
      } catch {
        await jsm.streams.add({ name: stream, subjects: [subj.allResults], max_msgs_per_subject: KEPT_PER_SUBJECT, num_replicas: replicas });
      }
    });
    const kv = await patiently(`creating KV bucket ferry-${run}`, patience, () => new Kvm(js).create(`ferry-${run}`, { history: 1, replicas }));
    const objects = await patiently(`creating object store ferry-${run}-snapshots`, patience, () => new Objm(js).create(`ferry-${run}-snapshots`, { replicas }));
    return new JetStreamStore(patience, run, subj, js, jsm, stream, kv, objects, options.log ?? (() => {}), options.ownOnly ?? false);
  }

  async saveProgress(p: Progress): Promise<void> {
    const bytes = encode({ type: 'progress', v: PROTOCOL_VERSION, ...p });
    await patiently('saving progress', this.patienceMs, () => this.kv.put('progress', bytes));
  }

  async loadProgress(): Promise<Progress | undefined> {
    const entry = await patiently('reading progress', this.patienceMs, () => this.kv.get('progress'));
    if (entry?.operation !== 'PUT' || entry.value.length === 0) return undefined;
    const { type: _t, v: _v, ...p } = decode(`KV ferry-${this.run}/progress`, entry.value, ProgressRecord);
    return p;
  }

  async saveStage(iteration: number, stage: Stage, value: unknown): Promise<void> {
    // The id makes a second publish of the same result (a retry, a replayed stage) a no-op: the
    // acknowledgement then names the first one's sequence number.
    const subject = this.subj.results(iteration, stage);
    const bytes = encode({ type: 'stage', v: PROTOCOL_VERSION, iteration, stage, value: value as Record<string, unknown> });
    const store = (msgID?: string) => patiently(`storing the ${stage} of iteration ${iteration}`, this.patienceMs, () => this.js.publish(subject, bytes, msgID ? { msgID } : {}));
    let ack = await store(`${this.run}.${iteration}.${stage}`);
    // Someone else's record holds the id, and it cannot be this supervisor's: stored all the same.
    if (ack.duplicate && this.ownOnly && !this.written.has(subject)) ack = await store();
    if (!ack.duplicate) this.written.set(subject, { seq: ack.seq, sha256: sha256(bytes) });
    else if (!this.written.has(subject)) this.written.set(subject, { seq: ack.seq, sha256: '' }); // written before this store: its bytes are checked as read
  }

  async loadStage<T>(iteration: number, stage: Stage): Promise<T | undefined> {
    const subject = this.subj.results(iteration, stage);
    const mine = this.written.get(subject);
    const msg = await patiently(`reading the ${stage} of iteration ${iteration}`, this.patienceMs, async () => {
      try {
        return await this.jsm.streams.getMessage(this.stream, mine ? { seq: mine.seq } : { last_by_subj: subject });
      } catch (e) {
        if (/no message found|not found/i.test((e as Error).message)) return null;
        throw e;
      }
    });
    if (!msg) return undefined;
    const refuse = (why: string) => {
      this.log(`the run store's ${subject} (message ${msg.seq}) ${why}: treated as missing, computed again`);
      return undefined;
    };
    if (msg.subject !== subject) return refuse(`is on ${msg.subject}`);
    if (!mine && this.ownOnly) return refuse('is not a record this supervisor wrote, and it started the run');
    if (mine?.sha256 && sha256(msg.data) !== mine.sha256) return refuse('is not the record this supervisor wrote (its SHA-256 differs)');
    let record: { iteration: number; stage: string; value: Record<string, unknown> };
    try {
      record = decode(subject, msg.data, StageRecord);
    } catch (e) {
      return refuse(`does not read as a stage record: ${(e as Error).message}`);
    }
    if (record.iteration !== iteration || record.stage !== stage) return refuse(`holds the ${record.stage} of iteration ${record.iteration}`);
    return record.value as T;
  }

  async saveSnapshot(iteration: number, set: CheckpointSet): Promise<{ bytes: number }> {
    const bytes = encode({ type: 'checkpoint', v: PROTOCOL_VERSION, iteration, models: set });
    await patiently(`storing the snapshot after iteration ${iteration}`, this.patienceMs, () => this.objects.putBlob({ name: `snapshot-${iteration}` }, bytes));
    // Keep the one before too: a failure while this one was being written leaves that one whole.
    await this.dropSnapshotsBefore(iteration - 1);
    return { bytes: bytes.length };
  }

  /** Entries of the snapshot bucket that did not read: said once each. */
  private readonly unreadable = new Set<string>();

  /**
   * Deletes the snapshots before `iteration`, found by the names in the bucket's metadata
   * subjects, not by reading every entry: an entry that does not read (anyone who may write the
   * bucket could leave one) is left alone and said once, and the snapshots are saved all the same.
   * Best effort: what a failure leaves, the next save deletes.
   */
  private async dropSnapshotsBefore(iteration: number): Promise<void> {
    const bucket = `ferry-${this.run}-snapshots`;
    const prefix = `$O.${bucket}.M.`;
    let names: string[];
    try {
      const info = await this.jsm.streams.info(`OBJ_${bucket}`, { subjects_filter: `${prefix}>` });
      names = Object.keys(info.state.subjects ?? {}).map((subject) => Buffer.from(subject.slice(prefix.length), 'base64url').toString());
    } catch (e) {
      this.log(`could not list the snapshots to drop: ${(e as Error).message}`);
      return;
    }
    for (const name of names) {
      const n = /^snapshot-(-?\d+)$/.exec(name); // -1: the one taken after setup
      if (!n || Number(n[1]) >= iteration) continue;
      try {
        const info = await this.objects.info(name);
        if (info && !info.deleted) await this.objects.delete(name);
      } catch (e) {
        if (!this.unreadable.has(name)) this.log(`the run store's snapshot entry ${JSON.stringify(name)} does not read (${(e as Error).message}): left as it is`);
        this.unreadable.add(name);
      }
    }
  }

  async loadSnapshot(iteration: number): Promise<CheckpointSet | undefined> {
    const bytes = await patiently(`reading the snapshot after iteration ${iteration}`, this.patienceMs, () => this.objects.getBlob(`snapshot-${iteration}`));
    if (!bytes) return undefined;
    const c = decode(`object ferry-${this.run}-snapshots/snapshot-${iteration}`, bytes, CheckpointFile);
    return c.models;
  }

  async close(): Promise<void> {}
}

const sha256 = (bytes: Uint8Array) => createHash('sha256').update(bytes).digest('hex');
