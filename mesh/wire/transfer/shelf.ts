// Where devices write their snapshots: one JetStream object store per device of a run
// (`ferry-<run>-d<device>`), which only that device's worker may write (auth.ts) and the
// supervisor reads and prunes. A snapshot's manifest (the supervisor's, in the run's own bucket)
// names each object with its digest (BLAKE3, digest.ts), so an object changed after it was
// written is caught on reading. The object store's own metadata keeps its SHA-256, which `nats
// object get` checks, and a read checks it too. In one process (local runs, unit tests) the
// shelf is a map.
import { createHash } from 'node:crypto';
import { jetstream, jetstreamManager, type JetStreamClient, type JetStreamManager } from '@nats-io/jetstream';
import { headers, nuid } from '@nats-io/transport-node';
import { Objm, type ObjectStore } from '@nats-io/obj';
import type { NatsConnection } from '@nats-io/transport-node';
import { token } from '../bus/subjects.ts';
import { digestOf } from './digest.ts';

export interface Shelf {
  /** Writes `object` into `device`'s bucket (replacing one of that name); returns the bytes' digest (digestOf: BLAKE3), for a manifest. */
  put(device: number, object: string, bytes: Uint8Array): Promise<string>;
  /** The object's bytes, or undefined where the bucket or the object is not there. */
  get(device: number, object: string): Promise<Uint8Array | undefined>;
  /** Deletes the object where it is there. */
  delete(device: number, object: string): Promise<void>;
  /** Names of the objects the device's bucket holds (as its metadata lists them). */
  names(device: number): Promise<string[]>;
}

/** The object store of a run's device. */
export const deviceBucket = (run: string, device: number): string => `ferry-${token('run id', run)}-d${device}`;

/** An object that is there but not whole: a chunk missing, or bytes that do not match its own metadata. Not worth trying again. */
export class ObjectError extends Error {
  override name = 'ObjectError';
}

/** Names of the objects a bucket of the object store holds (a deletion marker's too), from its metadata subjects: nothing is read. */
export async function bucketNames(jsm: JetStreamManager, bucket: string): Promise<string[]> {
  const prefix = `$O.${bucket}.M.`;
  const info = await jsm.streams.info(`OBJ_${bucket}`, { subjects_filter: `${prefix}>` });
  return Object.keys(info.state.subjects ?? {}).map((subject) => Buffer.from(subject.slice(prefix.length), 'base64url').toString());
}

/** Removes an object from a bucket of the object store (see NatsShelf.delete). */
export async function removeObject(b: ObjectStore | undefined, bucket: string, object: string, jsm: JetStreamManager): Promise<void> {
  const info = await b?.info(object);
  if (!info) return;
  if (!info.deleted) await b!.delete(object);
  await jsm.streams.purge(`OBJ_${bucket}`, { filter: metaSubject(bucket, object) });
}

/** Chunks of an object in flight at once while it is written. */
const WINDOW = 16;

/** Base64, URL-safe, padded: how the object store names metadata subjects and writes digests. */
const urlPadded = (bytes: Uint8Array): string => Buffer.from(bytes).toString('base64').replace(/\+/g, '-').replace(/\//g, '_');

/** The subject an object store keeps an object's metadata on. */
export const metaSubject = (bucket: string, object: string): string => `$O.${bucket}.M.${urlPadded(Buffer.from(object))}`;

/** Copies of each JetStream stream: FERRY_JS_REPLICAS, else 3 on a clustered server, else 1. */
export const defaultReplicas = (nc: NatsConnection): number => Number(process.env.FERRY_JS_REPLICAS ?? (nc.info?.cluster ? 3 : 1));

/** A shelf in this process's memory. */
export class MemoryShelf implements Shelf {
  private readonly objects = new Map<string, Uint8Array>();
  async put(device: number, object: string, bytes: Uint8Array): Promise<string> {
    this.objects.set(`${device}/${object}`, bytes.slice());
    return digestOf(bytes);
  }
  async get(device: number, object: string): Promise<Uint8Array | undefined> {
    return this.objects.get(`${device}/${object}`);
  }
  async delete(device: number, object: string): Promise<void> {
    this.objects.delete(`${device}/${object}`);
  }
  async names(device: number): Promise<string[]> {
    return [...this.objects.keys()].filter((k) => k.startsWith(`${device}/`)).map((k) => k.slice(`${device}/`.length));
  }
  /** Every object held, as `device/object` (for tests). */
  all(): string[] {
    return [...this.objects.keys()];
  }
}

/**
 * A run's device buckets over NATS. A worker writes its own bucket (created on its first write,
 * with the run's replication); the supervisor opens any to read or prune it.
 */
export class NatsShelf implements Shelf {
  private readonly buckets = new Map<number, ObjectStore>();
  private client?: JetStreamClient;
  private manager?: Promise<JetStreamManager>;
  private js(): JetStreamClient {
    this.client ??= jetstream(this.nc, { timeout: this.options.timeoutMs ?? 10_000 });
    return this.client;
  }
  private jsm(): Promise<JetStreamManager> {
    this.manager ??= jetstreamManager(this.nc, { timeout: this.options.timeoutMs ?? 10_000 });
    this.manager.catch(() => (this.manager = undefined));
    return this.manager;
  }

  constructor(
    private readonly nc: NatsConnection,
    private readonly run: string,
    /**
     * `patienceMs`: how long a write or a read keeps being tried after a failure (a cluster
     * electing a leader after a server died); a worker's shelf waits, the run store's retries itself.
     */
    private readonly options: { timeoutMs?: number; replicas?: number; patienceMs?: number } = {},
  ) {}

  /** `op` until it succeeds or the patience is spent; the last failure is the one thrown. */
  private async patiently<T>(op: () => Promise<T>): Promise<T> {
    const deadline = Date.now() + (this.options.patienceMs ?? 0);
    for (let attempt = 1; ; attempt++) {
      try {
        return await op();
      } catch (e) {
        if (e instanceof ObjectError || Date.now() >= deadline) throw e;
        await new Promise((r) => setTimeout(r, Math.min(1000, 100 * attempt)));
      }
    }
  }

  /** Creates the device's bucket where it is not there (the supervisor does, for every device of the run, before any writes). */
  async create(device: number): Promise<void> {
    if (this.buckets.has(device)) return;
    const b = await new Objm(this.js()).create(deviceBucket(this.run, device), { replicas: this.options.replicas ?? defaultReplicas(this.nc) });
    this.buckets.set(device, b);
  }

  /** The device's bucket, opened; undefined where it is not there. */
  private async bucket(device: number): Promise<ObjectStore | undefined> {
    const held = this.buckets.get(device);
    if (held) return held;
    let b: ObjectStore;
    try {
      b = await new Objm(this.js()).open(deviceBucket(this.run, device));
    } catch (e) {
      if (/not found/i.test((e as Error).message)) return undefined;
      throw e;
    }
    this.buckets.set(device, b);
    return b;
  }

  async names(device: number): Promise<string[]> {
    try {
      return await bucketNames(await this.jsm(), deviceBucket(this.run, device));
    } catch (e) {
      if (/not found/i.test((e as Error).message)) return [];
      throw e;
    }
  }

  /**
   * Writes the object as the object store lays it out (its chunks, then its metadata; `nats
   * object get` reads it), with up to WINDOW chunks in flight and the SHA-256 taken by node's
   * crypto: the store's own writer awaits each chunk's acknowledgement in turn and hashes in
   * JavaScript, which made a 6 MiB write take 130 ms instead of 30. The metadata's digest stays
   * SHA-256 (the object store's format); what the write returns is the manifest's, digestOf.
   */
  put(device: number, object: string, bytes: Uint8Array): Promise<string> {
    return this.patiently(() => this.putOnce(device, object, bytes));
  }

  private async putOnce(device: number, object: string, bytes: Uint8Array): Promise<string> {
    const b = await this.bucket(device);
    if (!b) throw new Error(`device ${device}'s snapshot bucket ${deviceBucket(this.run, device)} is not there (the supervisor creates it when it opens the run's store)`);
    const bucket = deviceBucket(this.run, device);
    const js = this.js();
    const chunk = this.nc.info?.max_payload ?? 1 << 20;
    const id = nuid.next();
    const chunks = `$O.${bucket}.C.${id}`;
    const old = await b.info(object);
    const digest = createHash('sha256').update(bytes).digest();
    try {
      // A bounded window of chunks in flight. Each acknowledgement is handled as it is asked for
      // (one that fails while an earlier one is awaited is never an unhandled rejection), and on a
      // failure every one sent has settled before its chunks are purged.
      const inFlight: Promise<void>[] = [];
      let failed: { error: unknown } | undefined;
      for (let at = 0; at < bytes.length && failed === undefined; at += chunk) {
        if (inFlight.length >= WINDOW) await inFlight.shift();
        inFlight.push(
          js.publish(chunks, bytes.subarray(at, at + chunk)).then(
            () => {},
            (error: unknown) => void (failed ??= { error }),
          ),
        );
      }
      await Promise.all(inFlight);
      if (failed !== undefined) throw failed.error;
      const info = {
        name: object,
        description: '',
        options: { max_chunk_size: chunk },
        bucket,
        nuid: id,
        size: bytes.length,
        chunks: Math.ceil(bytes.length / chunk),
        mtime: new Date().toISOString(),
        digest: `SHA-256=${urlPadded(digest)}`,
        deleted: false,
      };
      const h = headers();
      h.set('Nats-Rollup', 'sub');
      await js.publish(metaSubject(bucket, object), JSON.stringify(info), { headers: h });
    } catch (e) {
      await (await this.jsm()).streams.purge(`OBJ_${bucket}`, { filter: chunks }).catch(() => {});
      throw e;
    }
    // The object it replaced: its chunks go (its metadata was rolled up by the new one's).
    if (old && !old.deleted) await (await this.jsm()).streams.purge(`OBJ_${bucket}`, { filter: `$O.${bucket}.C.${old.nuid}` }).catch(() => {});
    return digestOf(bytes);
  }

  /** The object's chunks, one direct get each (next by subject), checked against its metadata's size and SHA-256. */
  get(device: number, object: string): Promise<Uint8Array | undefined> {
    return this.patiently(() => this.getOnce(device, object));
  }

  private async getOnce(device: number, object: string): Promise<Uint8Array | undefined> {
    const b = await this.bucket(device);
    const info = await b?.info(object);
    if (!info || info.deleted) return undefined;
    const jsm = await this.jsm();
    const stream = `OBJ_${deviceBucket(this.run, device)}`;
    const subject = `$O.${deviceBucket(this.run, device)}.C.${info.nuid}`;
    const out = new Uint8Array(info.size);
    let at = 0;
    let seq = 0;
    for (let i = 0; i < info.chunks; i++) {
      const m = await jsm.direct.getMessage(stream, { seq: seq + 1, next_by_subj: subject });
      if (!m || at + m.data.length > out.length)
        throw new Error(`object ${JSON.stringify(object)} of device ${device}'s bucket: chunk ${i} of ${info.chunks} ${m ? 'overruns its size' : 'is missing'}`);
      out.set(m.data, at);
      at += m.data.length;
      seq = m.seq;
    }
    const expected = info.digest.replace(/^SHA-256=/, '');
    if (at !== out.length || urlPadded(createHash('sha256').update(out).digest()) !== expected)
      throw new ObjectError(`object ${JSON.stringify(object)} of device ${device}'s bucket does not match its metadata (${at} of ${out.length} bytes, or its SHA-256)`);
    return out;
  }

  /**
   * Removes the object: a deletion marker replaces its metadata and its chunks are purged (the
   * store's delete), then the marker is purged too, so that a bucket's names do not grow with
   * every object it ever held. A purge is not on disk at once: a server killed just after may
   * bring the marker back (the object reads as deleted) or the chunks (read by nothing).
   */
  async delete(device: number, object: string): Promise<void> {
    const b = await this.bucket(device);
    await removeObject(b, deviceBucket(this.run, device), object, await this.jsm());
  }
}
