// Re-planning when the devices change for good: lost (past their restart intensity, cordoned) or
// back (a worker that joins for a device the plan no longer uses). A plan on the devices the run
// has, searched within the scenario's budget from the current plan repaired (each call kept where
// its devices all remain, else put on the largest whole block of its old mesh, or of the cluster)
// and from every call on each largest block; the current plan itself stays a candidate where it
// still fits, at no migration. Candidates are ranked by what the rest of the run costs: the
// migration (each model moved off its old layout by planMigration — from the devices that hold
// it, and from the snapshot only what lost devices alone held) plus the remaining iterations × the
// period. So a device that comes back is used only where the time it saves over the remaining
// iterations is more than its migration costs. Pure: the supervisor acts on what it returns.
import { availableDevices, deviceCount, meshAvailable, parseMesh, planMigration, sliceElements, type Layout } from '../../../mesh/parallel/index.ts';
import type { CallName } from '../scenario/scenario.ts';
import { coarseInfo, piecesSeconds } from './cost.ts';
import { Evaluator, callCandidates, callNames, meshes, type Candidate, type Evaluation, type Placement, type Problem } from './planner.ts';
import { planKey, search, type SearchOptions } from './search.ts';

export class ReplanError extends Error {
  override name = 'ReplanError';
}

export interface ModelMigration {
  model: string;
  from: Layout;
  to: Layout;
  /** Bytes survivors send (each destination counted). */
  bytes: number;
  /** The least survivors could send for this move. */
  minimumBytes: number;
  /** Bytes read from the snapshot: what only the lost devices held. */
  snapshotBytes: number;
  seconds: number;
}

export interface Replan {
  /** Devices the run no longer has, after the change. */
  lost: number[];
  /** The devices the new plan may use. */
  devices: number[];
  plan: Candidate;
  evaluation: Evaluation;
  /** Seconds per iteration: the current plan on every device, and the new one on those left. */
  period: { before: number; after: number };
  migration: { seconds: number; bytes: number; minimumBytes: number; snapshotBytes: number; models: ModelMigration[] };
  /** migration.seconds + remaining × period.after: what the search's kept plans are ranked by. */
  objective: number;
  remaining: number;
  /** Whether the plan changes (after a loss it must; after a join only where it pays). */
  changed: boolean;
  /** remaining × (period.before − period.after): what the new plan saves, against migration.seconds. */
  gainSeconds: number;
  /** The decision in a sentence, with both estimates. */
  why: string;
  /** seconds: from the change to the plan chosen (pricing the current plan, the warm starts, the chains, the finalists' ranking). */
  search: { seconds: number; evaluations: number; evaluated: number; kept: number };
}

const layoutOf = (p: Placement): Layout => ({ devices: p.devices, dp: p.dp, tp: p.tp, pp: p.pp });

/** Names the devices of a cluster, as an error says what was expected. */
const range = (n: number) => (n === 1 ? 'device 0' : `devices 0-${n - 1}`);

/** Devices as runs: [0, 1, 2, 5, 7, 8] → "0-2, 5, 7-8". */
export function deviceRuns(devices: readonly number[]): string {
  const sorted = [...new Set(devices)].sort((a, b) => a - b);
  const out: string[] = [];
  for (let i = 0; i < sorted.length; ) {
    let j = i;
    while (j + 1 < sorted.length && sorted[j + 1] === sorted[j]! + 1) j += 1;
    out.push(j === i ? `${sorted[i]}` : `${sorted[i]}-${sorted[j]}`);
    i = j + 1;
  }
  return out.join(', ');
}

/** What changed: devices lost for good, and devices (lost before) whose workers joined again. */
export interface DeviceChange {
  lost?: readonly number[];
  joined?: readonly number[];
}

/**
 * The best plan for the rest of the run once `change` has happened. `problem.cluster.lost`: the
 * devices the run had already lost, which `current` (the plan it has now) does not use;
 * `remaining`: the iterations still to run.
 */
export function replan(problem: Problem, current: Candidate, change: DeviceChange, o: { remaining: number; search: SearchOptions }): Replan {
  const total = deviceCount(problem.cluster);
  const lostBefore = new Set(problem.cluster.lost ?? []);
  const lost = change.lost ?? [];
  const joined = change.joined ?? [];
  for (const d of [...lost, ...joined]) {
    if (!Number.isInteger(d) || d < 0 || d >= total) throw new ReplanError(`device ${d}: the cluster has ${range(total)}`);
  }
  for (const d of joined) {
    if (!lostBefore.has(d)) throw new ReplanError(`device ${d} joined, but the run has not lost it: it is the plan's already`);
    if (lost.includes(d)) throw new ReplanError(`device ${d} is both lost and joined`);
  }
  for (const d of lost) if (lostBefore.has(d)) throw new ReplanError(`device ${d} is lost already`);
  const gone = [...new Set([...lostBefore, ...lost])].filter((d) => !joined.includes(d)).sort((a, b) => a - b);
  const cluster = { ...problem.cluster, lost: gone };
  const devices = availableDevices(cluster);
  if (devices.length === 0) throw new ReplanError(`no device is left: the cluster's ${range(total)} are all lost`);
  // The search's seconds: from the change to the plan chosen — the current plan priced, the warm
  // starts, the annealing chains, and the finalists ranked by the objective.
  const t0 = performance.now();
  const before = new Evaluator(problem).evaluate(current).iterationSeconds;
  const left: Problem = { ...problem, cluster };
  const ev = new Evaluator(left);
  const starts = startsFor(ev, current);
  const found = search(ev, starts, { ...o.search, keep: Math.max(o.search.keep ?? 0, 8) });
  const kept = found.best.length ? found.best.map((b) => b.plan) : starts;
  // The plan the run has stays a candidate where it still fits the devices: moving costs nothing.
  const stays = Object.values(current).every((p) => meshAvailable(p.mesh, cluster));
  const candidates = stays && !kept.some((c) => planKey(c) === planKey(current)) ? [current, ...kept] : kept;
  const lostNow = new Set(lost);
  const ranked = candidates
    .map((plan) => {
      const evaluation = ev.evaluate(plan);
      const migration = migrationOf(problem, current, plan, lostNow);
      return { plan, evaluation, migration, objective: migration.seconds + o.remaining * evaluation.iterationSeconds };
    })
    .sort((a, b) => Number(b.evaluation.feasible) - Number(a.evaluation.feasible) || a.objective - b.objective);
  // The chosen plan's simulation, whole (the report draws it), only for the one chosen.
  const best = { ...ranked[0]!, evaluation: ev.evaluate(ranked[0]!.plan, true) };
  const seconds = (performance.now() - t0) / 1000;
  if (!best.evaluation.feasible) {
    throw new ReplanError(`no plan fits the ${devices.length} device(s) left (${deviceRuns(devices)}) after losing ${deviceRuns([...gone])}: ${best.evaluation.why}`);
  }
  const after = best.evaluation.iterationSeconds;
  const changed = planKey(best.plan) !== planKey(current);
  const gainSeconds = o.remaining * (before - after);
  const s = (x: number) => `${x.toFixed(1)} s`;
  const why = lost.length
    ? `device(s) ${deviceRuns(lost)} lost: a new plan on ${devices.length} device(s), ${s(after)} per iteration (was ${s(before)}), after a migration of ${s(best.migration.seconds)}`
    : changed
      ? `device(s) ${deviceRuns(joined)} joined and are used: they save ${s(gainSeconds)} over ${o.remaining} iterations, more than the migration's ${s(best.migration.seconds)}`
      : `device(s) ${deviceRuns(joined)} joined and are left idle: no plan that uses them saves more over ${o.remaining} iterations than its migration costs`;
  return {
    lost: gone,
    devices,
    plan: best.plan,
    evaluation: best.evaluation,
    period: { before, after },
    migration: best.migration,
    objective: best.objective,
    remaining: o.remaining,
    changed,
    gainSeconds,
    why,
    search: { seconds, evaluations: found.evaluations, evaluated: found.evaluated, kept: ranked.length },
  };
}

/**
 * Where the search starts: the current plan repaired (a call whose devices all survive stays; one
 * that lost any goes to the largest surviving block of its mesh, else of the cluster, with the
 * strategy fastest there on its own), and every call together on each largest surviving block.
 */
function startsFor(ev: Evaluator, current: Candidate): Candidate[] {
  const { cluster } = ev.problem;
  const whole = meshes(cluster);
  const size = (m: string) => parseMesh(m, cluster).devices.length;
  const largest = Math.max(...whole.map(size));
  const fastestOn = (call: CallName, mesh: string): Placement | undefined =>
    callCandidates(ev.problem, call)
      .filter((p) => p.mesh === mesh)
      .sort((a, b) => (ev.callCost(call, a, true)?.seconds ?? 0) - (ev.callCost(call, b, true)?.seconds ?? 0))[0];
  const repaired = Object.fromEntries(
    callNames(ev.problem).map((call) => {
      const p = current[call]!;
      if (meshAvailable(p.mesh, cluster)) return [call, p];
      const inside = whole.filter((m) => parseMesh(m, cluster).devices.every((d) => p.devices.includes(d))).sort((a, b) => size(b) - size(a));
      // Then the largest blocks of the cluster, then any (a rule reward runs on one device only).
      for (const mesh of [...inside, ...whole.filter((m) => size(m) === largest), ...[...whole].sort((a, b) => size(b) - size(a))]) {
        const q = fastestOn(call, mesh);
        if (q) return [call, q];
      }
      throw new ReplanError(`'${call}' has no placement on the devices left`);
    }),
  ) as Candidate;
  const together = whole.filter((m) => size(m) === largest).map((mesh) => Object.fromEntries(callNames(ev.problem).map((call) => [call, fastestOn(call, mesh) ?? repaired[call]!])) as Candidate);
  return [repaired, ...together].sort((a, b) => ev.objective(a) - ev.objective(b));
}

/** Every model with weights moved from its owner's old placement to its new one, off the lost devices. */
function migrationOf(problem: Problem, from: Candidate, to: Candidate, lost: ReadonlySet<number>): Replan['migration'] {
  const perNode = problem.cluster.devicesPerNode;
  const nodeOf = (d: number) => Math.floor(d / perNode);
  const models: ModelMigration[] = [];
  for (const m of problem.graph.models) {
    const shape = problem.models[m.name];
    if (!shape) continue; // the rule reward: nothing to move
    const a = layoutOf(from[m.owner]!);
    const b = layoutOf(to[m.owner]!);
    const plan = planMigration(coarseInfo(shape, m.valueHead), a, b, nodeOf, lost);
    const scale = shape.dtypeBytes / 4; // the transfer planner counts 4-byte elements
    // A destination reads what only the lost held from the store, at the bus's rate.
    const storeBw = problem.device.busBandwidth ?? problem.device.interBandwidth;
    const reads = new Map<number, number>();
    for (const r of plan.restores) {
      reads.set(r.device, (reads.get(r.device) ?? 0) + (sliceElements(r) * 4 * scale) / storeBw + problem.device.latency);
    }
    models.push({
      model: m.name,
      from: a,
      to: b,
      bytes: plan.receivedBytes * scale,
      minimumBytes: plan.minimumBytes * scale,
      snapshotBytes: plan.snapshotBytes * scale,
      seconds: piecesSeconds(shape, plan.pieces, problem.device, perNode, reads),
    });
  }
  // Counted as if the models moved one after another: where they share devices and links they
  // cannot all go at full speed at once.
  const sum = (k: 'bytes' | 'minimumBytes' | 'snapshotBytes' | 'seconds') => models.reduce((n, x) => n + x[k], 0);
  return { seconds: sum('seconds'), bytes: sum('bytes'), minimumBytes: sum('minimumBytes'), snapshotBytes: sum('snapshotBytes'), models };
}
