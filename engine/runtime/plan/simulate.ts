// The simulator: list-schedules an algorithm's dataflow graph, unrolled over several iterations,
// onto the devices of a plan, and returns the steady-state iteration time and a timeline per device.
//
// A task (one call of one iteration) starts when its inputs are ready; each of its segments (a
// reallocation into a view, then the call) starts when every device it needs is free. Where
// devices share processors (the local machine: worker processes on a few cores), segments that
// overlap in time share those cores: each progresses at min(1, cores / busy devices).
import { dependencies, nodeName, nodesOf, type Graph } from '../../algorithms/index.ts';
import type { CallName } from '../scenario.ts';

export interface Segment {
  kind: 'realloc' | 'compute';
  devices: number[];
  seconds: number;
}

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
 * supervisor starts an iteration once the last one's training has ended (it does not pipeline
 * iterations), so every call waits for them, not only the calls that read their weights.
 */
export interface Flow {
  order: CallName[];
  same: Record<CallName, CallName[]>;
  previous: CallName[];
}

export function flowOf(g: Graph): Flow {
  const nodes = nodesOf(g);
  const deps = dependencies(nodes);
  const calls = new Set(g.calls.map((c) => c.name));
  const upstream = (n: string, seen = new Set<string>()): string[] => (deps.get(n) ?? []).flatMap((d) => (seen.has(d) ? [] : (seen.add(d), calls.has(d) ? [d] : upstream(d, seen))));
  return {
    order: g.calls.map((c) => c.name),
    same: Object.fromEntries(nodes.filter((n) => n.kind === 'call').map((n) => [nodeName(n), [...new Set(upstream(nodeName(n)))]])),
    previous: g.calls.filter((c) => c.fn === 'train').map((c) => c.name),
  };
}

interface Running {
  task: number;
  segment: number;
  remaining: number;
  start: number;
}

export function simulate(tasks: Record<CallName, TaskSpec>, flow: Flow, options: { iterations?: number; sharedCores?: number } = {}): Simulation {
  const K = options.iterations ?? 4;
  const ORDER = flow.order;
  const all = Array.from({ length: K }, (_, it) => ORDER.map((call) => ({ it, call, spec: tasks[call]! }))).flat();
  const index = (it: number, call: CallName) => it * ORDER.length + ORDER.indexOf(call);
  const finished = new Array<number>(all.length).fill(-1);
  const nextSegment = new Array<number>(all.length).fill(0);
  const busy = new Map<number, number>(); // device → running task
  const running: Running[] = [];
  const timeline: TimelineEntry[] = [];
  let now = 0;

  const ready = (i: number) => {
    const { it, call } = all[i]!;
    return flow.same[call]!.every((c) => finished[index(it, c)]! >= 0) && (it === 0 || flow.previous.every((c) => finished[index(it - 1, c)]! >= 0));
  };

  const startWhatCan = () => {
    // In priority order (iteration, then call order): a task's next segment starts when its
    // inputs are done and all of its devices are free.
    for (let i = 0; i < all.length; i++) {
      if (finished[i]! >= 0 || running.some((r) => r.task === i) || !ready(i)) continue;
      const seg = all[i]!.spec.segments[nextSegment[i]!]!;
      if (seg.devices.some((d) => busy.has(d))) continue;
      for (const d of seg.devices) busy.set(d, i);
      running.push({ task: i, segment: nextSegment[i]!, remaining: seg.seconds, start: now });
    }
  };

  const rate = () => {
    if (options.sharedCores === undefined) return 1;
    const load = running.reduce((n, r) => n + all[r.task]!.spec.segments[r.segment]!.devices.length, 0);
    return Math.min(1, options.sharedCores / Math.max(1, load));
  };

  startWhatCan();
  while (running.length) {
    const r = rate();
    const step = Math.min(...running.map((x) => x.remaining / r));
    now += step;
    for (const x of running) x.remaining -= step * r;
    const done = running.filter((x) => x.remaining <= 1e-12);
    for (const x of done) {
      running.splice(running.indexOf(x), 1);
      const { it, call, spec } = all[x.task]!;
      const seg = spec.segments[x.segment]!;
      for (const d of seg.devices) {
        busy.delete(d);
        timeline.push({ device: d, call, iteration: it, kind: seg.kind, start: x.start, end: now });
      }
      nextSegment[x.task] = x.segment + 1;
      if (nextSegment[x.task] === spec.segments.length) finished[x.task] = now;
    }
    startWhatCan();
  }
  if (finished.some((f) => f < 0)) throw new Error('simulation stalled: a task never became ready');
  const iterationEnd = (it: number) => Math.max(...ORDER.map((c) => finished[index(it, c)]!));
  // Steady state: the time between the ends of the first and the last iteration, per iteration.
  const iterationSeconds = K > 1 ? (iterationEnd(K - 1) - iterationEnd(0)) / (K - 1) : iterationEnd(0);
  return { iterationSeconds, makespan: now, timeline };
}
