// Plans: every model function call on a mesh with a dp × tp × pp strategy. This module evaluates a
// plan (cost model + simulator, with memory feasibility), generates the named placements of the
// published systems, and searches for a faster plan with Metropolis–Hastings.
import { deviceCount, parseMesh, type Cluster } from '../../../mesh/parallel/index.ts';
import { layoutKey, type Layout } from '../../../mesh/parallel/index.ts';
import type { CallName } from '../scenario.ts';
import type { DeviceProfile, ModelShape } from './catalog.ts';
import { callCost, reallocSeconds, strategyProblem, type CallCost, type CallKind, type Workload } from './cost.ts';
import { simulate, type Flow, type Simulation, type TaskSpec } from './simulate.ts';

/** A call of the algorithm, as the planner prices it. */
export interface PlanCall {
  name: CallName;
  model: string;
  kind: CallKind;
  /** Sequences it processes per iteration (generation: prompts × samples per prompt). */
  rows: number;
}

export interface PlanModel {
  name: string;
  valueHead: boolean;
  trainable: boolean;
  /** The call whose layout holds its weights (a trained model's train call). */
  owner: CallName;
}

/** The algorithm's graph as the planner sees it: calls, models, and the order between calls. */
export interface PlanGraph {
  calls: PlanCall[];
  models: PlanModel[];
  flow: Flow;
}

export interface Problem {
  name: string;
  /** Shapes of the algorithm's models; a rule reward has none (it costs nothing to speak of). */
  models: Record<string, ModelShape | undefined>;
  graph: PlanGraph;
  workload: Workload;
  cluster: Cluster;
  device: DeviceProfile;
}

export interface Placement {
  mesh: string;
  devices: number[];
  dp: number;
  tp: number;
  pp: number;
}

export type Candidate = Record<CallName, Placement>;

export interface CallReport {
  placement: Placement;
  seconds: number;
  reallocSeconds: number;
  /** Peak memory per device for this call, including models resident on its devices. */
  memoryBytes: number;
}

export interface Evaluation {
  feasible: boolean;
  why?: string;
  /** How far the fullest device is over its memory (0 when the plan fits). */
  overflowBytes: number;
  iterationSeconds: number;
  calls: Record<CallName, CallReport>;
  simulation?: Simulation;
}

const layoutOf = (p: Placement): Layout => ({ devices: p.devices, dp: p.dp, tp: p.tp, pp: p.pp });

const callOf = (problem: Problem, call: CallName): PlanCall => {
  const c = problem.graph.calls.find((x) => x.name === call);
  if (!c) throw new Error(`'${call}' is not a call of the problem's graph`);
  return c;
};
const modelOf = (problem: Problem, model: string): PlanModel => problem.graph.models.find((m) => m.name === model)!;
export const callNames = (problem: Problem): CallName[] => problem.graph.calls.map((c) => c.name);

/** Caches of the costs a search asks for over and over. */
export class Evaluator {
  private readonly calls = new Map<string, CallCost>();
  private readonly moves = new Map<string, number>();
  constructor(readonly problem: Problem) {}

  /** `availableBytes`: device memory left by the models resident on the call's devices. */
  callCost(call: CallName, p: Placement, owner: boolean, availableBytes?: number): CallCost | undefined {
    const info = callOf(this.problem, call);
    const model = modelOf(this.problem, info.model);
    const shape = this.problem.models[info.model];
    if (!shape) return undefined;
    const available = availableBytes === undefined ? undefined : Math.max(0, Math.floor(availableBytes / 1e8) * 1e8);
    const key = `${call}|${layoutKey(layoutOf(p))}|${owner}|${available}`;
    let c = this.calls.get(key);
    if (!c) {
      c = callCost(shape, info.kind, layoutOf(p), { ...this.problem.workload, batch: info.rows }, this.problem.device, this.problem.cluster.devicesPerNode, {
        valueHead: model.valueHead,
        owner,
        trainable: model.trainable,
        ...(available === undefined ? {} : { availableBytes: available }),
      });
      this.calls.set(key, c);
    }
    return c;
  }

  realloc(model: string, from: Placement, to: Placement): number {
    const shape = this.problem.models[model];
    if (!shape) return 0;
    const key = `${model}|${layoutKey(layoutOf(from))}|${layoutKey(layoutOf(to))}`;
    let s = this.moves.get(key);
    if (s === undefined) {
      s = reallocSeconds(shape, layoutOf(from), layoutOf(to), this.problem.device, this.problem.cluster.devicesPerNode, modelOf(this.problem, model).valueHead);
      this.moves.set(key, s);
    }
    return s;
  }

  evaluate(c: Candidate, keepTimeline = false): Evaluation {
    const { device } = this.problem;
    const resident = new Map<number, number>();
    for (const model of this.problem.graph.models) {
      const owner = c[model.owner]!;
      const cost = this.callCost(model.owner, owner, true);
      for (const d of owner.devices) resident.set(d, (resident.get(d) ?? 0) + (cost?.residentBytes ?? 0));
    }
    const calls = {} as Record<CallName, CallReport>;
    const tasks = {} as Record<CallName, TaskSpec>;
    let why: string | undefined;
    let overflow = 0;
    for (const call of callNames(this.problem)) {
      const model = callOf(this.problem, call).model;
      const p = c[call]!;
      const owner = c[modelOf(this.problem, model).owner]!;
      const isOwner = layoutKey(layoutOf(p)) === layoutKey(layoutOf(owner));
      const problem = this.problem.models[model] ? strategyProblem(this.problem.models[model]!, p) : undefined;
      if (problem) why ??= `${call}: ${problem}`;
      const residentHere = Math.max(...p.devices.map((d) => resident.get(d) ?? 0));
      const cost = this.callCost(call, p, isOwner, device.memoryBytes - residentHere);
      // A view is loaded, filled and released: two calls more than the move itself.
      const moveSeconds = isOwner ? 0 : this.realloc(model, owner, p) + 2 * (device.callOverhead ?? 0);
      const memory = Math.max(...p.devices.map((d) => (resident.get(d) ?? 0) + (cost?.transientBytes ?? 0)));
      if (memory > device.memoryBytes) {
        why ??= `${call} needs ${(memory / 1e9).toFixed(1)} GB on a device of ${(device.memoryBytes / 1e9).toFixed(0)} GB`;
        overflow = Math.max(overflow, memory - device.memoryBytes);
      }
      calls[call] = { placement: p, seconds: cost?.seconds ?? 0, reallocSeconds: moveSeconds, memoryBytes: memory };
      const segments: TaskSpec['segments'] = [];
      if (moveSeconds > 0) segments.push({ kind: 'realloc', devices: [...new Set([...owner.devices, ...p.devices])].sort((a, b) => a - b), seconds: moveSeconds });
      segments.push({ kind: 'compute', devices: p.devices, seconds: cost?.seconds ?? 0 });
      tasks[call] = { call, segments };
    }
    if (why) return { feasible: false, why, overflowBytes: overflow, iterationSeconds: Infinity, calls };
    const sim = simulate(tasks, this.problem.graph.flow, { sharedCores: device.sharedCores });
    return { feasible: true, overflowBytes: 0, iterationSeconds: sim.iterationSeconds, calls, ...(keepTimeline ? { simulation: sim } : {}) };
  }

  /**
   * What a search minimises: the iteration time of a feasible plan; for one that does not fit,
   * a penalty above every feasible time that shrinks as the plan comes closer to fitting.
   */
  objective(c: Candidate): number {
    const e = this.evaluate(c);
    return e.feasible ? e.iterationSeconds : 1e9 + e.overflowBytes / 1e6;
  }
}

// ---- candidates ----------------------------------------------------------------------------------

/** Every mesh of the cluster: aligned power-of-two blocks inside a node, runs of whole nodes. */
export function meshes(cluster: Cluster): Placement['mesh'][] {
  const out: string[] = [];
  for (let n = 0; n < cluster.nodes; n++) {
    for (let size = 1; size <= cluster.devicesPerNode; size *= 2) {
      for (let a = 0; a + size <= cluster.devicesPerNode; a += size) out.push(size === 1 ? `${n}:${a}` : `${n}:${a}-${a + size - 1}`);
    }
  }
  for (let size = 2; size <= cluster.nodes; size *= 2) {
    for (let a = 0; a + size <= cluster.nodes; a += size) out.push(`${a}-${a + size - 1}:*`);
  }
  return out;
}

/** dp × tp × pp factorizations of a mesh, with tensor groups inside one node. */
export function strategies(size: number, perNode: number): Array<{ dp: number; tp: number; pp: number }> {
  const out = [];
  for (let tp = 1; tp <= Math.min(size, perNode); tp *= 2) {
    for (let pp = 1; tp * pp <= size; pp *= 2) {
      if (size % (tp * pp) === 0) out.push({ dp: size / (tp * pp), tp, pp });
    }
  }
  return out;
}

export function placement(cluster: Cluster, mesh: string, s: { dp: number; tp: number; pp: number }): Placement {
  return { mesh, devices: parseMesh(mesh, cluster).devices, ...s };
}

/** The placements a call may take: every mesh and strategy that can run its model at all. */
export function callCandidates(problem: Problem, call: CallName): Placement[] {
  const info = callOf(problem, call);
  const shape = problem.models[info.model];
  const out: Placement[] = [];
  for (const mesh of meshes(problem.cluster)) {
    const size = parseMesh(mesh, problem.cluster).devices.length;
    if (!shape && size > 1) continue; // a rule reward runs on one device
    // A training call sees a mini-batch at a time: every replica needs a row of it.
    const { minibatches } = problem.workload;
    const batch = info.rows;
    const per = Math.ceil(batch / minibatches);
    const rows = info.kind === 'train' ? Math.min(per, batch - (minibatches - 1) * per) : batch;
    for (const s of strategies(size, problem.cluster.devicesPerNode)) {
      if (shape && strategyProblem(shape, s)) continue;
      if (s.dp > rows) continue;
      out.push(placement(problem.cluster, mesh, s));
    }
  }
  return out;
}

// ---- named placements ----------------------------------------------------------------------------

/** The published systems' placements of the calls over the devices (each call's dp × tp × pp strategy tuned for the whole plan). */
export const PLACEMENTS = ['flattening', 'interleaving', 'separation', 'colocate', 'split'] as const;
export type NamedPlacement = (typeof PLACEMENTS)[number];

/** The cheapest strategy for one call on a mesh, as if the call ran alone there. */
function bestOn(ev: Evaluator, call: CallName, mesh: string): Placement {
  const { cluster } = ev.problem;
  const size = parseMesh(mesh, cluster).devices.length;
  const options = callCandidates(ev.problem, call).filter((p) => p.mesh === mesh);
  if (options.length === 0) return placement(cluster, mesh, { dp: size, tp: 1, pp: 1 });
  return options.reduce((best, p) => ((ev.callCost(call, p, true)?.seconds ?? 0) < (ev.callCost(call, best, true)?.seconds ?? 0) ? p : best));
}

function nodeMesh(cluster: Cluster, n: number): string {
  return cluster.devicesPerNode === 1 ? `${n}:0` : `${n}:0-${cluster.devicesPerNode - 1}`;
}

/** The cluster cut into `k` equal meshes: runs of whole nodes when there are enough, else blocks. */
function parts(cluster: Cluster, k: number): string[] {
  if (cluster.nodes >= k) {
    const per = Math.floor(cluster.nodes / k);
    return Array.from({ length: k }, (_, i) => (per === 1 ? nodeMesh(cluster, i) : `${i * per}-${(i + 1) * per - 1}:*`));
  }
  const perNode = Math.ceil(k / cluster.nodes);
  const size = Math.max(1, Math.floor(cluster.devicesPerNode / perNode));
  const out: string[] = [];
  for (let n = 0; n < cluster.nodes; n++) for (let a = 0; a + size <= cluster.devicesPerNode; a += size) out.push(size === 1 ? `${n}:${a}` : `${n}:${a}-${a + size - 1}`);
  // Fewer devices than parts: parts share the last mesh.
  return Array.from({ length: k }, (_, i) => out[Math.min(i, out.length - 1)]!);
}

function whole(cluster: Cluster): string {
  return cluster.nodes === 1 ? nodeMesh(cluster, 0) : `0-${cluster.nodes - 1}:*`;
}

/**
 * Fixed meshes, strategies chosen for the whole plan: start from each call's fastest strategy on
 * its mesh, then, call by call, take the strategy that makes the whole plan best (feasible and
 * fastest, or closest to fitting), until nothing changes.
 */
function withBest(ev: Evaluator, meshOf: (call: CallName) => string, alternative?: Candidate): Candidate {
  const calls = callNames(ev.problem);
  let plan = ruleReward(ev, Object.fromEntries(calls.map((call) => [call, bestOn(ev, call, meshOf(call))])) as Candidate);
  if (alternative && ev.objective(alternative) < ev.objective(plan)) plan = alternative;
  // Each call tries the few strategies that are fastest on its mesh on their own: on a large
  // mesh there are dozens, and each new pair of layouts costs a transfer plan.
  const options = Object.fromEntries(
    calls.map((call) => [
      call,
      callCandidates(ev.problem, call)
        .filter((p) => p.mesh === plan[call]!.mesh)
        .sort((a, b) => (ev.callCost(call, a, true)?.seconds ?? 0) - (ev.callCost(call, b, true)?.seconds ?? 0))
        .slice(0, 8),
    ]),
  ) as Record<CallName, Placement[]>;
  for (let round = 0; round < 3; round++) {
    let changed = false;
    for (const call of calls) {
      let best = plan;
      let bestScore = ev.objective(plan);
      for (const p of options[call]!) {
        const next = { ...plan, [call]: p };
        const score = ev.objective(next);
        if (score < bestScore - 1e-12) [best, bestScore] = [next, score];
      }
      if (best !== plan) {
        plan = best;
        changed = true;
      }
    }
    if (!changed) break;
  }
  return plan;
}

/** A model without a shape (the rule reward) runs on one device: the first of each of its calls' meshes. */
function ruleReward(ev: Evaluator, c: Candidate): Candidate {
  const out = { ...c };
  const per = ev.problem.cluster.devicesPerNode;
  for (const call of ev.problem.graph.calls) {
    if (ev.problem.models[call.model]) continue;
    const first = c[call.name]!.devices[0]!;
    out[call.name] = placement(ev.problem.cluster, `${Math.floor(first / per)}:${first % per}`, { dp: 1, tp: 1, pp: 1 });
  }
  return out;
}

export function namedPlan(ev: Evaluator, name: NamedPlacement): Candidate {
  const { cluster } = ev.problem;
  const all = whole(cluster);
  switch (name) {
    case 'flattening': {
      // DeepSpeed-Chat: every model on every device with one strategy for all calls.
      const size = deviceCount(cluster);
      let best: Candidate | undefined;
      let bestScore = Infinity;
      for (const s of strategies(size, cluster.devicesPerNode)) {
        const shapes = Object.values(ev.problem.models).filter((m): m is ModelShape => m !== undefined);
        if (shapes.some((m) => strategyProblem(m, s))) continue;
        const c = ruleReward(ev, Object.fromEntries(callNames(ev.problem).map((call) => [call, placement(cluster, all, s)])) as Candidate);
        const score = ev.objective(c);
        if (!best || score < bestScore) [best, bestScore] = [c, score];
      }
      return best!;
    }
    case 'colocate':
      // verl: one mesh for everything, each call with its own best strategy; flattening's one
      // strategy for all is one such plan, so it is a starting point too.
      return withBest(ev, () => all, namedPlan(ev, 'flattening'));
    case 'interleaving': {
      // APP: trained models on all devices; the frozen ones each on an exclusive half (alternating).
      const halves = parts(cluster, 2);
      const frozen = ev.problem.graph.models.filter((m) => !m.trainable).map((m) => m.name);
      return withBest(ev, (call) => {
        const model = callOf(ev.problem, call).model;
        const i = frozen.indexOf(model);
        return i < 0 ? all : halves[i % 2]!;
      });
    }
    case 'separation': {
      // APP: training on one half; shadow copies generate and infer on the other.
      const [train, infer] = parts(cluster, 2);
      return withBest(ev, (call) => (callOf(ev.problem, call).kind === 'train' ? train! : infer!));
    }
    case 'split': {
      // OpenRLHF: every model on its own devices.
      const models = ev.problem.graph.models.map((m) => m.name);
      const q = parts(cluster, models.length);
      return withBest(ev, (call) => q[models.indexOf(callOf(ev.problem, call).model)] ?? q[0]!);
    }
  }
}

// ---- search --------------------------------------------------------------------------------------

export interface SearchResult {
  best: Array<{ plan: Candidate; iterationSeconds: number }>;
  evaluated: number;
  accepted: number;
  seconds: number;
}

/** A small, seeded generator for the search (mulberry32). */
function random(seed: number) {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 2 ** 32;
  };
}

const planKey = (c: Candidate) =>
  Object.keys(c)
    .sort()
    .map((call) => `${c[call]!.mesh}/${c[call]!.dp}${c[call]!.tp}${c[call]!.pp}`)
    .join('|');

/**
 * Metropolis–Hastings over plans: a move gives one call another placement; a worse plan (Δt > 0
 * seconds) is accepted with probability exp(−Δt / T), T in seconds too, cooled geometrically from
 * 10% to 0.1% of the starting plan's time over the budget. Several chains start from the named
 * plans; the best few feasible plans are kept.
 */
export function search(ev: Evaluator, starts: Candidate[], opts: { budgetSeconds: number; chains?: number; seed?: number; keep?: number; perCall?: number }): SearchResult {
  const t0 = performance.now();
  const rand = random(opts.seed ?? 1);
  // Each call's moves are drawn from its `perCall` fastest placements that fit on their own (and
  // the placements the chains start from): on large clusters most of the thousands of mesh and
  // strategy pairs are hopeless, and every new pair of layouts costs a transfer plan.
  const perCall = opts.perCall ?? 24;
  const calls = callNames(ev.problem);
  const candidates = Object.fromEntries(
    calls.map((call) => {
      const ranked = callCandidates(ev.problem, call)
        .map((p) => ({ p, c: ev.callCost(call, p, true) }))
        .filter(({ c }) => !c || c.residentBytes + c.transientBytes <= ev.problem.device.memoryBytes)
        .sort((a, b) => (a.c?.seconds ?? 0) - (b.c?.seconds ?? 0))
        .slice(0, perCall)
        .map(({ p }) => p);
      const seen = new Set(ranked.map((p) => `${p.mesh}/${p.dp}${p.tp}${p.pp}`));
      for (const s of starts) if (!seen.has(`${s[call]!.mesh}/${s[call]!.dp}${s[call]!.tp}${s[call]!.pp}`)) ranked.push(s[call]!);
      return [call, ranked];
    }),
  ) as Record<CallName, Placement[]>;
  const chains = Array.from({ length: opts.chains ?? 4 }, (_, i) => {
    const plan = starts[i % starts.length]!;
    return { plan, time: ev.objective(plan) };
  });
  const feasibleTimes = chains.map((c) => c.time).filter((t) => t < 1e9);
  const scale = feasibleTimes.length ? Math.min(...feasibleTimes) : 1;
  const best = new Map<string, { plan: Candidate; iterationSeconds: number }>();
  const remember = (plan: Candidate, t: number) => {
    if (t < 1e9) best.set(planKey(plan), { plan, iterationSeconds: t });
  };
  chains.forEach((c) => remember(c.plan, c.time));
  let evaluated = chains.length;
  let accepted = 0;
  const budgetMs = opts.budgetSeconds * 1000;
  for (let step = 0; ; step++) {
    const elapsed = performance.now() - t0;
    if (elapsed >= budgetMs) break;
    const progress = elapsed / budgetMs;
    const temperature = scale * 0.1 * 0.01 ** progress; // seconds
    const chain = chains[step % chains.length]!;
    const call = calls[Math.floor(rand() * calls.length)]!;
    const options = candidates[call]!;
    const next = { ...chain.plan, [call]: options[Math.floor(rand() * options.length)]! } as Candidate;
    const time = ev.objective(next);
    evaluated += 1;
    const delta = time - chain.time;
    if (delta <= 0 || rand() < Math.exp(-delta / temperature)) {
      chain.plan = next;
      chain.time = time;
      accepted += 1;
      remember(next, time);
    }
  }
  const ranked = [...best.values()].sort((a, b) => a.iterationSeconds - b.iterationSeconds).slice(0, opts.keep ?? 5);
  return { best: ranked, evaluated, accepted, seconds: (performance.now() - t0) / 1000 };
}
