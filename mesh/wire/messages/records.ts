// What a run keeps and tells of itself, as schemas: its re-plans, recoveries and progress (the
// run's KV store), the results of each stage, the metrics of each iteration, and the events
// observers hear. The messages calls and transfers exchange are protocol.ts's.
import { z } from 'zod';
import { nat, pos, v } from './primitives.ts';

/** Why a device is lost for good: an operator's cordon, its worker past the restart intensity, a chaos event, or not back within the grace period. */
export const LOSS_TRIGGERS = ['cordon', 'intensity', 'chaos', 'grace'] as const;
export type LossTrigger = (typeof LOSS_TRIGGERS)[number];
/** What sets off a re-plan: a device lost for good, or workers that joined for devices the plan does not use. */
export const REPLAN_TRIGGERS = [...LOSS_TRIGGERS, 'join'] as const;
export type ReplanTrigger = (typeof REPLAN_TRIGGERS)[number];

/** A re-plan the supervisor decided, as progress records keep it (written before it is acted on). */
export const ReplanRecord = z.strictObject({
  /** The iteration the run goes on from (the snapshot's next). */
  iteration: z.number().int(),
  trigger: z.enum(REPLAN_TRIGGERS),
  lost: z.array(nat),
  /** Devices whose workers joined beyond the plan, offered to the planner with this change. */
  joined: z.array(nat).default([]),
  reason: z.string(),
  /** Whether the plan changed (after a loss it must; after a join only where the gain pays for the migration), and what the new plan saves over the remaining iterations. */
  changed: z.boolean().default(true),
  gain_seconds: z.number().default(0),
  /** When the change was heard (ms since the epoch): a supervisor that takes a migration over counts from it. */
  at: z.number().optional(),
  search_seconds: z.number(),
  plans_evaluated: nat,
  plan_before: z.record(z.string(), z.strictObject({ mesh: z.string(), dp: pos, tp: pos, pp: pos })),
  plan_after: z.record(z.string(), z.strictObject({ mesh: z.string(), dp: pos, tp: pos, pp: pos })),
  /** The cost model's seconds per iteration, before (all devices) and after (those left). */
  estimated_period_before: z.number(),
  estimated_period_after: z.number(),
  estimated_migration_seconds: z.number(),
  /** What survivors would have to send at least (the minimal-byte planner), and what only the snapshot holds. */
  minimum_bytes: nat,
  snapshot_only_bytes: nat,
  why: z.string(),
  /**
   * The period the run measured on the plan before, over its last iterations (wall-clock; the first
   * after a start, a recovery or a migration left out: it warms the new shapes up), and the machine's
   * speed it gives: that period ÷ the plan's estimate from the profile as fitted. The estimates here
   * are priced at that speed (the profile scaled by it). Absent where no such iteration had run.
   */
  measured_period_before: z.number().positive().optional(),
  machine_speed: z.number().positive().optional(),
  /** Filled in once the migration is done: its seconds (restore and check), the bytes it sent and the least a migration could send (optimizer moments counted), seconds from the loss to going on. */
  migration_seconds: z.number().optional(),
  migration_bytes: nat.optional(),
  migration_minimum_bytes: nat.optional(),
  parameters_equal_after_migration: z.boolean().optional(),
  seconds: z.number().optional(),
});
export type ReplanRecord = z.infer<typeof ReplanRecord>;

/** One recovery of a run: back to the snapshot after `snapshot`, going on from `iteration`. */
export const Recovery = z.strictObject({
  epoch: nat,
  reason: z.string(),
  snapshot: z.number().int(),
  iteration: z.number().int(),
  seconds: z.number(),
  /** Bytes of the snapshot sent to devices, and those not sent: ranks a device kept with the snapshot's state. */
  restored_bytes: nat.optional(),
  kept_bytes: nat.optional(),
  /** Of the bytes restored, those that went through the supervisor's process (none where the devices reloaded their ranks themselves). */
  via_supervisor_bytes: nat.optional(),
});

/** Where a supervisor is in its run (see engine/runtime/store/store.ts), as the JetStream KV bucket keeps it. */
export const ProgressRecord = z.strictObject({
  type: z.literal('progress'),
  v,
  epoch: nat,
  iteration: nat,
  snapshot: z.number().int().min(-1).optional(),
  history: z.array(z.lazy(() => Metrics)),
  /** When the run started (ms since the epoch), and its recoveries so far. */
  startedAt: z.number(),
  recoveries: z.array(Recovery),
  /** An elastic run's plan once it re-planned (placements as a scenario's plan: takes them), the devices it lost, its re-plans. */
  plan: z.record(z.string(), z.strictObject({ mesh: z.string(), dp: pos, tp: pos, pp: pos })).optional(),
  lost: z.array(nat).optional(),
  replans: z.array(ReplanRecord).optional(),
});

/** One stage result of one iteration, as the run's JetStream stream keeps it. */
export const StageRecord = z.strictObject({ type: z.literal('stage'), v, iteration: nat, stage: z.string(), value: z.record(z.string(), z.unknown()) });

/**
 * One iteration's figures: the ones every algorithm has, then the algorithm's own statistics
 * (losses, KL, accuracy: every number its calls and steps produced), by name.
 */
export const Metrics = z
  .object({
    iteration: nat,
    reward_mean: z.number(),
    seconds: z.number(),
    tokens: nat,
    tokens_per_second: z.number(),
    /** Parameter reallocations this iteration: seconds spent and bytes received. */
    realloc_seconds: z.number(),
    realloc_bytes: nat,
    /** The task's rule, scored on the rollout whatever the reward is (the hidden human's view). */
    rule_score: z.number().optional(),
    /** For a task with an end token: the rollout's mean response length in tokens (the end token counted). */
    response_length: z.number().optional(),
    /** For a task with an end token: the share of the rollout's responses that reached the budget without one. */
    response_at_limit: z.number().optional(),
    /** Each reward source's mean score on the rollout (`rule` for the reward device, reward actors by name). */
    rewards: z.record(z.string(), z.number()).optional(),
  })
  .catchall(z.union([z.number(), z.record(z.string(), z.number())]));
export type Metrics = z.infer<typeof Metrics>;

/**
 * What the supervisor and the launcher tell observers (the launcher's progress bar, a report, a
 * user's tool), each type on its own subject (events.ts).
 */
export const RunEvent = z.discriminatedUnion('type', [
  z.strictObject({ type: z.literal('phase'), v, phase: z.string(), detail: z.string() }),
  z.strictObject({ type: z.literal('progress'), v, iterations: pos, metrics: Metrics }),
  z.strictObject({
    type: z.literal('log'),
    v,
    level: z.enum(['info', 'warn', 'error']),
    source: z.string(),
    message: z.string(),
  }),
  /** The launcher saw the supervisor end the run (its summary written): the run's workers leave. */
  z.strictObject({ type: z.literal('done'), v, status: z.enum(['succeeded', 'failed']), message: z.string() }),
  /** The supervisor gave a device up (no heartbeat, or its process exited): whoever started it stops it. */
  z.strictObject({ type: z.literal('lost'), v, device: nat, worker: z.string(), pid: nat.optional(), reason: z.string() }),
  /** The launcher saw a process it started exit, and whether its restart policy restarts it. */
  z.strictObject({
    type: z.literal('exit'),
    v,
    kind: z.enum(['worker', 'supervisor']),
    pid: nat,
    /** The machine the process ran on (the launcher's): a pid names a process on one machine only. */
    host: z.string().optional(),
    code: z.number().int().nullable(),
    signal: z.string().nullable(),
    restart: z.boolean(),
  }),
  /** The supervisor runs on without a device from now on (a cordon, the restart intensity, chaos, the grace period): nobody restarts its worker. */
  z.strictObject({ type: z.literal('cordoned'), v, device: nat, trigger: z.enum(LOSS_TRIGGERS), reason: z.string() }),
  /** The supervisor put every device back to its last snapshot and goes on from `iteration`. */
  z.strictObject({ type: z.literal('recovered'), v, ...Recovery.shape }),
]);
export type RunEvent = z.infer<typeof RunEvent>;
