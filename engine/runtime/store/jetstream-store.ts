// The run's durable state in NATS JetStream, so that any process, the supervisor included, can die
// without losing it:
//   - KV bucket `ferry-<run>` key `progress`: where the supervisor is (engine/store.ts Progress),
//     sealed (its digest before it, after a mark naming the algorithm), the last few kept: a
//     take-over reads the newest whole one;
//   - stream `FERRY-<run>` on `ferry.<run>.results.<iteration>.<stage>`: each iteration's rollout
//     and scores, published with a Nats-Msg-Id so that a repeated publish is stored once, the
//     last few per subject kept. Nothing read back is trusted blindly: the supervisor keeps each
//     record's sequence number and digest when it writes it and reads that message back, checked;
//     a supervisor that started the run takes no record it did not write; one that took the run
//     over reads the newest record of the subject and checks its bytes, schema, version,
//     iteration and stage. A record that fails is treated as missing — the stage is computed
//     again, deterministically — and logged with its subject;
//   - Object Store `ferry-<run>-snapshots`: each snapshot's manifest (which device wrote which
//     rank of every kept model, with its size, digest and state digest), the last two kept;
//   - Object Stores `ferry-<run>-d<device>`: the shards' states themselves, each written by its own
//     device (mesh/wire/transfer/shelf.ts); the manifests' objects go when their manifest does.
// All three are file-backed, so they survive a restart of the server.
import { jetstreamManager, jetstream, type JetStreamClient, type JetStreamManager } from '@nats-io/jetstream';
import { Kvm, type KV, type KvEntry } from '@nats-io/kv';
import { Objm, type ObjectStore } from '@nats-io/obj';
import type { NatsConnection } from '@nats-io/transport-node';
import { ProtocolError, decode, encode } from '../../../mesh/wire/index.ts';
import {
  NatsShelf,
  PROTOCOL_VERSION,
  bucketNames,
  removeObject,
  ProgressRecord,
  SnapshotManifest,
  StageRecord,
  defaultReplicas,
  digestOf,
  rawDigest,
  type DigestAlgorithm,
  type Shelf,
} from '../../../mesh/wire/index.ts';
import { subjects, type Subjects } from '../../../mesh/wire/index.ts';
import type { Progress, RunStore, Snapshot, Stage } from './store.ts';
import { dropObjectsBefore, manifestObjects, readSnapshot } from './snapshots.ts';

/** Progress records the bucket keeps: the newest whole one is read back. */
const PROGRESS_KEPT = 8;
/**
 * The 4-byte marks of a sealed progress record, each naming its digest's algorithm: FSP2 (BLAKE3)
 * is written; FSP1 (SHA-256), what protocol version 6 and earlier wrote, still unseals.
 */
const SEALS: ReadonlyArray<{ mark: Uint8Array; algorithm: DigestAlgorithm }> = [
  { mark: new TextEncoder().encode('FSP2'), algorithm: 'blake3' },
  { mark: new TextEncoder().encode('FSP1'), algorithm: 'sha256' },
];
const MARK = 4;
const DIGEST = 32;

/** A record with its digest before it (after a 4-byte mark naming the algorithm, BLAKE3): what a take-over checks. */
export function sealProgress(bytes: Uint8Array): Uint8Array {
  const { mark, algorithm } = SEALS[0]!;
  const digest = rawDigest(bytes, algorithm);
  const out = new Uint8Array(MARK + DIGEST + bytes.length);
  out.set(mark, 0);
  out.set(digest, MARK);
  out.set(bytes, MARK + DIGEST);
  return out;
}

/** The record inside a sealed value (either mark), or a ProtocolError saying why it is not whole. */
export function unsealProgress(where: string, value: Uint8Array): Uint8Array {
  const seal = value.length >= MARK + DIGEST ? SEALS.find(({ mark }) => mark.every((b, i) => value[i] === b)) : undefined;
  if (!seal) throw new ProtocolError(where, `not a sealed progress record (${value.length} bytes)`);
  const body = value.subarray(MARK + DIGEST);
  if (!rawDigest(body, seal.algorithm).equals(value.subarray(MARK, MARK + DIGEST))) throw new ProtocolError(where, 'its seal does not match its contents');
  return body;
}

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
  /** The run's devices: their snapshot buckets are created when the store opens. */
  devices?: readonly number[];
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
    readonly shelf: Shelf,
    private readonly devices: Set<number>,
  ) {}

  /** Per results subject, the sequence number and digest of the record this store wrote. */
  private readonly written = new Map<string, { seq: number; digest: string }>();

  static async open(nc: NatsConnection, run: string, options: JetStreamStoreOptions = {}): Promise<JetStreamStore> {
    const subj = subjects(run);
    const timeout = options.timeoutMs ?? 5_000;
    const patience = options.patienceMs ?? 60_000;
    const replicas = options.replicas ?? defaultReplicas(nc);
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
    const kv = await patiently(`creating KV bucket ferry-${run}`, patience, () => new Kvm(js).create(`ferry-${run}`, { history: PROGRESS_KEPT, replicas }));
    const objects = await patiently(`creating object store ferry-${run}-snapshots`, patience, () => new Objm(js).create(`ferry-${run}-snapshots`, { replicas }));
    const shelf = new NatsShelf(nc, run, { timeoutMs: timeout, replicas });
    // Each device's bucket, made here: a worker may write into its own, not create one.
    const devices = options.devices ?? [];
    await Promise.all(devices.map((d) => patiently(`creating device ${d}'s snapshot bucket`, patience, () => shelf.create(d))));
    return new JetStreamStore(patience, run, subj, js, jsm, stream, kv, objects, options.log ?? (() => {}), options.ownOnly ?? false, shelf, new Set(devices));
  }

  /** The progress record, sealed: its digest before it (sealProgress). */
  async saveProgress(p: Progress): Promise<void> {
    const bytes = sealProgress(encode({ type: 'progress', v: PROTOCOL_VERSION, ...p }));
    await patiently('saving progress', this.patienceMs, () => this.kv.put('progress', bytes));
  }

  /**
   * The newest progress record that is whole: the bucket keeps the last few, and one that is not
   * sealed, or whose seal or contents do not check, is passed over (and said), so that garbage
   * written there cannot stop a supervisor from taking the run over.
   */
  async loadProgress(): Promise<Progress | undefined> {
    const entries = await patiently('reading progress', this.patienceMs, async () => {
      const out: KvEntry[] = [];
      for await (const e of await this.kv.history({ key: 'progress' })) out.push(e);
      return out;
    });
    for (const entry of entries.reverse()) {
      if (entry.operation !== 'PUT' || entry.value.length === 0) continue;
      const where = `KV ferry-${this.run}/progress (revision ${entry.revision})`;
      try {
        const { type: _t, v: _v, ...p } = decode(where, unsealProgress(where, entry.value), ProgressRecord);
        return p;
      } catch (e) {
        this.log(`${(e as Error).message}: passed over for the record before it`);
      }
    }
    return undefined;
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
    if (!ack.duplicate) this.written.set(subject, { seq: ack.seq, digest: digestOf(bytes) });
    else if (!this.written.has(subject)) this.written.set(subject, { seq: ack.seq, digest: '' }); // written before this store: its bytes are checked as read
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
    if (mine?.digest && digestOf(msg.data) !== mine.digest) return refuse('is not the record this supervisor wrote (its digest differs)');
    let record: { iteration: number; stage: string; value: Record<string, unknown> };
    try {
      record = decode(subject, msg.data, StageRecord);
    } catch (e) {
      return refuse(`does not read as a stage record: ${(e as Error).message}`);
    }
    if (record.iteration !== iteration || record.stage !== stage) return refuse(`holds the ${record.stage} of iteration ${record.iteration}`);
    return record.value as T;
  }

  async saveSnapshot(manifest: SnapshotManifest): Promise<{ bytes: number }> {
    const { iteration } = manifest;
    const bytes = encode(manifest);
    await patiently(`storing the snapshot manifest after iteration ${iteration}`, this.patienceMs, () => this.objects.putBlob({ name: `snapshot-${iteration}` }, bytes));
    for (const o of manifestObjects(manifest)) this.devices.add(o.device);
    await this.dropOlderSnapshots();
    return { bytes: bytes.length };
  }

  /** Entries that could not be dropped: said once each. */
  private readonly unreadable = new Set<string>();

  /**
   * Keeps the two newest snapshots (the one just saved and the one before it, whatever iterations
   * they follow: a failure while the newer was written leaves the older whole) and deletes the
   * rest: older manifests, and every object of an older snapshot in the devices' buckets — named
   * by a manifest or not (a snapshot that failed part-way, a write a recovery abandoned). Found by
   * the names in the buckets' metadata subjects, nothing read; an entry that is not a snapshot's
   * (anyone who may write the bucket could leave one) is left alone. Best effort: what a failure
   * leaves, the next save deletes.
   */
  private async dropOlderSnapshots(): Promise<void> {
    const bucket = `ferry-${this.run}-snapshots`;
    let iterations: number[];
    try {
      iterations = await this.snapshotIterations();
    } catch (e) {
      this.log(`could not list the snapshots to drop: ${(e as Error).message}`);
      return;
    }
    if (iterations.length < 2) return;
    const cut = iterations[1]!;
    const quietly = async (what: string, op: () => Promise<unknown>) => {
      try {
        await op();
      } catch (e) {
        if (!this.unreadable.has(what)) this.log(`could not drop ${what} (${(e as Error).message}): left as it is`);
        this.unreadable.add(what);
      }
    };
    for (const i of iterations.slice(2)) {
      const name = `snapshot-${i}`;
      await quietly(`the run store's snapshot manifest ${name}`, () => removeObject(this.objects, bucket, name, this.jsm));
    }
    await Promise.all([...this.devices].map((device) => quietly(`device ${device}'s snapshot objects before iteration ${cut}`, () => dropObjectsBefore(this.shelf, device, cut))));
  }

  loadManifest(iteration: number): Promise<SnapshotManifest | undefined> {
    return this.readManifest(iteration);
  }

  async previousSnapshot(iteration: number): Promise<number | undefined> {
    return (await patiently('listing the snapshots', this.patienceMs, () => this.snapshotIterations())).find((i) => i < iteration);
  }

  /**
   * The iterations of the snapshots whose manifests the run's bucket names, newest first (-1: the
   * one after setup), from the names in its metadata subjects: nothing is read. A deleted one's
   * marker, left by a server killed before its purge, is among them until the next save.
   */
  private async snapshotIterations(): Promise<number[]> {
    return (await bucketNames(this.jsm, `ferry-${this.run}-snapshots`))
      .flatMap((name) => /^snapshot-(-?\d+)$/.exec(name)?.[1] ?? [])
      .map(Number)
      .sort((a, b) => b - a);
  }

  /** The manifest of the snapshot after `iteration`, checked; undefined where there is none. */
  private async readManifest(iteration: number): Promise<SnapshotManifest | undefined> {
    const bytes = await patiently(`reading the snapshot manifest after iteration ${iteration}`, this.patienceMs, () => this.objects.getBlob(`snapshot-${iteration}`));
    if (!bytes) return undefined;
    const m = decode(`object ferry-${this.run}-snapshots/snapshot-${iteration}`, bytes, SnapshotManifest);
    if (m.iteration !== iteration) throw new ProtocolError(`object ferry-${this.run}-snapshots/snapshot-${iteration}`, `holds the manifest of iteration ${m.iteration}`);
    return m;
  }

  async loadSnapshot(iteration: number): Promise<Snapshot | undefined> {
    const m = await this.readManifest(iteration);
    // Each object is read as patiently as the rest of the store (a cluster electing a leader).
    const shelf = { get: (device: number, object: string) => patiently(`reading ${object} from device ${device}'s bucket`, this.patienceMs, () => this.shelf.get(device, object)) };
    return m && readSnapshot(shelf, m, `the snapshot after iteration ${iteration} (manifest ferry-${this.run}-snapshots/snapshot-${iteration})`);
  }

  async close(): Promise<void> {}
}
