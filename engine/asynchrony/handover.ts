// In-flight weight updates, the supervisor's side: once the next version fills the view's other
// copy on the rollout devices, the generation still running on this version's copy is handed it.
// Each of its replicas (one device each) names the pass it stops before; that decision is written
// to the run's store, and only then are the replicas told to go on with the new version — so a
// replay can take the same passes (its decisions come from the recorded run, and are told without
// asking). engine/generation/inflight.ts is the devices' side.
import type { CallBody, ResultOf } from '../../mesh/wire/index.ts';

/** A generation's switch to one version: the pass each replica took it from (null: that replica had ended). */
export interface SwitchDecision {
  version: number;
  steps: Array<number | null>;
}

export interface HandOver {
  /** The generation's devices, one per replica (dp rank order). */
  devices: readonly number[];
  /** The generation: the iteration it generates for, and the copy of the view it runs on. */
  generation: { iteration: number; model: string };
  /** The other copy, filled with `version`. */
  to: { model: string; version: number };
  call: (device: number, model: string, body: Extract<CallBody, { fn: 'switch' }>) => Promise<ResultOf<'switch'>>;
  /** Writes the decision ahead (the run's store), before any replica goes on with it. */
  record: (decision: SwitchDecision) => Promise<void>;
  /** A replay: the decision recorded, told without asking. */
  planned?: SwitchDecision;
}

/** Hands the next version to a running generation; its decision, or undefined where no replica was still generating. */
export async function handOver(o: HandOver): Promise<SwitchDecision | undefined> {
  const base = { fn: 'switch' as const, generation: o.generation, version: o.to.version };
  let decision = o.planned;
  if (!decision) {
    const answers = await Promise.all(o.devices.map((device) => o.call(device, o.to.model, base)));
    decision = { version: o.to.version, steps: answers.map((a) => a.step ?? null) };
    if (decision.steps.every((s) => s === null)) return undefined;
    await o.record(decision);
  }
  const { steps } = decision;
  await Promise.all(o.devices.map((device, i) => (steps[i] === null || steps[i] === undefined ? undefined : o.call(device, o.to.model, { ...base, at: steps[i]! }))));
  return decision;
}

/** A generate call's replies' switches (per replica: each pass and version) as decisions, one per version. */
export function decisionsOf(perReplica: ReadonlyArray<ReadonlyArray<{ step: number; version: number }>>): SwitchDecision[] {
  const versions = [...new Set(perReplica.flatMap((r) => r.map((s) => s.version)))].sort((a, b) => a - b);
  return versions.map((version) => ({ version, steps: perReplica.map((r) => r.find((s) => s.version === version)?.step ?? null) }));
}

/**
 * How many updates behind iteration `iteration` the response tokens `mask` counts were drawn by
 * (each token's version, −1 where none): their mean and the most.
 */
export function tokenStaleness(versions: Int32Array, mask: ArrayLike<number>, iteration: number): { mean: number; max: number } | undefined {
  let n = 0;
  let sum = 0;
  let max = 0;
  for (let i = 0; i < versions.length; i++) {
    if (!mask[i] || versions[i]! < 0) continue;
    const age = iteration - versions[i]!;
    n += 1;
    sum += age;
    max = Math.max(max, age);
  }
  return n ? { mean: sum / n, max } : undefined;
}

/** Decisions by call as an iteration's metric (numbers by name): `call#version#replica` → the pass. */
export function switchMetrics(byCall: Readonly<Record<string, readonly SwitchDecision[]>>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [call, decisions] of Object.entries(byCall)) for (const d of decisions) d.steps.forEach((step, i) => step !== null && (out[`${call}#${d.version}#${i}`] = step));
  return out;
}

/** The metric back as decisions by call (switchMetrics' inverse; a replica not named took none: null). */
export function switchesOfMetric(metric: Readonly<Record<string, number>>): Record<string, SwitchDecision[]> {
  const byCall = new Map<string, Map<number, Map<number, number>>>();
  for (const [key, step] of Object.entries(metric)) {
    const [call, version, replica] = key.split('#');
    if (call === undefined || version === undefined || replica === undefined) continue;
    const versions = byCall.get(call) ?? new Map<number, Map<number, number>>();
    byCall.set(call, versions);
    const steps = versions.get(Number(version)) ?? new Map<number, number>();
    versions.set(Number(version), steps);
    steps.set(Number(replica), step);
  }
  return Object.fromEntries(
    [...byCall].map(([call, versions]) => [
      call,
      [...versions].sort((a, b) => a[0] - b[0]).map(([version, steps]) => ({ version, steps: Array.from({ length: Math.max(...steps.keys()) + 1 }, (_, i) => steps.get(i) ?? null) })),
    ]),
  );
}
