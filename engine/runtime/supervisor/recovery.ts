// Putting every device of the plan back to a snapshot: reset them all (whatever they were
// running), then load the models and restore. A snapshot taken on another layout (before an
// elastic re-plan) is resharded onto the plan first; with no snapshot yet, the models are set up
// again, from the checkpoint a resumed run started from, else from scratch.
import type { Demonstrate } from '../../environments/index.ts';
import { CallError, type Dispatcher } from '../dispatch/dispatch.ts';
import { reshardToPlan } from '../store/reshard.ts';
import type { RunStore, Snapshot } from '../store/store.ts';
import type { RunSpec } from '../run/run.ts';
import { checkpointLayouts, setupModels, takeCheckpoint, type CheckpointSet } from '../run/setup.ts';

export interface RestoreInput {
  d: Dispatcher;
  r: RunSpec;
  store: RunStore;
  devices: number[];
  /** The iteration after which the snapshot to go back to was taken; undefined: none yet. */
  snapshot?: number;
  resume?: { iteration: number; checkpoint: CheckpointSet };
  demonstrate?: Demonstrate;
  /** The snapshot, when the caller has read it already. */
  loaded?: Snapshot;
}

export type SetupOutput = Awaited<ReturnType<typeof setupModels>>;

/** Waits (up to timeouts.recover_seconds) for each device to answer a reset: one that has just reconnected may not be subscribed yet. */
export async function resetDevices(d: Dispatcher, r: RunSpec, devices: readonly number[]): Promise<void> {
  const deadline = Date.now() + r.scenario.timeouts.recover_seconds * 1000;
  const reset = async (device: number): Promise<unknown> => {
    try {
      return await d.call(device, '*', -1, { fn: 'reset', epoch: d.epoch });
    } catch (e) {
      if (!(e instanceof CallError && (e.code === 'unreachable' || e.code === 'timeout')) || Date.now() > deadline) throw e;
      await new Promise((res) => setTimeout(res, 250));
      return reset(device);
    }
  };
  await Promise.all(devices.map(reset));
}

/** Every device back to the snapshot; returns what setup returns, the snapshot gone back to, and what was restored. */
export async function restoreDevices(input: RestoreInput): Promise<SetupOutput & { snapshot: number; restored?: CheckpointSet; resharded?: string[] }> {
  const { d, r, store } = input;
  await resetDevices(d, r, input.devices);
  if (input.snapshot === undefined) {
    const after = input.resume?.iteration ?? -1;
    const out = await setupModels(d, r, input.resume?.checkpoint, input.demonstrate);
    await store.saveSnapshot(after, await takeCheckpoint(d, r, after), checkpointLayouts(r));
    return { ...out, snapshot: after, resharded: [] };
  }
  const found = input.loaded ?? (await store.loadSnapshot(input.snapshot));
  if (!found) throw new Error(`the run store has no snapshot after iteration ${input.snapshot} to recover from`);
  const { set, resharded } = reshardToPlan(r, found.set, found.layouts);
  return { ...(await setupModels(d, r, set)), snapshot: input.snapshot, restored: set, resharded };
}
