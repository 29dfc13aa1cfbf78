// Plans: every model function call on a mesh with a dp × tp × pp strategy. This module evaluates a
// plan (cost model + simulator, with memory feasibility), generates the named placements of the
// published systems, and searches for a faster plan with Metropolis–Hastings.
import { deviceCount, parseMesh, type Cluster } from '../../mesh/cluster.ts';
import { layoutKey, type Layout } from '../../mesh/layout.ts';
import { CALLS, modelOf, type CallName, type ModelName } from '../scenario.ts';
import type { DeviceProfile, ModelShape } from './catalog.ts';
import { callCost, reallocSeconds, strategyProblem, type CallCost, type CallKind, type Workload } from './cost.ts';
import { simulate, type Simulation, type TaskSpec } from './simulate.ts';

export interface Problem {
  name: string;
  /** Shapes of the four models; a rule reward has none (it costs nothing to speak of). */
  models: Record<ModelName, ModelShape | undefined>;
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

export const OWNER: Record<ModelName, CallName> = {
  actor: 'actor.train',
  critic: 'critic.train',
  reference: 'reference.inference',
  reward: 'reward.inference',
};

const KIND: Record<CallName, CallKind> = {
  'actor.generate': 'generate',
  'reference.inference': 'inference',
  'reward.inference': 'inference',
  'critic.inference': 'inference',
  'actor.train': 'train',
  'critic.train': 'train',
};

const layoutOf = (p: Placement): Layout => ({ devices: p.devices, dp: p.dp, tp: p.tp, pp: p.pp });
const valueHead = (model: ModelName) => model === 'critic' || model === 'reward';

/** Caches of the costs a search asks for over and over. */
export class Evaluator {
  private readonly calls = new Map<string, CallCost>();
  private readonly moves = new Map<string, number>();
  constructor(readonly problem: Problem) {}

  /** `availableBytes`: device memory left by the models resident on the call's devices. */
  callCost(call: CallName, p: Placement, owner: boolean, availableBytes?: number): CallCost | undefined {
    const model = modelOf(call);
    const shape = this.problem.models[model];
    if (!shape) return undefined;
    const available = availableBytes === undefined ? undefined : Math.max(0, Math.floor(availableBytes / 1e8) * 1e8);
    const key = `${call}|${layoutKey(layoutOf(p))}|${owner}|${available}`;
    let c = this.calls.get(key);
    if (!c) {
      const trainable = model === 'actor' || model === 'critic';
      c = callCost(shape, KIND[call], layoutOf(p), this.problem.workload, this.problem.device, this.problem.cluster.devicesPerNode, {
        valueHead: valueHead(model),
        owner,
        trainable,
        ...(available === undefined ? {} : { availableBytes: available }),
      });
      this.calls.set(key, c);
    }
    return c;
  }

  realloc(model: ModelName, from: Placement, to: Placement): number {
    const shape = this.problem.models[model];
    if (!shape) return 0;
    const key = `${model}|${layoutKey(layoutOf(from))}|${layoutKey(layoutOf(to))}`;
    let s = this.moves.get(key);
    if (s === undefined) {
      s = reallocSeconds(shape, layoutOf(from), layoutOf(to), this.problem.device, this.problem.cluster.devicesPerNode, valueHead(model));
      this.moves.set(key, s);
    }
    return s;
  }

  evaluate(c: Candidate, keepTimeline = false): Evaluation {
    const { device } = this.problem;
    const resident = new Map<number, number>();
    for (const model of Object.keys(OWNER) as ModelName[]) {
      const owner = c[OWNER[model]];
      const cost = this.callCost(OWNER[model], owner, true);
      for (const d of owner.devices) resident.set(d, (resident.get(d) ?? 0) + (cost?.residentBytes ?? 0));
    }
    const calls = {} as Record<CallName, CallReport>;
    const tasks = {} as Record<CallName, TaskSpec>;
    let why: string | undefined;
    let overflow = 0;
    for (const call of CALLS) {
      const model = modelOf(call);
      const p = c[call];
      const owner = c[OWNER[model]];
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
    const sim = simulate(tasks, { sharedCores: device.sharedCores });
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
  const model = modelOf(call);
  const shape = problem.models[model];
  const out: Placement[] = [];
  for (const mesh of meshes(problem.cluster)) {
    const size = parseMesh(mesh, problem.cluster).devices.length;
    if (!shape && size > 1) continue; // a rule reward runs on one device
    // A training call sees a mini-batch at a time: every replica needs a row of it.
    const { batch, minibatches } = problem.workload;
    const per = Math.ceil(batch / minibatches);
    const rows = call.endsWith('.train') ? Math.min(per, batch - (minibatches - 1) * per) : batch;
    for (const s of strategies(size, problem.cluster.devicesPerNode)) {
      if (shape && strategyProblem(shape, s)) continue;
      if (s.dp > rows) continue;
      out.push(placement(problem.cluster, mesh, s));
    }
  }
  return out;
}

// ---- named strategies ----------------------------------------------------------------------------

export const NAMED = ['flattening', 'interleaving', 'separation', 'colocate', 'split'] as const;
export type NamedStrategy = (typeof NAMED)[number];

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
  let plan = ruleReward(ev, Object.fromEntries(CALLS.map((call) => [call, bestOn(ev, call, meshOf(call))])) as Candidate);
  if (alternative && ev.objective(alternative) < ev.objective(plan)) plan = alternative;
  // Each call tries the few strategies that are fastest on its mesh on their own: on a large
  // mesh there are dozens, and each new pair of layouts costs a transfer plan.
  const options = Object.fromEntries(
    CALLS.map((call) => [
      call,
      callCandidates(ev.problem, call)
        .filter((p) => p.mesh === plan[call].mesh)
        .sort((a, b) => (ev.callCost(call, a, true)?.seconds ?? 0) - (ev.callCost(call, b, true)?.seconds ?? 0))
        .slice(0, 8),
    ]),
  ) as Record<CallName, Placement[]>;
  for (let round = 0; round < 3; round++) {
    let changed = false;
    for (const call of CALLS) {
      let best = plan;
      let bestScore = ev.objective(plan);
      for (const p of options[call]) {
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

/** A rule reward needs one device: the first of its mesh. */
function ruleReward(ev: Evaluator, c: Candidate): Candidate {
  if (ev.problem.models.reward) return c;
  const first = c['reward.inference'].devices[0]!;
  const per = ev.problem.cluster.devicesPerNode;
  return { ...c, 'reward.inference': placement(ev.problem.cluster, `${Math.floor(first / per)}:${first % per}`, { dp: 1, tp: 1, pp: 1 }) };
}

export function namedPlan(ev: Evaluator, name: NamedStrategy): Candidate {
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
        const c = ruleReward(ev, Object.fromEntries(CALLS.map((call) => [call, placement(cluster, all, s)])) as Candidate);
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
      // APP: actor and critic on all devices; reference and reward on an exclusive half each.
      const [a, b] = parts(cluster, 2);
      return withBest(ev, (call) => (call === 'reference.inference' ? a! : call === 'reward.inference' ? b! : all));
    }
    case 'separation': {
      // APP: training on one half; shadow copies generate and infer on the other.
      const [train, infer] = parts(cluster, 2);
      return withBest(ev, (call) => (call.endsWith('.train') ? train! : infer!));
    }
    case 'split': {
      // OpenRLHF: every model on its own devices.
      const q = parts(cluster, 4);
      const of: Record<ModelName, string> = { actor: q[0]!, critic: q[1] ?? q[0]!, reference: q[2] ?? q[0]!, reward: q[3] ?? q[0]! };
      return withBest(ev, (call) => of[modelOf(call)]);
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

const planKey = (c: Candidate) => CALLS.map((call) => `${c[call].mesh}/${c[call].dp}${c[call].tp}${c[call].pp}`).join('|');

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
  const candidates = Object.fromEntries(
    CALLS.map((call) => {
      const ranked = callCandidates(ev.problem, call)
        .map((p) => ({ p, c: ev.callCost(call, p, true) }))
        .filter(({ c }) => !c || c.residentBytes + c.transientBytes <= ev.problem.device.memoryBytes)
        .sort((a, b) => (a.c?.seconds ?? 0) - (b.c?.seconds ?? 0))
        .slice(0, perCall)
        .map(({ p }) => p);
      const seen = new Set(ranked.map((p) => `${p.mesh}/${p.dp}${p.tp}${p.pp}`));
      for (const s of starts) if (!seen.has(`${s[call].mesh}/${s[call].dp}${s[call].tp}${s[call].pp}`)) ranked.push(s[call]);
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
    const temperature = scale * 0.1 * Math.pow(0.01, progress); // seconds
    const chain = chains[step % chains.length]!;
    const call = CALLS[Math.floor(rand() * CALLS.length)]!;
    const options = candidates[call];
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
