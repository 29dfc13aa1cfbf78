// What a parsed scenario resolves to: its algorithm and graph, the plan checked against the
// algorithm, cluster and models, its task (built in or a dataset's), and its models' specs.
import { staleGraph, versionsProblem } from '../../asynchrony/index.ts';
import { formatIssues, shortList } from '../../../mesh/wire/index.ts';
import { deviceCount, layoutKey, parseMesh, singleDeviceMesh, MeshError, type Cluster } from '../../../mesh/parallel/index.ts';
import { makeTask, type Task, type VerifierName } from '../../device/index.ts';
import { HfError, TextTokenizer, TokenizerError, gptSpecOf, parameterShapes, readHfConfig, readPeftAdapter, readPeftConfig, type GptSpec } from '../../model/index.ts';
import { defaultTargets, loraProblem, PeftError, type LoraSpec } from '../../adapters/index.ts';
import { DatasetError, JsonlDataset } from '../data/dataset.ts';
import { dataTask, type DataTask } from '../data/data-task.ts';
import { MODELS as MODEL_PRESETS } from '../plan/catalog.ts';
import { algorithmOf, GraphError, ownerCall, validateGraph, withResolvedLosses, type Algorithm, type Graph, type ModelDecl, type RlConfig } from '../../algorithms/index.ts';

import { type Scenario, ScenarioError, CALL_BYTES, type CallName } from './schema.ts';

/** Where each call runs: its mesh's devices and its strategy. */
export interface Placed {
  call: CallName;
  mesh: string;
  devices: number[];
  dp: number;
  tp: number;
  pp: number;
}

export type Plan = Record<CallName, Placed>;

/** The scenario's algorithm, resolved: what it is, its options with their defaults, and its graph. */
export interface AlgorithmSpec {
  algorithm: Algorithm;
  /** Its name (a built-in's, or the absolute path of a user's file). */
  name: string;
  options: Record<string, unknown>;
  graph: Graph;
}

const specs = new WeakMap<Scenario, AlgorithmSpec>();

/** Gives `s` the algorithm spec another scenario of the same algorithm resolved (a copy, or the scenario parsed). */
export function keepSpec(s: Scenario, spec: AlgorithmSpec): void {
  specs.set(s, spec);
}

export const algorithmName = (a: Scenario['algorithm']) => (typeof a === 'string' ? a : a.name);

/** The algorithm a (parsed) scenario runs; its options were checked when it was parsed. */
export function algorithmSpec(s: Scenario): AlgorithmSpec {
  let spec = specs.get(s);
  if (!spec) {
    const name = algorithmName(s.algorithm);
    const algorithm = algorithmOf(name);
    const { name: _n, ...given } = typeof s.algorithm === 'string' ? { name } : s.algorithm;
    const parsed = algorithm.options.safeParse(given);
    if (!parsed.success) {
      throw new ScenarioError(
        `algorithm: ${parsed.error.issues.length} problem(s) with the options of '${algorithm.name}':\n  ${shortList(formatIssues(parsed.error.issues, given, () => undefined).map((l) => `algorithm.${l}`)).join('\n  ')}`,
      );
    }
    const options = parsed.data as Record<string, unknown>;
    const fresh = algorithm.graph(options, s.rl as RlConfig);
    // Stale rollouts (rl.lag, rl.staleness): the actor's update reads the proximal policy too.
    let built = fresh;
    try {
      built = s.rl.lag > 0 ? staleGraph(fresh, 'rl.lag') : s.rl.staleness > 0 ? staleGraph(fresh, 'rl.staleness') : fresh;
    } catch (e) {
      if (e instanceof GraphError) throw new ScenarioError(e.message);
      throw e;
    }
    validateGraph(built, algorithm.name);
    const graph = withResolvedLosses(built);
    spec = { algorithm, name, options, graph };
    specs.set(s, spec);
  }
  return spec;
}

export const graphOf = (s: Scenario): Graph => algorithmSpec(s).graph;

/** The model a call of the scenario's algorithm runs on. */
export function modelOf(s: Scenario, call: CallName): string {
  const c = graphOf(s).calls.find((x) => x.name === call);
  if (!c)
    throw new ScenarioError(
      `'${call}' is not a call of the algorithm; it has ${graphOf(s)
        .calls.map((x) => x.name)
        .join(', ')}`,
    );
  return c.model;
}

export function modelDecl(s: Scenario, model: string): ModelDecl {
  const m = graphOf(s).models.find((x) => x.name === model);
  if (!m)
    throw new ScenarioError(
      `'${model}' is not a model of the algorithm; it has ${graphOf(s)
        .models.map((x) => x.name)
        .join(', ')}`,
    );
  return m;
}

/** The preset a model takes, if any: its own, else that of the model it starts from (a reward: its own only). */
export function presetOf(s: Scenario, model: string): string | undefined {
  const own = s.models[model];
  if (own) return own;
  const m = modelDecl(s, model);
  return m.from !== undefined && m.head !== 'reward' ? presetOf(s, m.from) : undefined;
}

/** A model's attention heads (query and key/value) and layers: its preset's, or the policy's (a rule reward has none). */
function shapeOf(s: Scenario, model: string): { heads: number; kvHeads: number; layers: number } | undefined {
  const preset = presetOf(s, model);
  if (preset) return MODEL_PRESETS[preset]!;
  if (modelDecl(s, model).head === 'reward' && !s.reward.model) return undefined;
  const spec = policySpec(s);
  return { heads: spec.heads, kvHeads: spec.kvHeads ?? spec.heads, layers: spec.layers };
}

/** Whether `npm run scenario` can run this here, or it describes a cluster for `npm run plan`. */
export function planOnly(s: Scenario): string | undefined {
  if (s.cluster.device !== 'local') return `its cluster is of ${s.cluster.device} devices`;
  const preset = Object.values(s.models)[0];
  if (preset) return `it uses the ${preset} preset`;
  return undefined;
}

/** Rows a call of the graph sees per iteration: a generation's samples, pairs' two rows. */
export function rowsOf(s: Scenario): number {
  const g = graphOf(s);
  return g.source === 'pairs' ? 2 * s.rl.batch : s.rl.batch * g.group;
}

/** Fills in the default placement and checks the plan against the algorithm, the cluster and the model. */
export function resolvePlan(s: Scenario, where = 'scenario', o: ReadOptions = {}): Plan {
  const cluster: Cluster = { nodes: s.cluster.nodes, devicesPerNode: s.cluster.devices_per_node };
  const total = deviceCount(cluster);
  const graph = graphOf(s);
  const calls = graph.calls.map((c) => c.name);
  const models = graph.models.map((m) => m.name);
  const errors: string[] = [];
  for (const key of Object.keys(s.plan)) {
    if (!calls.includes(key)) errors.push(`plan.${key}: '${algorithmSpec(s).algorithm.name}' has no call '${key}'; its calls are ${calls.join(', ')}`);
  }
  for (const key of Object.keys(s.models)) {
    if (!models.includes(key)) errors.push(`models.${key}: '${algorithmSpec(s).algorithm.name}' has no model '${key}'; its models are ${models.join(', ')}`);
  }
  const plan = {} as Plan;
  for (const call of calls) {
    const model = modelOf(s, call);
    const given = s.plan[call];
    // A call placed with another (a proximal policy's pass: with the train call) goes where that one goes.
    const decl = graph.calls.find((c) => c.name === call)!;
    const beside = decl.fn === 'inference' && decl.placedWith !== undefined ? s.plan[decl.placedWith] : undefined;
    const placement = given ?? beside ?? { mesh: singleDeviceMesh(models.indexOf(model) % total, cluster), dp: 1, tp: 1, pp: 1 };
    try {
      const mesh = parseMesh(placement.mesh, cluster);
      const product = placement.dp * placement.tp * placement.pp;
      if (product !== mesh.devices.length) {
        errors.push(`plan.${call}: dp×tp×pp = ${placement.dp}×${placement.tp}×${placement.pp} = ${product}, but mesh "${mesh.name}" has ${mesh.devices.length} device(s)`);
      }
      // Megatron splits attention by heads: each tensor-parallel rank takes whole heads.
      const shape = shapeOf(s, model);
      if (shape && shape.heads % placement.tp !== 0) {
        errors.push(`plan.${call}: tp=${placement.tp} must divide the model's ${shape.heads} attention heads`);
      } else if (shape && shape.kvHeads % placement.tp !== 0) {
        errors.push(`plan.${call}: tp=${placement.tp} must divide the model's ${shape.kvHeads} key/value heads`);
      }
      plan[call] = { call, mesh: mesh.name, devices: mesh.devices, dp: placement.dp, tp: placement.tp, pp: placement.pp };
    } catch (e) {
      if (e instanceof MeshError) errors.push(`plan.${call}: ${e.message}`);
      else throw e;
    }
  }
  const rows = rowsOf(s);
  // The warm-up's demonstrations go to the policy in one call, which one bus message carries.
  const task = taskOf(s);
  // From an environment, each demonstration also carries its action mask.
  const demoBytes = s.warmup.demos * (task.promptLen + task.responseLen + (s.warmup.source === 'environment' ? task.responseLen : 0)) * 4;
  if (s.warmup.steps > 0 && demoBytes > CALL_BYTES) {
    errors.push(
      `warmup.demos: ${s.warmup.demos} demonstrations of ${task.promptLen + task.responseLen} tokens are ${demoBytes} bytes, more than one call carries (${CALL_BYTES}: NATS's 1 MiB message, less room for the rest of the call); at most ${Math.floor((CALL_BYTES * s.warmup.demos) / demoBytes)}`,
    );
  }
  // A train call carries the rows and their per-token arrays (old log-probs, advantages, returns, the mask: four at most).
  const width = task.promptLen + task.responseLen;
  const perRow = (width + 4 * task.responseLen) * 4;
  if (rows * perRow > CALL_BYTES) {
    errors.push(
      `rl.batch: a train call of ${rows} rows of ${width} tokens, with their per-token data, is about ${rows * perRow} bytes, more than one call carries (${CALL_BYTES}); at most ${Math.floor((CALL_BYTES / perRow) * (s.rl.batch / rows))} prompts per iteration`,
    );
  }
  // Items a train call splits into mini-batches: rows, or pairs for an algorithm of pairs.
  const trainItems = graph.source === 'pairs' ? s.rl.batch : rows;
  if (graph.calls.some((c) => c.fn === 'train') && s.rl.minibatches > trainItems) {
    errors.push(
      `rl.minibatches: ${s.rl.minibatches} mini-batches need at least as many ${graph.source === 'pairs' ? 'pairs' : 'rows'}; a train call gets ${trainItems}${graph.source !== 'pairs' && graph.group > 1 ? ` (rl.batch ${s.rl.batch} × ${graph.group} samples per prompt)` : ''}`,
    );
  }
  if (errors.length === 0) {
    for (const c of graph.calls) {
      const p = plan[c.name]!;
      const m = modelDecl(s, c.model);
      if (m.head === 'reward' && !s.models[c.model] && p.devices.length !== 1) {
        errors.push(`plan.${c.name}: the rule reward runs on one device; mesh "${p.mesh}" has ${p.devices.length}`);
      }
      const layers = shapeOf(s, c.model)?.layers;
      if (layers !== undefined && p.pp > layers) errors.push(`plan.${c.name}: pp=${p.pp} needs at least ${p.pp} layers; the model has ${layers}`);
      // Every data-parallel replica needs at least one row (or pair) of each batch it sees.
      // Mini-batches hold ceil(items / minibatches) items; the last holds what is left.
      const items = c.fn === 'train' && graph.source === 'pairs' ? s.rl.batch : rows;
      const size = Math.ceil(items / s.rl.minibatches);
      const got = c.fn === 'train' ? Math.min(size, items - (s.rl.minibatches - 1) * size) : rows;
      if (got < p.dp) errors.push(`plan.${c.name}: dp=${p.dp} replicas need at least ${p.dp} rows per batch; this call gets ${got}`);
      if (c.fn === 'train' && m.head === 'policy' && m.from === undefined && s.warmup.steps > 0 && Math.min(s.warmup.batch, s.warmup.demos) < p.dp) {
        errors.push(`plan.${c.name}: dp=${p.dp} replicas need at least ${p.dp} rows per warm-up batch; warmup.batch is ${s.warmup.batch}`);
      }
    }
    // A model's calls all see one shape: its owner's layout decides how its weights are split.
    for (const m of graph.models) {
      if (!graph.calls.some((c) => c.model === m.name)) errors.push(`model '${m.name}' has no call in the algorithm`);
      else ownerCall(graph, m.name);
    }
  }
  errors.push(...environmentProblems(s, graph, plan, task));
  if (s.rl.lag > 0 && s.rl.lag >= s.rl.iterations)
    errors.push(`rl.lag: ${s.rl.lag} is not less than rl.iterations (${s.rl.iterations}): every rollout would come from the initial policy, and none of the run's updates would ever be used`);
  if (s.rl.staleness > 0 && s.rl.staleness >= s.rl.iterations)
    errors.push(`rl.staleness: ${s.rl.staleness} is not less than rl.iterations (${s.rl.iterations}): a rollout may be as old as the whole run, and the bound would bound nothing`);
  const mean = s.lengths.response_mean;
  const budget = s.lengths.response ?? task.responseLen;
  if (mean !== undefined && mean >= budget) {
    errors.push(
      `lengths.response_mean: ${mean} is not below the response budget, ${budget} (${s.lengths.response === undefined ? "the task's" : 'lengths.response'}): responses that all run to the budget have no mean to give; leave response_mean out`,
    );
  }
  errors.push(...loraProblems(s, graph));
  if (s.rl.lag > 0 && s.rl.staleness > 0) errors.push(`rl.lag (${s.rl.lag}) and rl.staleness (${s.rl.staleness}): a run is either lagged by a fixed k or free-running within η; set one of them`);
  if (s.rl.versions !== undefined) {
    if (s.rl.staleness === 0) errors.push('rl.versions: a recorded schedule replays a free-running run; it needs the rl.staleness that run had');
    else {
      const why = versionsProblem(s.rl.versions, s.rl.staleness, s.rl.iterations);
      if (why) errors.push(`rl.versions: ${why}`);
    }
  }
  if (s.rl.slots > 0) {
    if (graph.source === 'pairs') errors.push(`rl.slots: ${s.rl.slots}, and '${algorithmSpec(s).algorithm.name}' learns from preference pairs: it generates nothing to decode continuously`);
    for (const c of graph.calls.filter((c) => c.fn === 'generate')) {
      const p = plan[c.name];
      if (p && p.pp > 1) errors.push(`rl.slots: ${s.rl.slots}, and plan.${c.name} has pp = ${p.pp}: continuous generation decodes on replicas of one stage (pp = 1)`);
    }
  }
  errors.push(...inflightProblems(s, graph, o.searching ? undefined : plan));
  if (s.model.from === undefined && s.model.width % s.model.heads !== 0) errors.push(`model.width: ${s.model.width} is not divisible by model.heads = ${s.model.heads}`);
  if (errors.length) throw new ScenarioError(`${where}: the plan does not fit:\n  ${shortList(errors).join('\n  ')}`);
  return plan;
}

/**
 * How a scenario is read. `searching`: its plan is the planner's to find (npm run plan's search),
 * so a refusal of its own plan that the search avoids by itself — a generation in flight on its
 * model's training layout or on several stages — is left to the search.
 */
export interface ReadOptions {
  searching?: boolean;
}

/** What keeps a scenario's rl.inflight (and its recorded rl.switches) from running; on `plan`, where it is given. */
function inflightProblems(s: Scenario, graph: Graph, plan: Plan | undefined): string[] {
  const errors: string[] = [];
  if (s.rl.switches !== undefined && !(s.rl.inflight && s.rl.versions !== undefined))
    errors.push('rl.switches: recorded in-flight decisions replay a free-running in-flight run; they need rl.inflight: true and its schedule, rl.versions');
  if (!s.rl.inflight) return errors;
  if (s.rl.staleness === 0)
    errors.push(
      `rl.inflight: new versions are taken in flight by a free-running run; set rl.staleness: η of at least 1 (it is 0${s.rl.lag > 0 ? `; rl.lag: ${s.rl.lag} fixes each rollout's version, which an update in flight would change` : ''})`,
    );
  if (graph.source === 'pairs') errors.push(`rl.inflight, and '${algorithmSpec(s).algorithm.name}' learns from preference pairs: it generates nothing to update in flight`);
  if (s.environment)
    errors.push('rl.inflight with an environment: episodes take no new version in flight (their turns are generated in slots of their own); leave rl.inflight out, or the environment');
  for (const c of plan ? graph.calls.filter((c) => c.fn === 'generate') : []) {
    const p = plan![c.name];
    const own = plan![ownerCall(graph, c.model).name];
    if (p && p.pp > 1) errors.push(`rl.inflight, and plan.${c.name} has pp = ${p.pp}: new versions are taken in flight by replicas of one stage (pp = 1)`);
    else if (p && own && layoutKey(p) === layoutKey(own))
      errors.push(
        `rl.inflight, and plan.${c.name} is the layout '${c.model}' trains on: a generation there sees each update as it is made; in-flight updates need the generation on devices of its own`,
      );
  }
  return errors;
}

/** What in a scenario's `environment:` does not fit its algorithm, plan or task. */
function environmentProblems(s: Scenario, graph: Graph, plan: Plan, task: Task): string[] {
  const env = s.environment;
  if (!env)
    return s.warmup.source === 'environment' && s.warmup.steps > 0
      ? ["warmup.source: 'environment' draws demonstrations from the scenario's environment, and it names none (add environment:, or use source: task)"]
      : [];
  if (graph.source === 'pairs') return [`environment: '${algorithmSpec(s).algorithm.name}' learns from preference pairs and generates nothing; episodes need an algorithm that samples`];
  const errors: string[] = [];
  for (const c of graph.calls.filter((c) => c.fn === 'generate')) {
    const p = plan[c.name];
    if (p && p.tp * p.pp !== 1) errors.push(`plan.${c.name}: episodes of several turns are generated by replicas of one device each (tp = pp = 1); the plan has tp=${p.tp}, pp=${p.pp}`);
  }
  const budget = s.data ? 'task.max_new_tokens (with data:, default 64)' : 'task.max_new_tokens';
  if (env.turn_tokens > task.responseLen)
    errors.push(`environment.turn_tokens: ${env.turn_tokens} tokens per action exceed the ${task.responseLen} tokens after the prompt that all turns share (${budget})`);
  if (task.eos === undefined && env.stop_strings.length === 0 && env.turn_tokens === task.responseLen) {
    errors.push(
      `environment.turn_tokens: the task has no end token and no stop_strings are set, so an action ends only after turn_tokens (${env.turn_tokens}), which is the whole budget: no episode could take a second turn`,
    );
  }
  return errors;
}

const tasks = new WeakMap<Scenario, Task>();

/** The response budget of a dataset task when task.max_new_tokens leaves it out. */
export const DATA_NEW_TOKENS = 64;

/**
 * The scenario's task, with its response budget: a digit task, or with `data:`, prompts from the
 * dataset (indexed when first asked for: a bad line is refused then, before anything starts).
 */
export function taskOf(s: Scenario): Task {
  let task = tasks.get(s);
  if (task) return task;
  task = s.data ? dataTaskOf(s) : makeTask(s.task.name, s.task.digits, s.task.base, s.task.max_new_tokens);
  tasks.set(s, task);
  return task;
}

/** The directory of the tokenizer a scenario's dataset is read through: data.tokenizer, else model.from. */
export function tokenizerDir(s: Scenario): string | undefined {
  return s.data?.tokenizer ?? s.model.from;
}

/** The verifier of a dataset's answers: reward.rule, math by default. */
export function verifierOf(s: Scenario): VerifierName {
  return (s.reward.rule ?? 'math') as VerifierName;
}

/**
 * A dataset task laid out and verified as the scenario's `data:` says: its training file, or
 * `other` (a held-out file, named `key` in errors, read without demonstrations).
 */
export function dataTaskOf(s: Scenario, other?: { file: string; key: string }): DataTask {
  const d = s.data;
  if (!d) throw new ScenarioError(`data: the scenario's prompts come from the '${s.task.name}' task, not a dataset`);
  const dir = tokenizerDir(s);
  if (dir === undefined) throw new ScenarioError('data.tokenizer: a dataset is read through a tokenizer; name a directory with tokenizer.json, or start the model from one (model.from)');
  let tokenizer: TextTokenizer;
  let dataset: JsonlDataset;
  try {
    tokenizer = TextTokenizer.load(dir);
  } catch (e) {
    if (e instanceof TokenizerError) throw new ScenarioError(`${d.tokenizer === undefined ? 'model.from' : 'data.tokenizer'}: ${e.message}`);
    throw e;
  }
  const demo = other === undefined && d.demo_field !== undefined ? { demo: d.demo_field } : {};
  try {
    dataset = JsonlDataset.open(other?.file ?? d.train, { prompt: d.prompt_field, answer: d.answer_field, ...demo });
  } catch (e) {
    if (e instanceof DatasetError) throw new ScenarioError(`${other?.key ?? 'data.train'}: ${e.message}`);
    throw e;
  }
  if (d.chat && !tokenizer.hasChatTemplate) throw new ScenarioError(`data.chat: ${dir} has no chat_template in tokenizer_config.json; set chat: false to use the prompts as they are`);
  const vocab = s.model.from === undefined ? undefined : checkpointSpec(s.model.from).vocab;
  return dataTask({
    dataset,
    tokenizer,
    verifier: verifierOf(s),
    promptLen: d.prompt_tokens,
    responseLen: s.task.max_new_tokens ?? DATA_NEW_TOKENS,
    chat: d.chat,
    ...(vocab === undefined ? {} : { vocab }),
  });
}

/** The policy a checkpoint directory holds, by its config.json. */
function checkpointSpec(dir: string): GptSpec {
  try {
    return gptSpecOf(readHfConfig(dir), `${dir}/config.json`);
  } catch (e) {
    if (e instanceof HfError) throw new ScenarioError(`model.from: ${e.message}`);
    throw e;
  }
}

/**
 * The shape of the scenario's policy (a value model has its body): the checkpoint's, with
 * `model.from`; else `model:`'s, with the task's vocabulary and its prompt and response as context.
 */
export function policySpec(s: Scenario): GptSpec {
  const task = taskOf(s);
  if (s.model.from !== undefined) return checkpointSpec(s.model.from);
  const m = s.model;
  return {
    kind: 'policy',
    vocab: task.vocab,
    context: task.promptLen + task.responseLen,
    layers: m.layers,
    width: m.width,
    heads: m.heads,
    ...(m.tied ? { tied: true } : {}),
    ...(m.family === 'llama' ? { family: 'llama', kvHeads: m.kv_heads ?? m.heads, ffn: m.ffn ?? 4 * m.width, ropeTheta: m.rope_theta ?? 10000 } : {}),
  };
}

/** Adapter directories' configs, read once each. */
const adapterConfigs = new Map<string, LoraSpec>();

/**
 * The scenario's adapters as a trained model's spec carries them (every linear layer by default),
 * or undefined: `model.lora`'s, or with `model.adapter`, what its adapter_config.json says.
 */
export function loraOf(s: Scenario, family: 'gpt2' | 'llama'): LoraSpec | undefined {
  const dir = s.model.adapter;
  if (dir !== undefined) {
    const key = `${family}:${dir}`;
    if (!adapterConfigs.has(key)) adapterConfigs.set(key, readPeftConfig(dir, family));
    return adapterConfigs.get(key);
  }
  const l = s.model.lora;
  return l && { rank: l.rank, alpha: l.alpha, targets: l.targets ?? defaultTargets(family), ...(l.modules_to_save?.length ? { modulesToSave: l.modules_to_save } : {}) };
}

/**
 * The policy a frozen model is the base of (docs/lora.md), wherever the plan puts them: a frozen
 * policy-headed model that starts from a trained policy with LoRA adapters and nothing else trained
 * (no saved module: the base is then exactly the policy's frozen part), in a run that does not
 * re-plan (an elastic run may part them). Shared by the runtime (spec.ts's baseOwnerOf, which adds
 * the plan's condition: the same layout) and the planner (which prices each candidate's layouts).
 */
export function policyBaseOf(s: Scenario, graph: Graph, model: string): string | undefined {
  const m = graph.models.find((x) => x.name === model);
  if (!m || m.trained || m.head !== 'policy' || m.from === undefined || s.elastic !== undefined) return undefined;
  if (s.model.lora === undefined && s.model.adapter === undefined) return undefined;
  if (!graph.models.find((x) => x.name === m.from)?.trained) return undefined;
  const lora = loraOf(s, policySpec(s).family ?? 'gpt2');
  return lora && !lora.modulesToSave?.length ? m.from : undefined;
}

/** What is wrong with `model.adapter`: no base, an adapter that does not read, or one that says other than model.lora. */
function adapterProblems(s: Scenario, spec: GptSpec): string[] {
  const dir = s.model.adapter;
  if (dir === undefined) return [];
  if (s.model.from === undefined) return [`model.adapter: ${dir}: a PEFT adapter sits on a base model; give that base as model.from`];
  const family = spec.family ?? 'gpt2';
  let lora: LoraSpec;
  try {
    lora = loraOf(s, family)!;
  } catch (e) {
    if (e instanceof PeftError) return [`model.adapter: ${e.message}`];
    throw e;
  }
  const l = s.model.lora;
  if (l) {
    const given = { rank: l.rank, alpha: l.alpha, targets: l.targets ?? defaultTargets(family), modules_to_save: l.modules_to_save ?? [] };
    const theirs = { rank: lora.rank, alpha: lora.alpha, targets: lora.targets, modules_to_save: lora.modulesToSave ?? [] };
    const differ = (Object.keys(given) as Array<keyof typeof given>).filter((k) => JSON.stringify(given[k]) !== JSON.stringify(theirs[k]));
    if (differ.length)
      return differ.map((k) => `model.lora.${k}: ${JSON.stringify(given[k])}, but ${dir}/adapter_config.json says ${JSON.stringify(theirs[k])}; leave model.lora out to take the adapter's`);
  }
  try {
    readPeftAdapter(dir, { ...spec, lora }, { shapesOnly: true });
  } catch (e) {
    if (e instanceof PeftError) return [`model.adapter: ${e.message}`];
    throw e;
  }
  return [];
}

/** What is wrong with `model.lora` for this model and algorithm. */
function loraProblems(s: Scenario, graph: Graph): string[] {
  if (!s.model.lora && s.model.adapter === undefined) return [];
  const where = s.model.from !== undefined ? `model.lora (on ${s.model.from})` : 'model.lora';
  const errors: string[] = [];
  if (s.model.lora && s.model.lora.dropout !== 0)
    errors.push(
      `model.lora.dropout: expected 0, got ${s.model.lora.dropout}: ferry's adapters train without dropout on their input (policy-gradient RL with LoRA does; Schulman et al., 2025); leave it out`,
    );
  const trained = graph.models.filter((m) => m.trained && m.head !== 'reward');
  if (!trained.length) errors.push(`model.lora: the algorithm '${algorithmSpec(s).algorithm.name}' trains no policy or value model: adapters on a model that does not train would stay as they start`);
  let spec: GptSpec;
  try {
    spec = policySpec(s);
  } catch {
    return errors; // the checkpoint's own error is reported where it is read
  }
  const family = spec.family ?? 'gpt2';
  const adapter = adapterProblems(s, spec);
  if (adapter.length) return [...errors, ...adapter];
  const problem = loraProblem(loraOf(s, family)!, family, parameterShapes(spec), s.model.adapter !== undefined ? `model.adapter (${s.model.adapter}/adapter_config.json)` : where);
  if (problem) errors.push(problem);
  return errors;
}

/** `model:`'s shape keys as a checkpoint's config.json sets them: written back into scenario.json. */
export function checkpointShape(dir: string): Partial<Scenario['model']> {
  const spec = checkpointSpec(dir);
  const llama = spec.family === 'llama';
  return {
    family: spec.family ?? 'gpt2',
    layers: spec.layers,
    width: spec.width,
    heads: spec.heads,
    ...(llama ? { kv_heads: spec.kvHeads!, ffn: spec.ffn!, rope_theta: spec.ropeTheta! } : {}),
    tied: spec.tied === true,
  };
}
