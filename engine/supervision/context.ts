// What the supervisor machine holds and hears (supervisor.machine.ts): its input, its events, its
// context, and the small rules over them that its states share — which losses start a recovery or
// a re-plan, which devices are missing or spare, what a recovery restores, which failures no
// snapshot can mend.
import type { Demonstrate } from '../environments/index.ts';
import type { LossTrigger, Metrics, ReplanRecord } from '../../mesh/wire/index.ts';
import type { IterationStart, Loss, SnapshotRead } from '../elastic/index.ts';
import type { Layout } from '../../mesh/parallel/index.ts';
import { CallError, fence, type Dispatcher } from '../runtime/index.ts';
import type { Recorder, RolloutAccount, Summary } from '../runtime/index.ts';
import type { Progress, RunStore } from '../runtime/index.ts';
import type { HeldView, RewardSources, RunSpec } from '../runtime/index.ts';
import type { NextViews } from '../asynchrony/index.ts';
import type { CheckpointSet } from '../runtime/index.ts';
import type { Intensity } from './supervision.ts';

export interface SupervisorInput {
  spec: RunSpec;
  run: string;
  dispatcher: Dispatcher;
  recorder: Recorder;
  /** Where rollouts, scores, snapshots and progress live (JetStream over NATS). */
  store: RunStore;
  /**
   * Writes the run's last snapshot where a user finds it (the run directory, for --resume), once,
   * when the run ends; `layouts`: what each model's ranks were taken on. None when absent.
   */
  saveCheckpoint?: (iteration: number, set: CheckpointSet, layouts: Record<string, Layout>) => Promise<void>;
  /** Continue a run: its last checkpoint, the iteration it was taken after, and the metrics so far. */
  resume?: { iteration: number; checkpoint: CheckpointSet; history: Metrics[] };
  /** Take over a run whose supervisor died: its progress in the store. */
  takeOver?: Progress;
  /** Backends of workers that joined before the machine started (in-process runs). */
  backends?: string[];
  /** The bus the run rides: the NATS server's version and how its JetStream syncs writes. */
  bus?: { server_version: string; sync: string };
  /** Reward actors on the bus (the scenario's reward.actors). */
  rewards?: RewardSources;
  /** The environment's expert, for a warm-up drawn from it (warmup.source: environment). */
  demonstrate?: Demonstrate;
  /** Tells observers that a recovery is done (the bus's events subject). */
  onRecovered?: (r: { epoch: number; iteration: number; snapshot: number; seconds: number; reason: string }) => void;
  /** Tells whoever restarts workers that a device is out of the run for good (an elastic run's loss). */
  onCordoned?: (c: { device: number; trigger: LossTrigger; reason: string }) => void;
}

/** What the machine tells its membership actor: the devices of the plan now (after a re-plan). */
export type MembershipCommand = { type: 'need'; need: number[]; lost: number[] };

export type SupervisorEvent =
  | { type: 'interrupt'; reason: string }
  | { type: 'worker.joined'; device: number; worker: string; backend: string }
  | { type: 'worker.lost'; device: number; worker: string; reason: string }
  /** Someone's connection to NATS dropped and came back: messages in flight may be lost. */
  | { type: 'bus.trouble'; reason: string }
  /** A device is lost for good (cordoned, past the restart intensity, a chaos event): an elastic run re-plans without it. */
  | { type: 'device.lost'; device: number; trigger: LossTrigger; reason: string };

export interface Context extends SupervisorInput {
  need: number[];
  joined: Record<number, { worker: string; backend: string }>;
  iteration: number;
  startedAt: number;
  /** Each iteration this supervisor began, and when: the last is the running one (its seconds; the measured period after a re-plan). */
  starts: IterationStart[];
  history: Metrics[];
  parameters: Record<string, number>;
  digests: Record<string, string>;
  rollouts?: RolloutAccount;
  /** The iteration after which the last snapshot was taken (-1: after setup); undefined: none. */
  snapshot?: number;
  intensity: Intensity;
  /** Why the recovery under way started, and when. */
  failure?: { reason: string; at: number; device?: number };
  recoveries: Summary['recoveries'];
  /** Recoveries begun since the last one that completed: each waits longer before it starts. */
  attempts: number;
  snapshots: NonNullable<Summary['snapshots']>;
  rewardModel?: Summary['reward_model'];
  warmup?: Summary['warmup'];
  error?: string;
  /** Devices lost for good (an elastic run), and its re-plans. */
  lost: number[];
  replans: ReplanRecord[];
  /** The loss a re-plan under way answers, and when it was heard. */
  loss?: Pending;
  /**
   * Devices an operator cordoned while an iteration ran (they still work): the run re-plans
   * without them once the iteration and its snapshot are done (or at once, should anything fail
   * or one of them lose its worker before that).
   */
  draining?: Pending;
  /** The run's spec before the re-plan under way. */
  from?: RunSpec;
  /** When the loss that the migration under way answers was heard. */
  lossAt?: number;
  /** Devices whose workers joined beyond the plan that were offered to the planner already. */
  considered: number[];
  /** The snapshot a re-plan will migrate from, read while the plan is searched. */
  reading?: { snapshot: number; loaded: Promise<SnapshotRead | undefined> };
  /** Under asynchrony: the next version's views, filled while the last generates (engine/asynchrony/next-views.ts). */
  views: NextViews<HeldView>;
}

/** A loss the machine is to act on: when it was heard, and its devices whoever restarts workers was told of already (`announced`). */
export type Pending = Loss & { at: number; announced?: number[] };

/** `before` with one more device lost (the first reason first), else a loss of that device alone. */
export const withDevice = (before: Pending | undefined, device: number, trigger: Loss['trigger'], reason: string): Pending =>
  before ? { ...before, devices: [...new Set([...before.devices, device])], reason: `${before.reason}; ${reason}` } : { devices: [device], trigger, reason, at: Date.now() };

/** In every state that works with the devices: a lost worker or trouble on the bus starts a recovery. */
export const RECOVER_ON_LOSS = {
  'worker.lost': [
    // A worker the plan does not use (joined beyond it): nothing to recover.
    { guard: ({ context, event }: { context: Context; event: SupervisorEvent }) => event.type === 'worker.lost' && !context.need.includes(event.device), actions: 'unjoin' },
    { target: '#supervisor.recovering', actions: ['unjoin', 'noteLoss'] },
  ],
  'bus.trouble': { target: '#supervisor.recovering', actions: 'noteLoss' },
  'device.lost': { target: '#supervisor.replanning', actions: 'noteLostForGood' },
} as const;

/**
 * While an iteration runs: a device an operator cordons still works, so it is drained — the
 * iteration goes on, its snapshot is taken, and the re-plan starts at the boundary (`advancing`).
 * Cut short, the devices left would have trained past the last snapshot: each would fail its
 * digest check, be sent its rank whole, and the iteration would run again. A device lost any
 * other way, a lost worker, trouble on the bus: at once, as everywhere else.
 */
export const DRAIN_ON_CORDON = {
  ...RECOVER_ON_LOSS,
  'worker.lost': [
    RECOVER_ON_LOSS['worker.lost'][0],
    // The device being drained lost its worker: nothing is left to wait for.
    {
      guard: ({ context, event }: { context: Context; event: SupervisorEvent }) => event.type === 'worker.lost' && context.draining?.devices.includes(event.device) === true,
      target: '#supervisor.replanning',
      actions: ['unjoin', 'drained'],
    },
    RECOVER_ON_LOSS['worker.lost'][1],
  ],
  'device.lost': [{ guard: ({ event }: { event: SupervisorEvent }) => event.type === 'device.lost' && event.trigger === 'cordon', actions: 'noteCordon' }, RECOVER_ON_LOSS['device.lost']],
} as const;

/** Devices with a worker that the plan does not use (an elastic run's: joined beyond the plan). */
export const sparesOf = (c: Pick<Context, 'need' | 'joined'>) =>
  Object.keys(c.joined)
    .map(Number)
    .filter((d) => !c.need.includes(d));

/** The devices of the plan that have no worker now. */
export const missingDevices = (c: Pick<Context, 'need' | 'joined'>) => c.need.filter((d) => c.joined[d] === undefined);

/** The call or step of the graph that failed (runGraph names it on the error). */
export const failedNode = (e: unknown) => ((e as { node?: unknown })?.node as string | undefined) ?? 'iteration';

/**
 * A failure that going back to a snapshot cannot mend: a reward actor that never came, or a loss
 * refused or failing on a device (unknown, from another copy of its file, not finite).
 */
export const fatal = (e: unknown) => (e as { fatal?: unknown })?.fatal === true || (e instanceof CallError && (e.code === 'loss' || e.code === 'environment'));

export const errorText = (e: unknown) => (e instanceof Error ? `${e.name}: ${e.message}` : String(e));

/** What a recovery or a migration restores: every device of the plan, back to the last snapshot. */
export const restoreInput = (context: Context) => ({
  d: fence(context.dispatcher),
  r: context.spec,
  store: context.store,
  iteration: -1,
  devices: context.need,
  snapshot: context.snapshot,
  resume: context.resume,
  demonstrate: context.demonstrate,
  say: (line: string) => context.recorder.phase('recovering', line),
});
