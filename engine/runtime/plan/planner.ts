// Plans: every model function call on a mesh with a dp × tp × pp strategy. This module evaluates a
// plan (cost model + simulator, with memory feasibility) and generates the named placements of the
// published systems; search.ts searches for a faster plan from them.
import { deviceCount, meshAvailable, parseMesh, type Cluster } from '../../../mesh/parallel/index.ts';
import { layoutKey, type Layout } from '../../../mesh/parallel/index.ts';
import type { CallName } from '../scenario/scenario.ts';
import type { DeviceProfile, ModelShape } from './catalog.ts';
import { callCost, parameterCounts, strategyProblem, type CallCost, type CallKind, type Workload } from './cost.ts';
import { simulate, type Flow, type Simulation, type TaskSpec } from './simulate.ts';
import { transferSeconds } from './transfer.ts';

/** A call of the algorithm, as the planner prices it. */
export interface PlanCall {
  name: CallName;
  model: string;
  kind: CallKind;
  /** Sequences it processes per iteration (generation: prompts × samples per prompt). */
  rows: number;
  /** Seconds it waits on something off the devices (reward actors on the bus), occupying none. */
  waitSeconds?: number;
}

export interface PlanModel {
  name: string;
  valueHead: boolean;
  trainable: boolean;
  /** The call whose layout holds its weights (a trained model's train call). */
  owner: CallName;
  /**
   * A frozen model that is this policy's base (a reference of a policy with LoRA adapters): where
   * a plan puts it on the policy's own layout, the policy's shards answer for it and it holds nothing.
   */
  baseOf?: string;
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
  /** Iterations between checkpoints (0 or absent: none); priced where the device has a busBandwidth. */
  checkpointEvery?: number;
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
  /** A generation's rows decoded at once per replica (its slots when it generates continuously). */
  slots?: number;
  /** In flight: the pause of its switch of version, in `seconds`. */
  switchSeconds?: number;
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

/**
 * What a call keeps computing, for the simulator's sharing of cores: one stage of each replica at
 * a time (the runtime runs a pipeline's stages in turn: while one computes, the others wait for
 * its activations or gradients), and only while it computes or works its messages' bytes: the
 * bus's latency in its collectives and sends, and an environment's answers, are waits.
 */
export function callLoad(cost: Pick<CallCost, 'seconds' | 'compute' | 'bubble' | 'communication' | 'latency'>, p: Pick<Placement, 'dp' | 'tp'>): { computing: number; share: number } {
  return { computing: p.dp * p.tp, share: cost.seconds > 0 ? Math.min(1, (cost.compute + cost.bubble + cost.communication - cost.latency) / cost.seconds) : 1 };
}

const callOf = (problem: Problem, call: CallName): PlanCall => {
  const c = problem.graph.calls.find((x) => x.name === call);
  if (!c) throw new Error(`'${call}' is not a call of the problem's graph`);
  return c;
};
const modelOf = (problem: Problem, model: string): PlanModel => problem.graph.models.find((m) => m.name === model)!;
export const callNames = (problem: Problem): CallName[] => problem.graph.calls.map((c) => c.name);

/** A call as the evaluator prices it: its place in the graph, its model and the model's shape. */
interface CallInfo {
  name: CallName;
  model: PlanModel;
  shape: ModelShape | undefined;
}

/** A plan priced call by call, before the simulator: costs, memory, and whether it fits. */
interface Priced {
  why?: string;
  overflow: number;
  /** In the graph's call order; `owner` is the model's own placement when the call runs on a view. */
  calls: Array<{ info: CallInfo; placement: Placement; owner?: Placement; seconds: number; memoryBytes: number; cost?: CallCost }>;
}

/**
 * The same move between fewer, lower-numbered devices: the nodes the two layouts touch numbered
 * 0, 1, … in order, and on each node the slots they touch likewise. A transfer plan compares
 * devices only by their order and by their node (mesh/parallel/realloc.ts: a sender on the
 * receiver's node, else the least loaded, ties to the lower device), and a move's time only asks
 * whether two devices share a node, so every pair of layouts with the same pattern costs exactly
 * the same: one transfer plan serves them all.
 */
export function compactLayouts(from: Layout, to: Layout, perNode: number): [Layout, Layout] {
  const used = [...new Set([...from.devices, ...to.devices])].sort((a, b) => a - b);
  const renumbered = new Map<number, number>();
  let node = -1;
  let lastNode = -1;
  let slot = 0;
  for (const d of used) {
    const n = Math.floor(d / perNode);
    if (n !== lastNode) [node, lastNode, slot] = [node + 1, n, 0];
    renumbered.set(d, node * perNode + slot++);
  }
  const remap = (l: Layout): Layout => ({ ...l, devices: l.devices.map((d) => renumbered.get(d)!) });
  return [remap(from), remap(to)];
}

/**
 * Prices plans, with caches of the costs a search asks for over and over. A call's cost is not a
 * function of its own placement alone: it depends on whether the call runs on its model's own
 * layout (the owner call's placement), and on the memory that the models resident on its devices
 * leave it (their owners' placements), which sets its micro-batches and decoding waves; a view's
 * move depends on the owner's placement too. The caches are keyed by all of that, so a hit is
 * exactly what a fresh computation gives. Placements are treated as immutable values.
 */
export class Evaluator {
  private readonly calls = new Map<string, CallCost>();
  private readonly moves = new Map<string, number>();
  private readonly compactMoves = new Map<string, number>();
  private readonly keys = new WeakMap<Placement, string>();
  private readonly infos: CallInfo[];
  constructor(readonly problem: Problem) {
    this.infos = problem.graph.calls.map((c) => ({ name: c.name, model: modelOf(problem, c.model), shape: problem.models[c.model] }));
  }

  private key(p: Placement): string {
    let k = this.keys.get(p);
    if (k === undefined) this.keys.set(p, (k = layoutKey(layoutOf(p))));
    return k;
  }

  /** `availableBytes`: device memory left by the models resident on the call's devices. */
  callCost(call: CallName, p: Placement, owner: boolean, availableBytes?: number): CallCost | undefined {
    const info = callOf(this.problem, call);
    const model = modelOf(this.problem, info.model);
    const shape = this.problem.models[info.model];
    if (!shape) return undefined;
    const available = availableBytes === undefined ? undefined : Math.max(0, Math.floor(availableBytes / 1e8) * 1e8);
    const key = `${call}|${this.key(p)}|${owner}|${available}`;
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
    return this.move(model, from, to, false);
  }

  /**
   * A move's seconds without the bus's latency per piece: the part its devices spend on the bytes
   * (encoding, hashing, copying them), which keeps them computing; the rest they wait.
   */
  private reallocBytes(model: string, from: Placement, to: Placement): number {
    return this.move(model, from, to, true);
  }

  private move(model: string, from: Placement, to: Placement, bytesOnly: boolean): number {
    const shape = this.problem.models[model];
    if (!shape) return 0;
    const key = `${model}|${this.key(from)}|${this.key(to)}${bytesOnly ? '|bytes' : ''}`;
    let s = this.moves.get(key);
    if (s === undefined) {
      const { devicesPerNode } = this.problem.cluster;
      const [a, b] = compactLayouts(layoutOf(from), layoutOf(to), devicesPerNode);
      const compact = `${model}|${layoutKey(a)}|${layoutKey(b)}${bytesOnly ? '|bytes' : ''}`;
      s = this.compactMoves.get(compact);
      if (s === undefined) {
        const valueHead = modelOf(this.problem, model).valueHead;
        const device = bytesOnly ? { ...this.problem.device, latency: 0 } : this.problem.device;
        s = transferSeconds(shape, a, b, device, devicesPerNode, valueHead);
        const share = shape.trainedShare ?? 1;
        if (share < 1) {
          // With adapters, a view's devices keep the base between fills: what trains moves; the
          // bus's latency per message stays.
          const bytes = bytesOnly ? s : transferSeconds(shape, a, b, { ...this.problem.device, latency: 0 }, devicesPerNode, valueHead);
          s = s - bytes + bytes * share;
        }
        this.compactMoves.set(compact, s);
      }
      this.moves.set(key, s);
    }
    return s;
  }

  private price(c: Candidate): Priced {
    const { device } = this.problem;
    const resident = new Map<number, number>();
    for (const model of this.problem.graph.models) {
      const owner = c[model.owner]!;
      if (model.baseOf !== undefined && this.key(owner) === this.key(c[modelOf(this.problem, model.baseOf).owner]!)) continue;
      const cost = this.callCost(model.owner, owner, true);
      for (const d of owner.devices) resident.set(d, (resident.get(d) ?? 0) + (cost?.residentBytes ?? 0));
    }
    // Under a lag, a generation's view holds its version's weights for the whole iteration (the
    // rollout devices keep that copy while the model trains), and the next version arrives in a
    // second copy while the first still generates (engine/asynchrony/next-views.ts): two copies,
    // resident beside everything there. (The generation's own cost counts one of them already.)
    const held = new Map<number, number>();
    const holders = new Map<CallName, number>();
    if (this.problem.graph.flow.lag) {
      for (const info of this.infos) {
        const p = c[info.name]!;
        if (callOf(this.problem, info.name).kind !== 'generate' || !info.shape || this.key(p) === this.key(c[info.model.owner]!)) continue;
        const bytes = (parameterCounts(info.shape, info.model.valueHead).total * info.shape.dtypeBytes) / (p.tp * p.pp);
        holders.set(info.name, bytes);
        for (const d of p.devices) held.set(d, (held.get(d) ?? 0) + 2 * bytes);
      }
    }
    const calls: Priced['calls'] = [];
    let why: string | undefined;
    let overflow = 0;
    for (const info of this.infos) {
      const p = c[info.name]!;
      const owner = c[info.model.owner]!;
      const isOwner = this.key(p) === this.key(owner);
      const problem = info.shape ? strategyProblem(info.shape, p) : undefined;
      if (problem) why ??= `${info.name}: ${problem}`;
      const inflight = this.problem.workload.inflight && callOf(this.problem, info.name).kind === 'generate' ? inflightProblem(p, isOwner) : undefined;
      if (inflight) why ??= `${info.name}: ${inflight}`;
      let residentHere = 0;
      for (const d of p.devices) residentHere = Math.max(residentHere, (resident.get(d) ?? 0) + (held.get(d) ?? 0) - (holders.get(info.name) ?? 0));
      const cost = this.callCost(info.name, p, isOwner, device.memoryBytes - residentHere);
      const memory = residentHere + (cost?.transientBytes ?? 0);
      if (memory > device.memoryBytes) {
        why ??= `${info.name} needs ${(memory / 1e9).toFixed(1)} GB on a device of ${(device.memoryBytes / 1e9).toFixed(0)} GB`;
        overflow = Math.max(overflow, memory - device.memoryBytes);
      }
      calls.push({ info, placement: p, ...(isOwner ? {} : { owner }), seconds: cost?.seconds ?? 0, memoryBytes: memory, ...(cost ? { cost } : {}) });
    }
    return { ...(why ? { why } : {}), overflow, calls };
  }

  /** A view is loaded, filled and released: two calls more than the move itself. */
  private moveSeconds(x: Priced['calls'][number]): number {
    return x.owner ? this.realloc(x.info.model.name, x.owner, x.placement) + 2 * (this.problem.device.callOverhead ?? 0) : 0;
  }

  /** The simulated iteration; without `moves`, as if every view were already filled. */
  private simulate(priced: Priced, moves: boolean, timeline = false): Simulation {
    const tasks = {} as Record<CallName, TaskSpec>;
    for (const x of priced.calls) {
      const segments: TaskSpec['segments'] = [];
      const move = moves ? this.moveSeconds(x) : 0;
      // Under a lag, a generation's devices take the next version beside the generation still
      // running on the last: the move holds only the devices it comes from.
      if (move > 0) {
        const beside = !!this.problem.graph.flow.lag && callOf(this.problem, x.info.name).kind === 'generate';
        const movers = beside ? x.owner!.devices : [...x.owner!.devices, ...x.placement.devices];
        // Its devices compute while they load and release the view and while they work the bytes;
        // they wait on the bus's latency.
        const busy = this.reallocBytes(x.info.model.name, x.owner!, x.placement) + 2 * (this.problem.device.callOverhead ?? 0);
        segments.push({ kind: 'realloc', devices: [...new Set(movers)].sort((a, b) => a - b), seconds: move, share: Math.min(1, busy / move) });
      }
      segments.push({ kind: 'compute', devices: x.placement.devices, seconds: x.seconds, ...(x.cost ? callLoad(x.cost, x.placement) : {}) });
      const wait = callOf(this.problem, x.info.name).waitSeconds ?? 0;
      if (wait > 0) segments.push({ kind: 'compute', devices: [], seconds: wait });
      tasks[x.info.name] = { call: x.info.name, segments };
    }
    const { sharedCores, parallelSlowdown } = this.problem.device;
    const sim = simulate(tasks, this.problem.graph.flow, { sharedCores, parallelSlowdown, timeline });
    return { ...sim, iterationSeconds: sim.iterationSeconds + this.checkpointSeconds(priced) };
  }

  /**
   * A snapshot's share of an iteration. The supervisor starts the next iteration once every device
   * has written its part — each rank of every kept model, weights and, where it trains, Adam's two
   * moments, one data-parallel replica only — into its own bucket, all at once, and the manifest is
   * written: the fixed store latency, then the busiest device's bytes at the store's rate per
   * device. Where devices share cores (`sharedCores`), no more than that many write at full rate.
   */
  private checkpointSeconds(priced: Priced): number {
    const { device, checkpointEvery } = this.problem;
    const rate = device.storeBandwidth ?? device.busBandwidth;
    if (!checkpointEvery || !rate) return 0;
    const perDevice = new Map<number, number>();
    for (const x of priced.calls) {
      const { model: m, shape } = x.info;
      if (x.owner || !shape || x.info.name !== m.owner) continue; // once per model, at its owner's layout
      // What a snapshot writes after the first: a trained model's weights and Adam's two moments (of
      // what trains, with adapters); a frozen model's state is an object of its own, written once.
      const state = m.trainable ? 3 * (shape.trainedShare ?? 1) : 0;
      const { dp, tp, pp, devices } = x.placement;
      // One replica's ranks, each an equal share of the model (the first replica's devices write).
      const rankBytes = (parameterCounts(shape, m.valueHead).total * shape.dtypeBytes * state) / (tp * pp);
      for (const d of devices.slice(0, devices.length / dp)) perDevice.set(d, (perDevice.get(d) ?? 0) + rankBytes);
    }
    if (perDevice.size === 0) return 0;
    const busiest = Math.max(...perDevice.values());
    const total = [...perDevice.values()].reduce((a, b) => a + b, 0);
    const writing = Math.max(busiest, device.sharedCores ? total / device.sharedCores : 0);
    return ((device.storeLatency ?? 2 * (device.callOverhead ?? 0)) + writing / rate) / checkpointEvery;
  }

  evaluate(c: Candidate, keepTimeline = false): Evaluation {
    const priced = this.price(c);
    const calls = {} as Record<CallName, CallReport>;
    for (const x of priced.calls)
      calls[x.info.name] = {
        placement: x.placement,
        seconds: x.seconds,
        reallocSeconds: this.moveSeconds(x),
        memoryBytes: x.memoryBytes,
        ...(x.cost?.slots !== undefined ? { slots: x.cost.slots } : {}),
        ...(x.cost?.switchSeconds !== undefined ? { switchSeconds: x.cost.switchSeconds } : {}),
      };
    if (priced.why) return { feasible: false, why: priced.why, overflowBytes: priced.overflow, iterationSeconds: Infinity, calls };
    const sim = this.simulate(priced, true, keepTimeline);
    return { feasible: true, overflowBytes: 0, iterationSeconds: sim.iterationSeconds, calls, ...(keepTimeline ? { simulation: sim } : {}) };
  }

  /**
   * What a search minimises: the iteration time of a feasible plan; for one that does not fit,
   * a penalty above every feasible time that shrinks as the plan comes closer to fitting.
   *
   * With a `bound`, for a search that only asks whether a plan comes within it: a plan with views
   * is first simulated as if its views were filled for free, and when even that is above the
   * bound, that figure is the answer (above the bound, not the plan's time). Most plans a search
   * tries are turned down so, without the transfer plans of their moves. (A move only adds work,
   * so this almost always is a lower bound; a list schedule can be anomalous, and then a plan
   * that would just have made it is turned down: the same way for every run, cache or not.)
   */
  objective(c: Candidate, bound = Infinity): number {
    const priced = this.price(c);
    if (priced.why) return 1e9 + priced.overflow / 1e6;
    if (bound < Infinity && priced.calls.some((x) => x.owner)) {
      const free = this.simulate(priced, false).iterationSeconds;
      if (free > bound) return free;
    }
    return this.simulate(priced, true).iterationSeconds;
  }
}

// ---- candidates ----------------------------------------------------------------------------------

/** Every mesh of the cluster: aligned power-of-two blocks inside a node, runs of whole nodes; none that holds a lost device. */
export function meshes(cluster: Cluster): Placement['mesh'][] {
  const all = everyMesh(cluster);
  return cluster.lost?.length ? all.filter((m) => meshAvailable(m, cluster)) : all;
}

function everyMesh(cluster: Cluster): Placement['mesh'][] {
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

/** The named plans, fastest first (infeasible ones last, the closest to fitting first): where a search starts. */
export function namedStarts(ev: Evaluator): Candidate[] {
  return PLACEMENTS.map((n) => namedPlan(ev, n)).sort((a, b) => ev.objective(a) - ev.objective(b));
}

/**
 * Where a generation cannot take new versions in flight (as the runtime refuses it,
 * engine/runtime/scenario/resolve.ts): on the layout its model trains on (it sees each update as
 * it is made, and has no second copy to switch to), or over several pipeline stages.
 */
function inflightProblem(p: Placement, isOwner: boolean): string | undefined {
  if (isOwner) return 'in flight (rl.inflight), a generation needs devices or a layout of its own, not the one its model trains on';
  if (p.pp > 1) return `in flight (rl.inflight), a generation runs on replicas of one stage, not pp = ${p.pp}`;
  return undefined;
}
