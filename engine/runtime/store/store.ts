// What a run must not lose when a process dies: the supervisor's progress, each iteration's stage
// results (rollouts and their scores), and snapshots of every shard's state. Over NATS these
// live in JetStream (mesh/jetstream.ts: a KV bucket, a stream, an Object Store); in one process
// (benchmarks, unit tests) in memory, behind the same interface.
import { encode, MemoryShelf, type Metrics, type ReplanRecord, type Shelf, type SnapshotManifest } from '../../../mesh/wire/index.ts';
import type { Layout } from '../../../mesh/parallel/index.ts';
import type { CheckpointSet } from '../run/setup.ts';
import { dropObjectsBefore, manifestObjects, readSnapshot } from './snapshots.ts';

/** Where the supervisor is: enough for a new supervisor to take the run over. */
export interface Progress {
  /** Recoveries so far; a supervisor that takes over starts the next one. */
  epoch: number;
  /** The iteration in progress (or the next to start). */
  iteration: number;
  /** The iteration after which the last snapshot was taken; -1 after setup; undefined: none yet. */
  snapshot?: number;
  /** Metrics of the iterations completed, in order. */
  history: Metrics[];
  /** When the run started (ms since the epoch): a supervisor that takes over keeps the run's clock. */
  startedAt: number;
  recoveries: Array<{ epoch: number; reason: string; snapshot: number; iteration: number; seconds: number }>;
  /** An elastic run that re-planned: its plan now (a scenario's plan: placements), the devices it lost for good, each re-plan. */
  plan?: Record<string, { mesh: string; dp: number; tp: number; pp: number }>;
  lost?: number[];
  replans?: ReplanRecord[];
}

/** A snapshot as read back: every kept model's ranks, and the layouts they were taken on. */
export interface Snapshot {
  set: CheckpointSet;
  /** Absent in a snapshot that did not record them: taken on the run's plan. */
  layouts?: Record<string, Layout>;
  /** Per model, each rank's state digest as its device computed it when it wrote it (stateDigest). */
  states?: Record<string, string[]>;
}

/** A result kept per iteration: a call's outputs, under the call's name as a subject token (rlhf.ts's stageOf). */
export type Stage = string;

export interface RunStore {
  saveProgress(p: Progress): Promise<void>;
  loadProgress(): Promise<Progress | undefined>;
  saveStage(iteration: number, stage: Stage, value: unknown): Promise<void>;
  loadStage<T>(iteration: number, stage: Stage): Promise<T | undefined>;
  /** Where the devices write their snapshots' objects (each its own bucket). */
  readonly shelf: Shelf;
  /**
   * Records a snapshot the devices have written (its manifest: mesh/wire's SnapshotManifest), and
   * drops those older than the one before it, objects and all. Returns the manifest's bytes: all
   * of a snapshot that passes through the supervisor's process.
   */
  saveSnapshot(manifest: SnapshotManifest): Promise<{ bytes: number }>;
  /** The snapshot after `iteration`, read back from its devices' objects and checked against its manifest. */
  loadSnapshot(iteration: number): Promise<Snapshot | undefined>;
  /** The manifest of the snapshot after `iteration` alone (a recovery in place reads no object: the devices do). */
  loadManifest(iteration: number): Promise<SnapshotManifest | undefined>;
  /** The newest snapshot kept from before `iteration`'s (where one cannot be read back), if any. */
  previousSnapshot(iteration: number): Promise<number | undefined>;
  close(): Promise<void>;
}

/** A store that lives as long as its process: enough where the supervisor cannot die alone. */
export class MemoryStore implements RunStore {
  private progress?: Progress;
  private readonly stages = new Map<string, unknown>();
  private readonly manifests = new Map<number, SnapshotManifest>();

  /** `shelf`: where this process's devices write (LocalDispatcher's). */
  constructor(readonly shelf: Shelf = new MemoryShelf()) {}

  async saveProgress(p: Progress): Promise<void> {
    this.progress = structuredClone(p);
  }
  async loadProgress(): Promise<Progress | undefined> {
    return this.progress && structuredClone(this.progress);
  }
  async saveStage(iteration: number, stage: Stage, value: unknown): Promise<void> {
    this.stages.set(`${iteration}.${stage}`, value);
  }
  async loadStage<T>(iteration: number, stage: Stage): Promise<T | undefined> {
    return this.stages.get(`${iteration}.${stage}`) as T | undefined;
  }
  /** As JetStreamStore's: the two newest snapshots are kept, and every object of an older one goes. */
  async saveSnapshot(manifest: SnapshotManifest): Promise<{ bytes: number }> {
    this.manifests.set(manifest.iteration, manifest);
    for (const o of manifestObjects(manifest)) this.devices.add(o.device);
    const iterations = [...this.manifests.keys()].sort((a, b) => b - a);
    if (iterations.length > 2) {
      const cut = iterations[1]!;
      for (const i of iterations.slice(2)) this.manifests.delete(i);
      for (const device of this.devices) await dropObjectsBefore(this.shelf, device, cut);
    }
    return { bytes: encode(manifest).length };
  }
  private readonly devices = new Set<number>();
  async loadManifest(iteration: number): Promise<SnapshotManifest | undefined> {
    return this.manifests.get(iteration);
  }
  async previousSnapshot(iteration: number): Promise<number | undefined> {
    const before = [...this.manifests.keys()].filter((i) => i < iteration);
    return before.length ? Math.max(...before) : undefined;
  }
  async loadSnapshot(iteration: number): Promise<Snapshot | undefined> {
    const m = this.manifests.get(iteration);
    return m && readSnapshot(this.shelf, m, `the snapshot after iteration ${iteration}`);
  }
  async close(): Promise<void> {}
}
