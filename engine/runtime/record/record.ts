// What a run leaves behind: metrics.jsonl (one object per iteration) and summary.json, in the
// run directory. A summary is written on failure too, with the error.
import { appendFileSync, existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { decode, encode } from '../../../mesh/wire/index.ts';
import { CHECKPOINT_VERSIONS, CheckpointFile, Metrics, PROTOCOL_VERSION, type EpisodeRecordWire, type ReplanRecord } from '../../../mesh/wire/index.ts';
import type { Layout } from '../../../mesh/parallel/index.ts';
import type { CheckpointSet } from '../run/setup.ts';
import { packReplicas, unpackReplicas } from '../store/replicas.ts';
import type { TransportStats } from '../dispatch/dispatch.ts';
import type { RolloutAccount } from '../../device/index.ts';
import { stalenessSummary, switchesOfMetric, type SwitchDecision } from '../../asynchrony/index.ts';

export type { RolloutAccount };

export interface Summary {
  status: 'succeeded' | 'failed';
  scenario: string;
  run: string;
  iterations: number;
  seed: number;
  backend: string;
  plan: Record<string, { mesh: string; dp: number; tp: number; pp: number }>;
  reward_first5: number | null;
  reward_last5: number | null;
  digests: Record<string, string>;
  wall_seconds: number;
  tokens_per_second: number | null;
  parameters: Record<string, number>;
  /** Call time over the bus: round trips against time spent on the devices (absent in one process). */
  transport?: TransportStats;
  /** Recoveries: how many, and each one's cause, snapshot and duration. */
  /**
   * restored_bytes: the snapshot's bytes restored to devices; kept_bytes: those not (ranks kept with
   * the snapshot's state); via_supervisor_bytes: of those restored, what went through the supervisor's process.
   */
  recoveries: Array<{ epoch: number; reason: string; snapshot: number; iteration: number; seconds: number; restored_bytes?: number; kept_bytes?: number; via_supervisor_bytes?: number }>;
  /** An elastic run's re-plans (each with its trigger, search, plans, estimates and what was measured), and the devices it lost for good. */
  replans?: Array<ReplanRecord & { measured_period_after?: number }>;
  lost?: number[];
  /**
   * Snapshots taken after iterations (by this supervisor): how many, the last one's size, and the
   * seconds spent fetching them from the devices and storing them (JetStream Object Store).
   */
  /** Snapshots taken: how many, the last one's bytes, all their bytes, and the seconds fetching and storing them. */
  /**
   * The snapshots taken after iterations: how many, the bytes the devices wrote for the last one and
   * for all, the bytes that went through the supervisor's process (the manifests), and the seconds
   * spent writing (the devices, all at once) and recording the manifests.
   */
  snapshots?: { count: number; bytes: number; total_bytes: number; bytes_via_supervisor: number; write_seconds: number; manifest_seconds: number };
  /** The supervised warm-up: its steps, and the cross-entropy of its first and last mini-batch. */
  warmup?: { steps: number; first_loss: number; loss: number; source?: 'environment'; turns?: number };
  /** A learned reward model's training (reward.model): pairs, losses, and how many pairs it orders as the rule does. */
  reward_model?: { pairs: number; drawn: number; first_loss: number; loss: number; accuracy: number };
  /** Every prompt of every iteration trained on exactly once, by the shards' own ledgers. */
  rollouts?: RolloutAccount;
  /**
   * Under rl.lag or rl.staleness: the policy version each iteration trained on (the schedule that
   * `npm run scenario -- --replay` re-runs), and the rollouts' age when trained on — mean, max,
   * and iterations per age.
   */
  staleness?: {
    versions: number[];
    mean: number;
    max: number;
    histogram: Record<string, number>;
    /** In flight (rl.inflight): the tokens' age when trained on (mean over the run, most), and each iteration's generations' switches by call (what --replay re-runs). */
    tokens?: { mean: number; max: number };
    switches?: Record<string, Record<string, SwitchDecision[]>>;
  };
  /** Over NATS: the server's version, and how its JetStream syncs writes ('always', an interval, or why not set). */
  bus?: { server_version: string; sync: string };
  error?: string;
}

/** The summary's staleness from the iterations' metrics: none for a lock-step run. */
export function asynchronySummary(history: readonly Metrics[]): Pick<Summary, 'staleness'> {
  const versions = history.map((m) => m.policy_version);
  if (versions.length === 0 || versions.some((v) => typeof v !== 'number')) return {};
  const ages = stalenessSummary(history.map((m) => (typeof m.staleness === 'number' ? m.staleness : 0)));
  // In flight: per token (the mean of the iterations' means, and the most), and the decisions.
  const inflight = history.filter((m) => typeof m.token_staleness_mean === 'number');
  const tokens = inflight.length
    ? { mean: inflight.reduce((a, m) => a + (m.token_staleness_mean as number), 0) / inflight.length, max: Math.max(...inflight.map((m) => m.token_staleness_max as number)) }
    : undefined;
  const switched = history.filter((m) => typeof m.switches === 'object');
  const switches = switched.length ? Object.fromEntries(switched.map((m) => [String(m.iteration), switchesOfMetric(m.switches as Record<string, number>)])) : undefined;
  return { staleness: { versions: versions as number[], ...ages, ...(tokens ? { tokens } : {}), ...(switches ? { switches } : {}) } };
}

/** The generations that switched version in flight, over every iteration and call of a summary's staleness. */
export function switchCount(st: Pick<NonNullable<Summary['staleness']>, 'switches'> | undefined): number {
  return Object.values(st?.switches ?? {}).reduce((n, byCall) => n + Object.values(byCall).reduce((m, ds) => m + ds.length, 0), 0);
}

/** The summary's staleness in a line (what npm run scenario prints at the end of an asynchronous run). */
export function stalenessLine(st: NonNullable<Summary['staleness']>): string {
  const switched = switchCount(st);
  const tokens = st.tokens ? `; tokens' staleness mean ${st.tokens.mean.toFixed(2)}, max ${st.tokens.max} (${switched} generation${switched === 1 ? '' : 's'} switched version in flight)` : '';
  return `staleness: mean ${st.mean.toFixed(2)}, max ${st.max}${tokens}`;
}

/** Observers of a run: the run directory, the bus's event subject, a progress bar. */
export interface Recorder {
  phase(phase: string, detail: string): void;
  iteration(metrics: Metrics, iterations: number): void;
  finished(summary: Summary): void;
  /** A recovery went back to a snapshot: the iterations after `kept` will be recorded again. */
  rewind?(kept: readonly Metrics[]): void;
  /** A few of an iteration's episodes as they went (a run with an environment). */
  episodes?(iteration: number, sample: readonly EpisodeRecordWire[]): void;
}

export class RunDirectory implements Recorder {
  /**
   * Starts the directory's metrics afresh, or, when resuming, with `kept` (what came before). The
   * timeline starts afresh too, unless the run goes on (`continuing`: a resume, a take-over).
   */
  constructor(
    readonly dir: string,
    kept: readonly Metrics[] = [],
    continuing = false,
  ) {
    mkdirSync(dir, { recursive: true });
    this.rewind(kept);
    if (!continuing) writeFileSync(join(dir, 'timeline.jsonl'), '');
  }

  /**
   * One line of timeline.jsonl: a call or a recovery (report.html draws them). Appended at once,
   * so a supervisor killed a moment later leaves it whole.
   */
  timeline(record: { type: string; [key: string]: unknown }): void {
    appendFileSync(join(this.dir, 'timeline.jsonl'), `${JSON.stringify(record)}\n`);
  }

  rewind(kept: readonly Metrics[]): void {
    writeFileSync(join(this.dir, 'metrics.jsonl'), kept.map((m) => `${JSON.stringify(m)}\n`).join(''));
  }

  /** The checkpoint after `iteration`, replacing the last one only once it is written whole. */
  saveCheckpoint(iteration: number, set: CheckpointSet, layouts?: Record<string, Layout>): void {
    const file = join(this.dir, 'checkpoint.msgpack');
    writeFileSync(`${file}.tmp`, encode({ type: 'checkpoint', v: PROTOCOL_VERSION, iteration, ...packReplicas(set), ...(layouts ? { layouts } : {}) }));
    renameSync(`${file}.tmp`, file);
  }
  phase(): void {}
  iteration(metrics: Metrics): void {
    appendFileSync(join(this.dir, 'metrics.jsonl'), `${JSON.stringify(metrics)}\n`);
  }
  /** episodes.jsonl: a line per iteration, with a few episodes' transcripts (report.html shows them). */
  episodes(iteration: number, sample: readonly EpisodeRecordWire[]): void {
    appendFileSync(join(this.dir, 'episodes.jsonl'), `${JSON.stringify({ iteration, episodes: sample })}\n`);
  }
  finished(summary: Summary): void {
    writeFileSync(join(this.dir, 'summary.json'), `${JSON.stringify(summary, null, 2)}\n`);
  }
}

export function fanOut(...recorders: Recorder[]): Recorder {
  return {
    phase: (p, d) => recorders.forEach((r) => r.phase(p, d)),
    iteration: (m, n) => recorders.forEach((r) => r.iteration(m, n)),
    finished: (s) => recorders.forEach((r) => r.finished(s)),
    rewind: (kept) => recorders.forEach((r) => r.rewind?.(kept)),
    episodes: (i, sample) => recorders.forEach((r) => r.episodes?.(i, sample)),
  };
}

function avg(xs: number[]): number | null {
  return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null;
}

export function rewardWindows(history: readonly Metrics[]): { first5: number | null; last5: number | null } {
  return { first5: avg(history.slice(0, 5).map((m) => m.reward_mean)), last5: avg(history.slice(-5).map((m) => m.reward_mean)) };
}

export function median(xs: readonly number[]): number | null {
  if (xs.length === 0) return null;
  const s = [...xs].sort((a, b) => a - b);
  const mid = Math.floor(s.length / 2);
  return s.length % 2 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2;
}

export class ResumeError extends Error {
  override name = 'ResumeError';
}

/** What a run directory holds to go on from: its last checkpoint and the metrics up to it. */
export function readResume(dir: string): { iteration: number; checkpoint: CheckpointSet; layouts?: Record<string, Layout>; history: Metrics[] } {
  const file = join(dir, 'checkpoint.msgpack');
  if (!existsSync(file)) throw new ResumeError(`${dir} has no checkpoint.msgpack to resume from (checkpoint.every: 0, or the run ended before its first iteration)`);
  const c = decode(file, readFileSync(file), CheckpointFile, CHECKPOINT_VERSIONS);
  const metricsFile = join(dir, 'metrics.jsonl');
  const lines = existsSync(metricsFile) ? readFileSync(metricsFile, 'utf8').split('\n').filter(Boolean) : [];
  const history = lines.map((l, i) => {
    const parsed = Metrics.safeParse(JSON.parse(l));
    if (!parsed.success) throw new ResumeError(`${metricsFile}:${i + 1}: not a metrics line: ${parsed.error.message}`);
    return parsed.data;
  });
  return { iteration: c.iteration, checkpoint: unpackReplicas(c.models, c.replicas, file), ...(c.layouts ? { layouts: c.layouts } : {}), history: history.filter((m) => m.iteration <= c.iteration) };
}
