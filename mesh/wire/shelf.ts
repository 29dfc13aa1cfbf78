// Where devices write their snapshots: one JetStream object store per device of a run
// (`ferry-<run>-d<device>`), which only that device's worker may write (auth.ts) and the
// supervisor reads and prunes. A snapshot's manifest (the supervisor's, in the run's own bucket)
// names each object with its SHA-256, so an object changed after it was written is caught on
// reading. In one process (local runs, unit tests) the shelf is a map.
import { createHash } from 'node:crypto';
import { jetstream } from '@nats-io/jetstream';
import { Objm, type ObjectStore } from '@nats-io/obj';
import type { NatsConnection } from '@nats-io/transport-node';
import { token } from './subjects.ts';

export interface Shelf {
  /** Writes `object` into `device`'s bucket (replacing one of that name); returns the bytes' SHA-256. */
  put(device: number, object: string, bytes: Uint8Array): Promise<string>;
  /** The object's bytes, or undefined where the bucket or the object is not there. */
  get(device: number, object: string): Promise<Uint8Array | undefined>;
  /** Deletes the object where it is there. */
  delete(device: number, object: string): Promise<void>;
}

/** The object store of a run's device. */
export const deviceBucket = (run: string, device: number): string => `ferry-${token('run id', run)}-d${device}`;

export const sha256Hex = (bytes: Uint8Array): string => createHash('sha256').update(bytes).digest('hex');

/** Copies of each JetStream stream: FERRY_JS_REPLICAS, else 3 on a clustered server, else 1. */
export const defaultReplicas = (nc: NatsConnection): number => Number(process.env.FERRY_JS_REPLICAS ?? (nc.info?.cluster ? 3 : 1));

/** A shelf in this process's memory. */
export class MemoryShelf implements Shelf {
  private readonly objects = new Map<string, Uint8Array>();
  async put(device: number, object: string, bytes: Uint8Array): Promise<string> {
    this.objects.set(`${device}/${object}`, bytes.slice());
    return sha256Hex(bytes);
  }
  async get(device: number, object: string): Promise<Uint8Array | undefined> {
    return this.objects.get(`${device}/${object}`);
  }
  async delete(device: number, object: string): Promise<void> {
    this.objects.delete(`${device}/${object}`);
  }
  /** The objects held, as `device/object` (for tests). */
  names(): string[] {
    return [...this.objects.keys()];
  }
}

/**
 * A run's device buckets over NATS. A worker writes its own bucket (created on its first write,
 * with the run's replication); the supervisor opens any to read or prune it.
 */
export class NatsShelf implements Shelf {
  private readonly buckets = new Map<number, ObjectStore>();

  constructor(
    private readonly nc: NatsConnection,
    private readonly run: string,
    private readonly options: { timeoutMs?: number; replicas?: number } = {},
  ) {}

  /** The device's bucket: created where `create` (its own worker's first write), else opened; undefined where it is not there. */
  private async bucket(device: number, create: boolean): Promise<ObjectStore | undefined> {
    const held = this.buckets.get(device);
    if (held) return held;
    const objm = new Objm(jetstream(this.nc, { timeout: this.options.timeoutMs ?? 10_000 }));
    const name = deviceBucket(this.run, device);
    let b: ObjectStore;
    if (create) b = await objm.create(name, { replicas: this.options.replicas ?? defaultReplicas(this.nc) });
    else {
      try {
        b = await objm.open(name);
      } catch (e) {
        if (/not found/i.test((e as Error).message)) return undefined;
        throw e;
      }
    }
    this.buckets.set(device, b);
    return b;
  }

  async put(device: number, object: string, bytes: Uint8Array): Promise<string> {
    const b = (await this.bucket(device, true))!;
    await b.putBlob({ name: object }, bytes);
    return sha256Hex(bytes);
  }

  async get(device: number, object: string): Promise<Uint8Array | undefined> {
    const b = await this.bucket(device, false);
    return (await b?.getBlob(object)) ?? undefined;
  }

  async delete(device: number, object: string): Promise<void> {
    const b = await this.bucket(device, false);
    const info = await b?.info(object);
    if (info && !info.deleted) await b!.delete(object);
  }
}
