// The simulator: list-schedules an algorithm's dataflow graph, unrolled over several iterations,
// onto the devices of a plan, and returns the steady-state iteration time and a timeline per device.
//
// A task (one call of one iteration) starts when its inputs are ready; each of its segments (a
// reallocation into a view, then the call) starts when every device it needs is free. Where
// devices share processors (the local machine: worker processes on a few cores), segments that
// overlap in time share those cores: what a segment computes progresses at min(1, cores / devices
// computing), and slower still by the profile's parallel slowdown when more than one device
// computes. A segment holds its devices for its whole time, but need not keep them computing: a
// pipeline's stages take turns, and ranks that wait on the bus (a collective, a reallocation's
// chunks) leave the cores to others and are not slowed by them.
import { dependencies, nodeName, nodesOf, type Graph } from '../../algorithms/index.ts';
import type { CallName } from '../scenario/scenario.ts';

export interface Segment {
  kind: 'realloc' | 'compute';
  devices: number[];
  seconds: number;
  /**
   * Of `devices`, how many compute at once while the segment computes (default: all of them). A
   * pipeline's stages take turns: one stage of each replica computes at a time (dp × tp devices).
   */
  computing?: number;
  /**
   * The share of `seconds` spent computing (default 1); the rest its devices wait (on the bus, on
   * other stages), taking no core and slowed by nothing.
   */
  share?: number;
}

/**
 * How fast a segment progresses (its own seconds per second) while `others` devices compute beside
 * it on average: its computing part at the cores' rate, min(1, cores / devices computing), slower
 * by the parallel slowdown as more than one device computes (in full from two on, in proportion
 * between one and two); its waiting part at full speed.
 */
export function segmentSpeed(seg: Pick<Segment, 'devices' | 'computing' | 'share'>, others: number, options: { sharedCores?: number; parallelSlowdown?: number }): number {
  if (options.sharedCores === undefined) return 1;
  const share = seg.share ?? 1;
  const load = (seg.computing ?? seg.devices.length) + others;
  const slowdown = 1 + ((options.parallelSlowdown ?? 1) - 1) * Math.min(1, Math.max(0, load - 1));
  const rate = Math.min(1, options.sharedCores / Math.max(1, load)) / slowdown;
  return 1 / (share / rate + (1 - share));
}

/** Devices a segment keeps computing, on average over its time alone. */
export const computingLoad = (seg: Pick<Segment, 'devices' | 'computing' | 'share'>): number => (seg.computing ?? seg.devices.length) * (seg.share ?? 1);

export interface TaskSpec {
  call: CallName;
  /** Segments run one after the other: a reallocation (if the call needs a view), then the call. */
  segments: Segment[];
}

export interface TimelineEntry {
  device: number;
  call: CallName;
  iteration: number;
  kind: Segment['kind'];
  start: number;
  end: number;
}

export interface Simulation {
  iterationSeconds: number;
  makespan: number;
  timeline: TimelineEntry[];
}

/**
 * The calls of a graph in order, and what each waits for: within an iteration, the calls whose
 * outputs it reads (through host steps too); from the previous one, every train call — the
 * supervisor starts an iteration once the last one's training has ended, so every call waits for
 * them, not only the calls that read their weights.
 *
 * Under asynchrony (rl.lag: k), the rollout calls (`ahead`: the generations, and the frozen
 * models' calls that read nothing but the rollout) of iteration i run during iteration i − k, with
 * the weights it starts with: they wait for the train calls of i − k − 1 instead, and go before
 * that iteration's own calls on devices they share (the runtime queues them first); iteration
 * i − k ends once they have. The steady period becomes about max(generate + sync, train).
 */
export interface Flow {
  order: CallName[];
  same: Record<CallName, CallName[]>;
  previous: CallName[];
  /** rl.lag (0: lock-step). */
  lag?: number;
  /** The calls that run ahead under a lag. */
  ahead?: CallName[];
}

export function flowOf(g: Graph, lag = 0): Flow {
  const nodes = nodesOf(g);
  const deps = dependencies(nodes);
  const calls = new Set(g.calls.map((c) => c.name));
  const upstream = (n: string, seen = new Set<string>()): string[] => (deps.get(n) ?? []).flatMap((d) => (seen.has(d) ? [] : (seen.add(d), calls.has(d) ? [d] : upstream(d, seen))));
  const flow: Flow = {
    order: g.calls.map((c) => c.name),
    same: Object.fromEntries(nodes.filter((n) => n.kind === 'call').map((n) => [nodeName(n), [...new Set(upstream(nodeName(n)))]])),
    previous: g.calls.filter((c) => c.fn === 'train').map((c) => c.name),
  };
  if (lag === 0) return flow;
  // As the runtime runs them ahead (engine/runtime/run/run.ts): generations of the prompts, then
  // inference of untrained models that reads only what the generations wrote.
  const gens = g.calls.filter((c) => c.fn === 'generate');
  const rollout = new Set(gens.flatMap((c) => Object.values(c.writes)));
  const trained = new Set(g.models.filter((m) => m.trained).map((m) => m.name));
  const frozen = g.calls.filter((c) => c.fn === 'inference' && !trained.has(c.model) && Object.values(c.reads).every((f) => rollout.has(f)));
  return { ...flow, lag, ahead: [...gens, ...frozen].map((c) => c.name) };
}

interface Running {
  task: number;
  segment: number;
  remaining: number;
  start: number;
}

/**
 * `timeline: false` leaves the timeline empty: a search asks only for the iteration time, and one
 * entry per device per segment is most of the work on a large cluster.
 */
export function simulate(tasks: Record<CallName, TaskSpec>, flow: Flow, options: { iterations?: number; sharedCores?: number; parallelSlowdown?: number; timeline?: boolean } = {}): Simulation {
  const lag = flow.lag ?? 0;
  // Enough iterations past the pipeline's filling for its steady period to show.
  const K = options.iterations ?? 4 + 2 * lag;
  const keepTimeline = options.timeline ?? true;
  const ORDER = flow.order;
  const n = ORDER.length;
  // Task i is call i % n of iteration ⌊i / n⌋.
  const position = new Map(ORDER.map((c, i) => [c, i]));
  const same = ORDER.map((c) => flow.same[c]!.map((d) => position.get(d)!));
  const previous = flow.previous.map((c) => position.get(c)!);
  const specs = ORDER.map((c) => tasks[c]!);
  const total = K * n;
  const finished = new Array<number>(total).fill(-1);
  const nextSegment = new Array<number>(total).fill(0);
  const isRunning = new Array<boolean>(total).fill(false);
  let devices = 0;
  for (const spec of specs) for (const seg of spec.segments) for (const d of seg.devices) devices = Math.max(devices, d + 1);
  const busy = new Uint8Array(devices);
  const running: Running[] = [];
  const timeline: TimelineEntry[] = [];
  let now = 0;

  const isAhead = ORDER.map((c) => lag > 0 && (flow.ahead ?? []).includes(c));
  const aheadPositions = ORDER.flatMap((_, p) => (isAhead[p] ? [p] : []));
  /** Every call of iteration `it` at `positions` has finished (true for iterations outside the run). */
  const done = (it: number, positions: readonly number[]) => it < 0 || it >= K || positions.every((c) => finished[it * n + c]! >= 0);
  const ready = (i: number) => {
    const it = Math.floor(i / n);
    const base = it * n;
    if (!same[i % n]!.every((c) => finished[base + c]! >= 0)) return false;
    // A rollout call ahead waits for the weights it reads, k + 1 updates back (none at first).
    if (isAhead[i % n]) return done(it - lag - 1, previous);
    if (!done(it - 1, previous)) return false;
    // An iteration ends once what it generated ahead has: the next one's calls wait for it.
    return lag === 0 || it === 0 || done(it - 1 + lag, aheadPositions);
  };
  // Priority: by the iteration that runs a task (a rollout call ahead runs in iteration i − k, at
  // its start), the rollout calls first, then the call order.
  const priority = Array.from({ length: total }, (_, i) => i).sort((a, b) => {
    const key = (i: number) => [isAhead[i % n] ? Math.max(0, Math.floor(i / n) - lag) : Math.floor(i / n), isAhead[i % n] ? 0 : 1, Math.floor(i / n), i % n];
    const [x, y] = [key(a), key(b)];
    for (let j = 0; j < x.length; j++) if (x[j] !== y[j]) return x[j]! - y[j]!;
    return 0;
  });

  const startWhatCan = () => {
    // In priority order: a task's next segment starts when its inputs are done and all of its
    // devices are free.
    for (const i of priority) {
      if (finished[i]! >= 0 || isRunning[i] || !ready(i)) continue;
      const seg = specs[i % n]!.segments[nextSegment[i]!]!;
      if (seg.devices.some((d) => busy[d] === 1)) continue;
      for (const d of seg.devices) busy[d] = 1;
      isRunning[i] = true;
      running.push({ task: i, segment: nextSegment[i]!, remaining: seg.seconds, start: now });
    }
  };

  const segmentOf = (x: Running) => specs[x.task % n]!.segments[x.segment]!;
  /** Each running segment's speed, beside what the others keep computing. */
  const speeds = () => {
    const loads = running.map((x) => computingLoad(segmentOf(x)));
    const total = loads.reduce((a, b) => a + b, 0);
    return running.map((x, i) => segmentSpeed(segmentOf(x), total - loads[i]!, options));
  };

  startWhatCan();
  while (running.length) {
    const v = speeds();
    let step = Infinity;
    running.forEach((x, i) => {
      step = Math.min(step, x.remaining / v[i]!);
    });
    now += step;
    running.forEach((x, i) => {
      x.remaining -= step * v[i]!;
    });
    const done = running.filter((x) => x.remaining <= 1e-12);
    for (const x of done) {
      running.splice(running.indexOf(x), 1);
      isRunning[x.task] = false;
      const call = ORDER[x.task % n]!;
      const spec = specs[x.task % n]!;
      const seg = spec.segments[x.segment]!;
      for (const d of seg.devices) {
        busy[d] = 0;
        if (keepTimeline) timeline.push({ device: d, call, iteration: Math.floor(x.task / n), kind: seg.kind, start: x.start, end: now });
      }
      nextSegment[x.task] = x.segment + 1;
      if (nextSegment[x.task] === spec.segments.length) finished[x.task] = now;
    }
    startWhatCan();
  }
  if (finished.some((f) => f < 0)) throw new Error('simulation stalled: a task never became ready');
  // An iteration ends when its own calls have, and the rollout calls it runs ahead (those of
  // iteration it + k): the runtime waits for them before the next one starts.
  const iterationEnd = (it: number) => Math.max(...ORDER.flatMap((_, p) => (isAhead[p] ? (it + lag < K ? [finished[(it + lag) * n + p]!] : []) : [finished[it * n + p]!])));
  // Steady state: the time between the ends of the first and the last iteration, per iteration —
  // under a lag, of those past the pipeline's filling whose rollouts ahead were simulated too.
  const [first, last] = [lag, K - 1 - lag];
  const iterationSeconds = last > first ? (iterationEnd(last) - iterationEnd(first)) / (last - first) : iterationEnd(0);
  return { iterationSeconds, makespan: now, timeline };
}
