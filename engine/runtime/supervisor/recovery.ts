// Putting every device of the plan back to a snapshot: reset them all (whatever they were
// running), keeping the shards whose state equals the snapshot's (a survivor that had not moved
// past it), then load and restore the rest. A snapshot taken on another layout (before an
// elastic re-plan) is resharded onto the plan first; with no snapshot yet, the models are set up
// again, from the checkpoint a resumed run started from, else from scratch.
import type { Demonstrate } from '../../environments/index.ts';
import { CallError, type Dispatcher } from '../dispatch/dispatch.ts';
import { rankCoords } from '../../../mesh/parallel/index.ts';
import { reshardToPlan } from '../store/reshard.ts';
import type { RunStore, Snapshot } from '../store/store.ts';
import { layoutOf, ownerOf, type RunSpec } from '../run/run.ts';
import { checkpointLayouts, keptModels, setupModels, takeCheckpoint, type CheckpointSet, type KeptRanks } from '../run/setup.ts';
import { stateDigest, type Checkpoint, type Layout, type ResultOf } from '../../../mesh/wire/index.ts';

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

/** What a device kept through a reset: per model, its state's digest and parameter count. */
export type KeptShards = Map<number, Array<{ model: string; state: string; parameters: number }>>;

/**
 * Waits (up to timeouts.recover_seconds) for each device to answer a reset: one that has just
 * reconnected may not be subscribed yet. `keep`: the shards each device is to keep where it holds
 * them on the same layout and rank; returns, per device, those it kept.
 */
export async function resetDevices(
  d: Dispatcher,
  r: RunSpec,
  devices: readonly number[],
  keep: ReadonlyMap<number, ReadonlyArray<{ model: string; layout: Layout; rank: number }>> = new Map(),
): Promise<KeptShards> {
  const deadline = Date.now() + r.scenario.timeouts.recover_seconds * 1000;
  const reset = async (device: number): Promise<ResultOf<'reset'>> => {
    try {
      const k = keep.get(device) ?? [];
      return await d.call(device, '*', -1, { fn: 'reset', epoch: d.epoch, ...(k.length ? { keep: [...k] } : {}) });
    } catch (e) {
      if (!(e instanceof CallError && (e.code === 'unreachable' || e.code === 'timeout')) || Date.now() > deadline) throw e;
      await new Promise((res) => setTimeout(res, 250));
      return reset(device);
    }
  };
  const out = await Promise.all(devices.map(async (device) => [device, (await reset(device)).kept ?? []] as const));
  return new Map(out);
}

/**
 * The ranks of `set` (on the plan's owner layouts) that devices kept through their reset with the
 * same state (stateDigest): those need nothing sent. A data-parallel replica counts whole: its
 * ranks see the same calls and keep state in step (a tied head's copy on the last stage is sent
 * again when the first stage's weights are replaced), so one rank restored restores its replica.
 */
export function heldRanks(r: RunSpec, set: CheckpointSet, kept: KeptShards): KeptRanks {
  const held: Record<string, Map<number, number>> = {};
  for (const [model, ranks] of Object.entries(set)) {
    const layout = layoutOf(r, ownerOf(r, model));
    const same = layout.devices.map((device, rank) => {
      const k = kept.get(device)?.find((x) => x.model === model);
      return k && k.state === stateDigest(rankState(ranks[rank]!)) ? k.parameters : undefined;
    });
    layout.devices.forEach((_, rank) => {
      const replica = rankCoords(layout, rank).dp;
      const whole = layout.devices.every((_d, other) => rankCoords(layout, other).dp !== replica || same[other] !== undefined);
      if (whole) (held[model] ??= new Map()).set(rank, same[rank]!);
    });
  }
  return held;
}

/** Bytes a restore of `set` sends: every rank's weights, and its optimizer's two moments where it has them; none to the `held` ranks. */
export function setBytes(set: CheckpointSet, held: KeptRanks = {}): number {
  let n = 0;
  for (const [model, shards] of Object.entries(set)) {
    for (const [rank, c] of shards.entries()) {
      if (held[model]?.has(rank)) continue;
      for (const t of c.tensors) n += t.data.byteLength;
      for (const m of c.optimizer?.moments ?? []) n += m.m.byteLength + m.v.byteLength;
    }
  }
  return n;
}

/** A checkpoint as the state digest reads it. */
const rankState = (c: Checkpoint) => ({ tensors: c.tensors, optimizer: c.optimizer, ledger: c.ledger ?? [] });

/** The shards each device holds on the plan's owner layouts: what a reset before a restore may keep. */
function ownedShards(r: RunSpec, devices: readonly number[]): Map<number, Array<{ model: string; layout: Layout; rank: number }>> {
  const keep = new Map<number, Array<{ model: string; layout: Layout; rank: number }>>(devices.map((x) => [x, []]));
  for (const model of keptModels(r)) {
    const layout = layoutOf(r, ownerOf(r, model));
    layout.devices.forEach((device, rank) => keep.get(device)?.push({ model, layout, rank }));
  }
  return keep;
}

/**
 * Every device back to a snapshot; returns what setup returns, the snapshot gone back to, what
 * the devices hold of it now (`restored`), and which ranks of that they kept through the reset
 * (`held`: a device that still holds a rank of the plan with the snapshot's state, proven by its
 * digest, is sent nothing). The rest is loaded and restored.
 */
export async function restoreDevices(
  input: RestoreInput,
): Promise<SetupOutput & { snapshot: number; restored?: CheckpointSet; held?: KeptRanks; resharded?: string[]; bytes?: number; keptBytes?: number }> {
  const { d, r, store } = input;
  if (input.snapshot === undefined) {
    await resetDevices(d, r, input.devices);
    const after = input.resume?.iteration ?? -1;
    const out = await setupModels(d, r, input.resume?.checkpoint, input.demonstrate);
    await store.saveSnapshot(after, await takeCheckpoint(d, r, after), checkpointLayouts(r));
    return { ...out, snapshot: after, resharded: [] };
  }
  const kept = await resetDevices(d, r, input.devices, ownedShards(r, input.devices));
  const found = input.loaded ?? (await store.loadSnapshot(input.snapshot));
  if (!found) throw new Error(`the run store has no snapshot after iteration ${input.snapshot} to recover from`);
  const { set, resharded } = reshardToPlan(r, found.set, found.layouts);
  const held = heldRanks(r, set, kept);
  const out = await setupModels(d, r, set, undefined, held);
  const bytes = setBytes(set, held);
  return { ...out, snapshot: input.snapshot, restored: set, held, resharded, bytes, keptBytes: setBytes(set) - bytes };
}
