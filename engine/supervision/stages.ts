// The supervisor machine's stages (supervisor.machine.ts invokes them): each a promise over the
// dispatcher, the run's spec and its store — setting the models up, an iteration, a snapshot, a
// recovery, a re-plan's decision and migration, the digests at the end — and the membership
// actor the process host provides.
import { fromCallback, fromPromise } from 'xstate';
import type { Demonstrate } from '../environments/index.ts';
import { decideAndWriteAhead, migrateOrSetUp, type SnapshotRead } from '../elastic/index.ts';
import type { Dispatcher } from '../runtime/index.ts';
import { accountRollouts } from '../device/index.ts';
import type { Progress, RunStore } from '../runtime/index.ts';
import { finalDigests, planDevices, runIteration, trainedRollouts, type HeldView, type IterationResult, type RewardSources, type RunSpec } from '../runtime/index.ts';
import { stagesOfPlan, trainedStages } from '../runtime/index.ts';
import type { NextViews } from '../asynchrony/index.ts';
import { setupModels, snapshotInto, type CheckpointSet } from '../runtime/index.ts';
import { restoreDevices } from '../runtime/index.ts';
import type { MembershipCommand, SupervisorInput } from './context.ts';

/** What every stage is given. */
export type StageInput = { d: Dispatcher; r: RunSpec; store: RunStore; iteration: number; rewards?: RewardSources; demonstrate?: Demonstrate };

/** How long a run that ends waits to read its last snapshot back into the run directory. */
const KEEP_MS = 90_000;

export const stages = {
  /** Keeps the run's membership: joins, heartbeats, exits. The process host provides the NATS version. */
  membership: fromCallback<MembershipCommand, { need: number[] }>(() => () => {}),
  /** The plan for the devices left, written ahead to the run's store before anything acts on it (elastic/steps.ts). */
  decide: fromPromise(({ input }: { input: Parameters<typeof decideAndWriteAhead>[0] }) => decideAndWriteAhead(input)),
  /** The last snapshot onto the new plan, checked bit for bit; with none yet, setup on it. */
  migrate: fromPromise(
    ({ input }: { input: StageInput & { from: RunSpec; lost: number[]; devices: number[]; snapshot?: number; resume?: SupervisorInput['resume']; ahead?: Promise<SnapshotRead | undefined> } }) =>
      migrateOrSetUp(input),
  ),
  setupModels: fromPromise(async ({ input }: { input: StageInput & { resume?: CheckpointSet; resumeAfter?: number } }) => {
    const out = await setupModels(input.d, input.r, input.resume, input.demonstrate);
    // The first snapshot: what a recovery before the first iteration's goes back to.
    await snapshotInto(input.d, input.r, input.store, input.resumeAfter ?? -1);
    return out;
  }),
  /** Back to the last snapshot on every device (recovery.ts). */
  recover: fromPromise(({ input }: { input: StageInput & { devices: number[]; snapshot?: number; resume?: SupervisorInput['resume'] } }) => restoreDevices(input)),
  /** A snapshot after the iteration (every `checkpoint.every`, after the last, and whenever `force`d: a device drained), written by the devices; the manifest into the store. */
  checkpoint: fromPromise(async ({ input }: { input: StageInput & { force?: boolean } }) => {
    const every = input.r.scenario.checkpoint.every;
    const last = input.iteration + 1 === input.r.scenario.rl.iterations;
    if (!input.force && (every === 0 || ((input.iteration + 1) % every !== 0 && !last))) return undefined;
    return snapshotInto(input.d, input.r, input.store, input.iteration);
  }),
  /**
   * The run's last snapshot into the run directory (checkpoint.msgpack, for --resume and the
   * tools), when the run ends, well or not: read back from the devices' objects once, here.
   * Bounded: a run that fails because the bus is gone still ends.
   */
  keepCheckpoint: fromPromise(async ({ input }: { input: { store: RunStore; snapshot?: number; save?: SupervisorInput['saveCheckpoint'] } }) => {
    const { snapshot, save } = input;
    if (!save || snapshot === undefined || snapshot < 0) return;
    let timer: NodeJS.Timeout | undefined;
    const found = await Promise.race([
      input.store.loadSnapshot(snapshot),
      new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`reading the snapshot after iteration ${snapshot} took over ${KEEP_MS / 1000} s`)), KEEP_MS))),
    ]).finally(() => clearTimeout(timer));
    if (found) await save(snapshot, found.set, found.layouts ?? {});
  }),
  saveProgress: fromPromise(({ input }: { input: { store: RunStore; progress: Progress } }) => input.store.saveProgress(input.progress)),
  /**
   * One iteration of the graph. Results of calls that change no state come from the store when
   * this iteration already has them on this plan (a replay: `plan` is the plan's number,
   * plan-stages.ts), and go into it when they are computed.
   */
  iteration: fromPromise(
    ({ input }: { input: StageInput & { plan: number; views?: NextViews<HeldView> } }): Promise<IterationResult> =>
      runIteration(input.d, input.r, input.iteration, stagesOfPlan(input.store, input.plan), input.rewards, input.views),
  ),
  digest: fromPromise(async ({ input }: { input: StageInput & { plan: number } }) => {
    const { digests, ledgers } = await finalDigests(input.d, input.r, input.iteration);
    const rollouts = await trainedRollouts(input.r, trainedStages(input.store, input.plan), input.r.scenario.rl.iterations);
    const accounts = Object.entries(ledgers).map(([model, ranks]) => accountRollouts({ [model]: ranks }, rollouts[model] ?? []));
    return {
      digests,
      rollouts: accounts.reduce((a, b) => ({ prompts: a.prompts + b.prompts, lost: a.lost + b.lost, duplicated: a.duplicated + b.duplicated }), { prompts: 0, lost: 0, duplicated: 0 }),
    };
  }),
  stopWorkers: fromPromise(async ({ input }: { input: StageInput }) => {
    await Promise.all(planDevices(input.r).map((dev) => input.d.call(dev, '*', input.iteration, { fn: 'shutdown' })));
  }),
};
