// What a run must not lose when a process dies: the supervisor's progress, each iteration's stage
// results (rollouts and their scores), and snapshots of every shard's state. Over NATS these
// live in JetStream (mesh/jetstream.ts: a KV bucket, a stream, an Object Store); in one process
// (benchmarks, unit tests) in memory, behind the same interface.
import type { Metrics, ReplanRecord } from '../../../mesh/wire/index.ts';
import type { Layout } from '../../../mesh/parallel/index.ts';
import type { CheckpointSet } from '../run/setup.ts';

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

/** A snapshot as the store keeps it: every kept model's ranks, and the layouts they were taken on. */
export interface Snapshot {
  set: CheckpointSet;
  /** Absent in a snapshot that did not record them: taken on the run's plan. */
  layouts?: Record<string, Layout>;
}

/** A result kept per iteration: a call's outputs, under the call's name as a subject token (rlhf.ts's stageOf). */
export type Stage = string;

export interface RunStore {
  saveProgress(p: Progress): Promise<void>;
  loadProgress(): Promise<Progress | undefined>;
  saveStage(iteration: number, stage: Stage, value: unknown): Promise<void>;
  loadStage<T>(iteration: number, stage: Stage): Promise<T | undefined>;
  /** Stores a snapshot (with the layouts its ranks were taken on) and drops those older than the one before it. */
  saveSnapshot(iteration: number, set: CheckpointSet, layouts?: Record<string, Layout>): Promise<{ bytes: number }>;
  loadSnapshot(iteration: number): Promise<Snapshot | undefined>;
  close(): Promise<void>;
}

/** A store that lives as long as its process: enough where the supervisor cannot die alone. */
export class MemoryStore implements RunStore {
  private progress?: Progress;
  private readonly stages = new Map<string, unknown>();
  private readonly snapshots = new Map<number, Snapshot>();

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
  async saveSnapshot(iteration: number, set: CheckpointSet, layouts?: Record<string, Layout>): Promise<{ bytes: number }> {
    this.snapshots.set(iteration, { set, ...(layouts ? { layouts } : {}) });
    for (const k of this.snapshots.keys()) if (k < iteration - 1) this.snapshots.delete(k);
    return { bytes: 0 };
  }
  async loadSnapshot(iteration: number): Promise<Snapshot | undefined> {
    return this.snapshots.get(iteration);
  }
  async close(): Promise<void> {}
}
