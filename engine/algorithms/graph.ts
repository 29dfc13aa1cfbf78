// An algorithm as data: the models it uses, the model function calls it makes (ReaLHF's MFCs:
// generate, inference, train), and the host-side steps between them (pure functions: reward
// combination, advantages). Calls and steps read and write named fields of one batch record per
// iteration; a node runs when every field it reads exists. The runtime runs any such graph.
import type { LossSpec } from '../../mesh/wire/index.ts';
import { lossProblems } from './losses.ts';

export type Head = 'policy' | 'value' | 'reward';

export interface ModelDecl {
  name: string;
  /**
   * `policy`: a token head (generates, gives log-probs); `value`: a scalar head per token;
   * `reward`: the run's reward — the rule, reward actors on the bus and a learned reward model,
   * combined by the scenario's weights.
   */
  head: Head;
  /** Trained models own an optimizer and have a train call. */
  trained: boolean;
  /**
   * Where its first weights come from: another model (all of them when the heads match, the
   * body otherwise), copied after the warm-up. Absent: drawn from the seed (a trained policy is
   * warmed up on demonstrations first).
   */
  from?: string;
  /** The learning rate of a trained model. */
  lr?: number;
}

/**
 * Generated rows, one per (prompt, sample): `tokens` [rows, P+R], `logprobs` [rows, R], `mask`
 * [rows, R] (1 at the tokens each response has, 0 at the padding after its end and, for episodes
 * of several turns, at the environment's observations), and `step_rewards` [rows, R] (an episode's
 * step rewards, weighted, at the last token of each action; 0 without an environment). Device
 * calls need no mask bound: each gets the mask of the tokens it reads. Host steps that count
 * tokens read `mask`.
 */
export interface GenerateCall {
  fn: 'generate';
  /** Take the likeliest token at every step (a baseline) instead of sampling. */
  greedy?: boolean;
}

/** A forward pass: a policy's `logprobs`, a value model's `values` ([rows, R]), a reward's `scores` ([rows]). */
export interface InferenceCall {
  fn: 'inference';
  /** Placed where this call of the same model is, unless the plan places it (a proximal policy's pass: on the train mesh). */
  placedWith?: string;
}

/**
 * An update by a named loss (a built-in, or one the algorithm's file exports with defineLoss): the
 * call binds the loss's ports (and `tokens`) in `reads`, and may write `loss`, `grad_norm` and any
 * statistic the loss declares (`clipfrac`, …).
 */
export interface TrainCall {
  fn: 'train';
  loss: LossSpec;
}

export type CallDecl = {
  /** `<model>.<what>`, unique in the graph: the name plans, chaos and reports use. */
  name: string;
  model: string;
  /** The call's ports and the batch fields bound to them: `{ tokens: 'tokens', old: 'logprobs' }`. */
  reads: Record<string, string>;
  writes: Record<string, string>;
  /** Fields that must exist before the call starts, though it does not read them (an order). */
  waits?: string[];
} & (GenerateCall | InferenceCall | TrainCall);

/** A field of the batch: a row-major array, or a number (a statistic, reported in the metrics). */
export type Field = Int32Array | Float32Array | number;
export type Fields = Record<string, Field>;

export interface StepContext {
  /** Prompts this iteration (items, for pairs). */
  prompts: number;
  /** Rows per prompt. */
  group: number;
  promptLen: number;
  responseLen: number;
}

/** A pure function of the batch between calls. */
export interface HostStep {
  name: string;
  reads: string[];
  writes: string[];
  run(inputs: Fields, ctx: StepContext): Fields;
}

/**
 * Where an iteration's batch starts: `prompts` (the task's prompts, each repeated `group` times,
 * [rows, P]) or `pairs` (offline preference pairs: every chosen sequence, then every rejected one,
 * [2·items, P+R]).
 */
export type Source = 'prompts' | 'pairs';

export interface Graph {
  models: ModelDecl[];
  calls: CallDecl[];
  steps: HostStep[];
  source: Source;
  /** With the `pairs` source: a JSONL file of pairs instead of the pairs the task's rule labels. */
  pairsFile?: string;
  /** Rows per prompt (G): generation makes this many samples of every prompt. */
  group: number;
  /** The field whose mean is the iteration's reward (`reward_mean`). */
  reward: string;
}

/** The ports each function has; a train call's are its loss's (checked by the device). */
export const PORTS = {
  generate: { reads: ['prompts'], writes: ['tokens', 'logprobs', 'mask', 'step_rewards'] },
  inference: { reads: ['tokens'], writes: ['logprobs', 'values', 'scores'] },
  train: { reads: ['tokens'], writes: ['loss', 'grad_norm'] },
} as const;

/** What an inference call of a model with this head gives. */
export const INFERENCE_OUTPUT: Record<Head, 'logprobs' | 'values' | 'scores'> = { policy: 'logprobs', value: 'values', reward: 'scores' };

export class GraphError extends Error {
  override name = 'GraphError';
}

export type Node = { kind: 'call'; call: CallDecl } | { kind: 'step'; step: HostStep };

export const nodeName = (n: Node) => (n.kind === 'call' ? n.call.name : n.step.name);
export const nodeReads = (n: Node) => (n.kind === 'call' ? [...Object.values(n.call.reads), ...(n.call.waits ?? [])] : n.step.reads);
export const nodeWrites = (n: Node) => (n.kind === 'call' ? Object.values(n.call.writes) : n.step.writes);

export function nodesOf(g: Graph): Node[] {
  return [...g.calls.map((call) => ({ kind: 'call', call }) as const), ...g.steps.map((step) => ({ kind: 'step', step }) as const)];
}

/** The fields an iteration starts with. */
export const sourceFields = (g: Graph): string[] => [g.source];

/**
 * Checks that a graph can run: every name unique, every call on a declared model with the ports
 * its function has, every field read is written once (or is the source), no cycle, every trained
 * model trained and only those. Throws a GraphError listing every problem with the names involved.
 */
export function validateGraph(g: Graph, algorithm: string): void {
  const problems: string[] = [];
  const models = new Map(g.models.map((m) => [m.name, m]));
  const dup = (names: string[], what: string) => {
    const seen = new Set<string>();
    for (const n of names) {
      if (seen.has(n)) problems.push(`two ${what} are named '${n}'`);
      seen.add(n);
    }
  };
  dup(
    g.models.map((m) => m.name),
    'models',
  );
  dup([...g.calls.map((c) => c.name), ...g.steps.map((s) => s.name)], 'calls or steps');
  if (!Number.isInteger(g.group) || g.group < 1) problems.push(`group: expected a whole number of samples per prompt ≥ 1, got ${g.group}`);
  for (const m of g.models) {
    if (!/^[A-Za-z][A-Za-z0-9_-]*$/.test(m.name)) problems.push(`model '${m.name}': a name is a letter, then letters, digits, - and _`);
    if (m.from !== undefined && !models.has(m.from)) problems.push(`model '${m.name}' starts from '${m.from}', which the algorithm does not declare`);
    if (m.from === m.name) problems.push(`model '${m.name}' starts from itself`);
    if (m.head === 'reward' && m.trained) problems.push(`model '${m.name}': a reward is not trained by the iteration (a learned reward model trains before it)`);
    if (m.trained && !(typeof m.lr === 'number' && m.lr > 0)) problems.push(`model '${m.name}' is trained but has no learning rate`);
  }
  for (const c of g.calls) {
    const m = models.get(c.model);
    if (!m) {
      problems.push(`call '${c.name}' is on model '${c.model}', which the algorithm does not declare (it has ${[...models.keys()].join(', ')})`);
      continue;
    }
    if (!c.name.startsWith(`${c.model}.`)) problems.push(`call '${c.name}': a call's name is '<model>.<what>', here '${c.model}.…'`);
    if (c.fn === 'generate' && m.head !== 'policy') problems.push(`call '${c.name}' generates with '${c.model}', which has a ${m.head} head (generation needs a policy)`);
    if (c.fn === 'train' && !m.trained) problems.push(`call '${c.name}' trains '${c.model}', which the algorithm declares frozen`);
    if (c.fn === 'train') problems.push(...lossProblems(c, m));
    const ports = PORTS[c.fn];
    for (const p of Object.keys(c.writes)) {
      if (c.fn === 'train') break; // its loss says what it writes (lossProblems)
      const allowed = c.fn === 'inference' ? [INFERENCE_OUTPUT[m.head]] : (ports.writes as readonly string[]);
      if (!allowed.includes(p)) problems.push(`call '${c.name}' writes port '${p}'; a ${c.fn} call of a ${m.head} model has ${allowed.join(', ')}`);
    }
    for (const p of ports.reads) if (!(p in c.reads)) problems.push(`call '${c.name}' must read port '${p}'`);
    if (c.fn !== 'train')
      for (const p of Object.keys(c.reads)) if (!(ports.reads as readonly string[]).includes(p)) problems.push(`call '${c.name}' reads port '${p}'; a ${c.fn} call has ${ports.reads.join(', ')}`);
  }
  for (const m of g.models) {
    if (m.trained && !g.calls.some((c) => c.fn === 'train' && c.model === m.name)) problems.push(`model '${m.name}' is trained but no call trains it`);
  }
  if (!g.calls.some((c) => c.model && models.has(c.model))) problems.push('the graph has no call');
  // Fields: written once, read only where something writes them.
  const nodes = nodesOf(g);
  const writer = new Map<string, string>();
  for (const f of sourceFields(g)) writer.set(f, `the ${g.source} source`);
  for (const n of nodes) {
    for (const f of nodeWrites(n)) {
      const prev = writer.get(f);
      if (prev) problems.push(`field '${f}' is written by both ${prev} and '${nodeName(n)}'`);
      else writer.set(f, `'${nodeName(n)}'`);
    }
  }
  for (const n of nodes) {
    for (const f of nodeReads(n)) if (!writer.has(f)) problems.push(`'${nodeName(n)}' reads field '${f}', which no call or step writes`);
  }
  if (!writer.has(g.reward)) problems.push(`the reward field '${g.reward}' is written by no call or step`);
  if (problems.length === 0) {
    const cycle = findCycle(nodes);
    if (cycle) problems.push(`a cycle: ${cycle.join(' → ')}`);
  }
  if (problems.length) throw new GraphError(`algorithm '${algorithm}' cannot run:\n  ${problems.join('\n  ')}`);
}

/** The nodes each node waits for (those that write a field it reads). */
export function dependencies(nodes: readonly Node[]): Map<string, string[]> {
  const writer = new Map<string, string>();
  for (const n of nodes) for (const f of nodeWrites(n)) writer.set(f, nodeName(n));
  return new Map(
    nodes.map((n) => [
      nodeName(n),
      [
        ...new Set(
          nodeReads(n)
            .map((f) => writer.get(f))
            .filter((w): w is string => w !== undefined),
        ),
      ],
    ]),
  );
}

function findCycle(nodes: readonly Node[]): string[] | undefined {
  const deps = dependencies(nodes);
  const state = new Map<string, 'open' | 'done'>();
  const path: string[] = [];
  const visit = (n: string): string[] | undefined => {
    if (state.get(n) === 'done') return undefined;
    if (state.get(n) === 'open') return [...path.slice(path.indexOf(n)), n];
    state.set(n, 'open');
    path.push(n);
    for (const d of deps.get(n) ?? []) {
      const c = visit(d);
      if (c) return c;
    }
    path.pop();
    state.set(n, 'done');
    return undefined;
  };
  for (const n of deps.keys()) {
    const c = visit(n);
    if (c) return c;
  }
  return undefined;
}

/** The call whose layout owns a model's weights: its train call, else its first call. */
export function ownerCall(g: Graph, model: string): CallDecl {
  const calls = g.calls.filter((c) => c.model === model);
  const owner = calls.find((c) => c.fn === 'train') ?? calls[0];
  if (!owner) throw new GraphError(`model '${model}' has no call`);
  return owner;
}

/** Models that hold parameters a checkpoint keeps (a rule reward holds none; a learned one does). */
export const modelNames = (g: Graph) => g.models.map((m) => m.name);

/**
 * Runs a graph's nodes as their inputs appear: every node whose fields exist starts at once, so
 * calls with no path between them run at the same time (on disjoint devices, in parallel).
 * `run` does one node; what it returns joins the batch. Resolves with the whole batch.
 */
export async function runGraph(g: Graph, initial: Fields, run: (node: Node, inputs: Fields) => Promise<Fields>): Promise<Fields> {
  const fields: Fields = { ...initial };
  const nodes = nodesOf(g);
  const started = new Set<string>();
  return new Promise<Fields>((resolve, reject) => {
    let running = 0;
    let failed = false;
    const launch = () => {
      if (failed) return;
      for (const n of nodes) {
        const name = nodeName(n);
        if (started.has(name) || !nodeReads(n).every((f) => f in fields)) continue;
        started.add(name);
        running += 1;
        const inputs = Object.fromEntries(nodeReads(n).map((f) => [f, fields[f]!]));
        run(n, inputs).then(
          (out) => {
            running -= 1;
            for (const f of nodeWrites(n)) {
              if (!(f in out)) {
                failed = true;
                reject(new GraphError(`'${name}' did not produce field '${f}'`));
                return;
              }
              fields[f] = out[f]!;
            }
            launch();
          },
          (e) => {
            running -= 1;
            if (!failed) {
              failed = true;
              // The node that failed, for whoever reports it (the error itself is passed on as it is).
              if (e instanceof Error && !('node' in e)) Object.assign(e, { node: name });
              reject(e);
            }
          },
        );
      }
      if (running === 0 && !failed) {
        const stuck = nodes.filter((n) => !started.has(nodeName(n)));
        if (stuck.length) reject(new GraphError(`stalled: ${stuck.map(nodeName).join(', ')} never got their inputs`));
        else resolve(fields);
      }
    };
    launch();
  });
}
