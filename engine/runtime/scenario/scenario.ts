// Scenario files: YAML validated against one schema, from which the JSON Schema for editors is
// generated too (`npm run schema`). Every key has a default or is required; an unknown key is an
// error naming its path, never a silent no-op.
import { readFileSync } from 'node:fs';
import { basename, dirname, extname, resolve } from 'node:path';
import { parseDocument } from 'yaml';
import { z } from 'zod';
import { EnvironmentKey } from '../../environments/index.ts';
import { staleGraph, versionsProblem } from '../../asynchrony/index.ts';
import { describeValue, formatIssues, shortList } from '../../../mesh/wire/index.ts';
import { deviceCount, parseMesh, singleDeviceMesh, MeshError, type Cluster } from '../../../mesh/parallel/index.ts';
import { BACKENDS } from '../../model/index.ts';
import { TASKS, TaskError, VERIFIERS, makeTask, type Task, type VerifierName } from '../../device/index.ts';
import { HfError, TextTokenizer, TokenizerError, gptSpecOf, readHfConfig, specProblem, type GptSpec } from '../../model/index.ts';
import { DatasetError, JsonlDataset } from '../data/dataset.ts';
import { dataTask, type DataTask } from '../data/data-task.ts';
import { DEVICE_NAMES, MODELS as MODEL_PRESETS } from '../plan/catalog.ts';
import {
  algorithmOf,
  algorithmPath,
  GraphError,
  isPath,
  loadAlgorithmFile,
  ownerCall,
  validateGraph,
  withResolvedLosses,
  type Algorithm,
  type Graph,
  type ModelDecl,
  type RlConfig,
} from '../../algorithms/index.ts';

const PRESETS = Object.keys(MODEL_PRESETS) as [string, ...string[]];

const pos = z.number().int().positive();
const nat = z.number().int().nonnegative();

export const STRATEGIES = ['one_for_one', 'one_for_all', 'rest_for_one'] as const;
export const POLICIES = ['permanent', 'transient', 'temporary'] as const;
/** The calls a kill can land in (for the supervisor: while it sends that call). */
export const CHAOS_CALLS = ['load', 'sft', 'generate', 'inference', 'train', 'realloc', 'checkpoint', 'restore', 'manifest'] as const;

/** A model function call of the scenario's algorithm, `<model>.<what>`. */
export type CallName = string;

const Placement = z.strictObject({
  mesh: z.string().describe('devices, e.g. "0:0" (node 0, device 0), "0:0-3", or "0-1:*" (whole nodes)'),
  dp: pos.default(1),
  tp: pos.default(1),
  pp: pos.default(1),
});

/** Erlang/OTP's vocabulary: who is restarted, which others with it, and when to give up. */
export const Supervision = z.strictObject({
  strategy: z.enum(STRATEGIES).default('one_for_one').describe('one_for_one: restart the dead worker; one_for_all: every worker; rest_for_one: it and the workers started after it'),
  intensity: nat.default(10).describe('at most this many restarts (and recoveries) ...'),
  period_seconds: z.number().positive().default(60).describe('... within this many seconds; one more ends the run with an error naming the actor and its failures'),
  restart: z
    .strictObject({
      worker: z.enum(POLICIES).default('permanent'),
      supervisor: z.enum(POLICIES).default('transient'),
    })
    .prefault({})
    .describe('permanent: always restarted; transient: restarted when it exits abnormally; temporary: never'),
});

/** A reward actor on the bus, by the name it serves, and how long ferry waits for it. */
export const RewardActorRef = z.strictObject({
  name: z.string().regex(/^[A-Za-z0-9_-]+$/, 'letters, digits, - and _ (it is a NATS subject token)'),
  weight: z.number().default(1),
  timeout_seconds: z.number().positive().default(10).describe('one request; then it goes to the next instance'),
  retries: nat.default(2).describe('further attempts after the first'),
  wait_seconds: z.number().positive().default(60).describe('how long to wait for an instance to appear'),
  seconds: z.number().nonnegative().optional().describe('what one request (an iteration’s rollout) takes the actor, as far as you know it: the planner prices the reward call with it (npm run plan)'),
});

export const Chaos = z.strictObject({
  kills: z
    .array(
      z.union([
        z.strictObject({
          actor: z.string().describe("a model of the algorithm whose worker dies (its rank 0 for the call), or 'supervisor'"),
          call: z.enum(CHAOS_CALLS).describe('the call during which it dies'),
          iteration: z.number().int().min(-1).describe('-1: during setup'),
          how: z.enum(['kill', 'hang']).default('kill').describe('kill: SIGKILL; hang: SIGSTOP, found by missed heartbeats, then killed'),
        }),
        z.strictObject({
          lose: z.number().int().min(0).describe('a device lost for good: its worker is killed during the call and never restarted (needs elastic:)'),
          call: z.enum(CHAOS_CALLS).describe('the call during which it is lost'),
          iteration: z.number().int().min(0).describe('the iteration'),
        }),
      ]),
    )
    .default([]),
  joins: z
    .array(
      z.strictObject({
        device: nat.describe('a device of the cluster: one the run lost, or one its plan does not use'),
        iteration: z.number().int().min(1).describe('its worker starts once the iteration before this one is done; the supervisor offers it to the planner at the next boundary'),
      }),
    )
    .default([])
    .describe('workers that join an elastic run beyond its plan (the launcher starts them)'),
  random: z
    .strictObject({
      kills: nat.describe('how many kills to draw'),
      seed: nat.default(0),
      actors: z.array(z.string()).min(1).optional().describe("models (or 'supervisor') to draw from (default: all)"),
      hang: z.number().min(0).max(1).default(0).describe('the share of kills that are hangs instead'),
    })
    .optional(),
});

/** Bytes of token arrays one call may carry: a NATS message's default limit (1 MiB), less 64 KiB for the rest of the call. */
export const CALL_BYTES = (1 << 20) - (1 << 16);

/** Digits per prompt at most: sequences of twice this, already far beyond what the small models learn. */
export const MAX_DIGITS = 256;
/** Response budget at most (the longest answers any task here has are base + 1 ≤ 65 tokens). */
export const MAX_NEW_TOKENS = 4096;

export const Scenario = z.strictObject({
  name: z
    .string()
    .regex(/^[A-Za-z0-9_-]+$/, 'letters, digits, - and _')
    .optional()
    .describe('run name; defaults to the file name'),
  seed: nat.default(1).describe('seeds prompts, sampling, initialisation and shuffling'),
  backend: z.enum(BACKENDS).default('auto').describe('TensorFlow.js backend; auto tries node-gpu, node, wasm, cpu'),
  task: z
    .strictObject({
      name: z.enum(TASKS).default('sort').describe('sort, reverse, copy: answers of `digits` tokens; count: from a to b (two numbers below base), then an end token'),
      digits: pos.max(MAX_DIGITS).default(4).describe('sort, reverse, copy: digits per prompt, and tokens per answer (count does not use it)'),
      base: z.number().int().min(2).max(64).default(10),
      max_new_tokens: pos
        .max(MAX_NEW_TOKENS)
        .optional()
        .describe("the response budget: a response ends at the task's end token or after this many tokens (default: the task's longest answer; sort, reverse and copy answer with exactly `digits`)"),
    })
    .prefault({}),
  model: z
    .strictObject({
      from: z
        .string()
        .min(1)
        .optional()
        .describe(
          "a Hugging Face model directory (config.json, model.safetensors or its shards, tokenizer.json) that the policy starts from; the reference and a value model's body follow it, and its config.json sets the shape (the keys below are then left out)",
        ),
      family: z.enum(['gpt2', 'llama']).default('gpt2').describe('gpt2: learned positions, LayerNorm, GELU; llama: rotary positions, RMSNorm, SwiGLU, grouped-query attention'),
      layers: pos.default(2),
      width: pos.default(64),
      heads: pos.default(4),
      kv_heads: pos.optional().describe('llama: key/value heads (default: heads)'),
      ffn: pos.optional().describe("llama: the MLP's hidden width (default: 4 × width)"),
      rope_theta: z.number().positive().optional().describe('llama: the rotary base (default 10000)'),
      tied: z.boolean().default(false).describe("the policy's head is its token embedding, transposed (GPT-2's)"),
    })
    .prefault({})
    .describe('shape of the actor, critic and reference (vocabulary and context come from the task), or the checkpoint they start from'),
  data: z
    .strictObject({
      train: z.string().min(1).describe('a JSONL file: one JSON object per line (read lazily; a bad line is refused with its number)'),
      prompt_field: z.string().min(1).default('prompt'),
      answer_field: z.string().min(1).default('answer').describe('the reference answer the verifier (reward.rule) checks a response against'),
      demo_field: z.string().min(1).optional().describe('a worked answer to warm the policy up on (default: the answer)'),
      chat: z.boolean().default(false).describe("wrap each prompt as a user message in the tokenizer's chat template (tokenizer_config.json)"),
      tokenizer: z.string().min(1).optional().describe('a directory with tokenizer.json (and tokenizer_config.json); default: model.from'),
      prompt_tokens: pos.max(MAX_NEW_TOKENS).default(128).describe('prompts are left-padded to this many tokens; a longer prompt is refused, naming its line'),
    })
    .optional()
    .describe('prompts from a dataset, scored by a verifier (reward.rule: exact or math), instead of a digit task'),
  cluster: z
    .strictObject({
      nodes: pos.default(1),
      devices_per_node: pos.default(4),
      device: z.enum(DEVICE_NAMES).default('local').describe('local: a worker process per device; otherwise a GPU profile that npm run plan plans for'),
    })
    .prefault({})
    .describe('locally, a device is one worker process'),
  models: z
    .record(z.string(), z.enum(PRESETS))
    .default({})
    .describe(
      'published shapes by model name, for cluster-scale planning (a model without one takes the shape of the model it starts from; a reward without one is the rule); without them the models take `model`',
    ),
  lengths: z
    .strictObject({
      prompt: pos.optional(),
      response: pos.optional(),
    })
    .prefault({})
    .describe('prompt and response lengths for planning; the task decides them for runs'),
  algorithm: z
    .union([z.string().min(1), z.looseObject({ name: z.string().min(1) })])
    .default('ppo')
    .describe("ppo, grpo, rloo, remax, reinforce_pp, dpo, or a path to a module of your own; as { name, ...options } with the algorithm's options"),
  plan: z.record(z.string(), Placement).default({}).describe("mesh and dp/tp/pp per call of the algorithm (e.g. actor.generate); calls left out go to one device per model, in the algorithm's order"),
  warmup: z
    .strictObject({
      steps: nat.default(15).describe('supervised steps on demonstrations before RL (0 to skip)'),
      demos: pos.default(1024),
      batch: pos.default(32),
      lr: z.number().positive().default(3e-3),
      source: z
        .enum(['task', 'environment'])
        .default('task')
        .describe("where the demonstrations come from: the task's own answers, or episodes the environment's expert plays (env.demo; trained on the actions only)"),
    })
    .prefault({}),
  rl: z
    .strictObject({
      iterations: pos.default(40),
      batch: pos.default(64).describe('prompts (or preference pairs) per iteration'),
      epochs: pos.default(2),
      minibatches: pos.default(2),
      clip: z.number().positive().default(0.2).describe('ε of the clipped policy loss'),
      kl_coef: z.number().nonnegative().default(0.02).describe('β of the KL to the reference, in the reward or the loss as the algorithm puts it'),
      temperature: z.number().positive().default(1),
      top_k: nat.default(0).describe('sample only from the k likeliest tokens (0: all)'),
      top_p: z.number().gt(0).max(1).default(1).describe('sample only from the smallest set of likeliest tokens whose probability reaches p (1: all)'),
      lr: z.number().positive().default(1e-3).describe("the policy's learning rate"),
      clip_norm: z.number().nonnegative().default(1).describe('global gradient-norm clip; 0 turns it off'),
      lag: nat
        .default(0)
        .describe(
          'asynchrony: the rollouts of iteration t are generated by the policy of t − lag (0: lock-step, today’s run bit for bit; 1: one-step-off), ahead, while the iteration before trains; the actor’s loss becomes the decoupled one (clip against the proximal policy)',
        ),
      staleness: nat
        .default(0)
        .describe(
          'asynchrony, free-running: the rollout devices generate the next iterations’ rollouts while the policy trains, each with the newest version they have, as long as it is at most this many updates old when trained on (0: off); which version made which rollout is written ahead, and npm run scenario -- --replay RUN_DIR re-runs it; the actor’s loss becomes the decoupled one',
        ),
      versions: z
        .array(nat)
        .optional()
        .describe('a staleness run’s recorded schedule, one policy version per iteration, to re-run without timing (written by npm run scenario -- --replay; with rl.staleness)'),
    })
    .prefault({})
    .describe("what every algorithm's iteration has; the algorithm's own options go under algorithm:"),
  reward: z
    .strictObject({
      rule: z
        .enum([...TASKS, ...VERIFIERS])
        .optional()
        .describe("built-in rule reward: a digit task's rule (default: the task's), or with data:, a verifier of its answers — exact or math (the default)"),
      weight: z.number().nonnegative().default(1).describe("weight of the reward device's score (the rule); 0: not used"),
      actors: z.array(RewardActorRef).default([]).describe('reward actors on the bus (docs/reward-protocol.md), combined with the rule: the reward is the weighted sum'),
      model: z
        .strictObject({
          pairs: pos.default(512).describe('preference pairs: two responses of the warmed-up actor to one prompt, labelled by the rule'),
          steps: pos.default(80),
          batch: pos.default(64),
          lr: z.number().positive().default(3e-3),
          demonstrations: z.boolean().default(true).describe('also compare each first sample with the answer the rule wants (as a labeller who writes demonstrations)'),
        })
        .optional()
        .describe(
          "a learned reward model on the reward device: after the warm-up it learns (Bradley–Terry) from pairs the rule labels — the rule plays the human and is hidden from the RL iterations, which get the model's score, over the reward protocol, with the reward's weight",
        ),
    })
    .prefault({}),
  environment: EnvironmentKey.optional().describe(
    "episodes of several turns against an environment on the bus (docs/environment-protocol.md): each sample is an episode whose actions the policy writes and whose observations it reads; the episode's return joins the reward with `weight`",
  ),
  checkpoint: z
    .strictObject({
      every: nat.default(1).describe('iterations between checkpoints in the run directory (0: none); the last iteration is always kept'),
    })
    .prefault({})
    .describe('checkpoints let npm run scenario -- --resume RUN_DIR go on with a run'),
  bus: z
    .strictObject({
      sync: z
        .string()
        .regex(/^(always|\d+(ms|s|m|h))$/, "'always' or a duration such as 10s or 2m")
        .default('always')
        .describe(
          "how often the private server's JetStream syncs the run's store to disk (nats-server's sync_interval): always (every write is on disk before it is acknowledged), or an interval such as 2m (the server's default: faster, but a power loss can take the last interval's writes — stage results, progress, snapshots — and a recovery then goes back further, or the run resumes from the run directory's checkpoint); needs nats-server 2.10, which ferry fetches from Debian trixie where the installed one is older",
        ),
    })
    .prefault({})
    .describe('the private NATS server ferry starts for the run (not one given by --nats or NATS_URL)'),
  timeouts: z
    .strictObject({
      join_seconds: z.number().positive().default(60).describe('how long to wait for every device to have a worker'),
      call_seconds: z.number().positive().default(300).describe('how long one model function call may take'),
      heartbeat_seconds: z.number().positive().default(10).describe('a worker silent this long is hung: it is killed and restarted'),
      recover_seconds: z.number().positive().default(120).describe('how long a recovery may wait for a worker on every device'),
    })
    .prefault({}),
  supervision: Supervision.prefault({}).describe("restart policies and strategy, in Erlang/OTP's terms"),
  chaos: Chaos.optional().describe('kills to inject (npm run chaos runs the scenario with and without them)'),
  elastic: z
    .strictObject({
      grace_seconds: z.number().positive().default(30).describe('a worker that does not come back within this long is lost for good'),
      search_seconds: z.number().positive().default(2).describe("the re-plan's search budget (evaluations, as npm run plan --budget counts them)"),
    })
    .optional()
    .describe(
      'go on when a device is lost for good (its worker past the restart intensity, not back within grace_seconds, or cordoned with npm run cordon): re-plan on the devices left, restore the last snapshot onto the new plan, replay from it; without elastic:, such a loss ends the run',
    ),
});
export type Scenario = z.output<typeof Scenario>;
export type ScenarioInput = z.input<typeof Scenario>;

export class ScenarioError extends Error {
  override name = 'ScenarioError';
}

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

const algorithmName = (a: Scenario['algorithm']) => (typeof a === 'string' ? a : a.name);

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
export function resolvePlan(s: Scenario, where = 'scenario'): Plan {
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
  if (s.rl.lag > 0 && s.rl.staleness > 0) errors.push(`rl.lag (${s.rl.lag}) and rl.staleness (${s.rl.staleness}): a run is either lagged by a fixed k or free-running within η; set one of them`);
  if (s.rl.versions !== undefined) {
    if (s.rl.staleness === 0) errors.push('rl.versions: a recorded schedule replays a free-running run; it needs the rl.staleness that run had');
    else {
      const why = versionsProblem(s.rl.versions, s.rl.staleness, s.rl.iterations);
      if (why) errors.push(`rl.versions: ${why}`);
    }
  }
  if (s.model.from === undefined && s.model.width % s.model.heads !== 0) errors.push(`model.width: ${s.model.width} is not divisible by model.heads = ${s.model.heads}`);
  if (errors.length) throw new ScenarioError(`${where}: the plan does not fit:\n  ${shortList(errors).join('\n  ')}`);
  return plan;
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

/** The keys a scenario allows at `path` (through defaults and optionals), for typo hints. */
function keysAt(path: readonly PropertyKey[]): string[] | undefined {
  let schema: z.core.$ZodType = Scenario;
  for (const key of [...path, undefined]) {
    for (;;) {
      const def = schema._zod.def as { type: string; innerType?: z.core.$ZodType };
      if (!def.innerType || def.type === 'object') break;
      schema = def.innerType;
    }
    const shape = (schema._zod.def as { shape?: Record<string, z.core.$ZodType> }).shape;
    if (!shape) return undefined;
    if (key === undefined) return Object.keys(shape);
    schema = shape[String(key)]!;
    if (!schema) return undefined;
  }
  return undefined;
}

/** Parses and validates scenario text. `where` names the source in every error; `baseDir` resolves an algorithm's path. */
export function parseScenario(text: string, where: string, baseDir = '.'): Scenario {
  const doc = parseDocument(text, { prettyErrors: true });
  if (doc.errors.length) {
    throw new ScenarioError(`${where}: not valid YAML:\n  ${doc.errors.map((e) => e.message.split('\n')[0]).join('\n  ')}`);
  }
  const raw: unknown = doc.toJS();
  if (raw === null || raw === undefined) {
    // An empty file (or one of comments) would run every default: almost surely not what was meant.
    throw new ScenarioError(`${where}: expected a mapping of settings (task:, model:, rl:, …), the file has none (it is empty or only comments); scenarios/quickstart.yaml is one to start from`);
  }
  const parsed = Scenario.safeParse(raw);
  if (!parsed.success) {
    throw new ScenarioError(`${where}: ${parsed.error.issues.length} problem(s):\n  ${shortList(formatIssues(parsed.error.issues, raw, keysAt)).join('\n  ')}`);
  }
  const name = algorithmName(parsed.data.algorithm);
  const absolute = isPath(name) ? algorithmPath(name, baseDir) : name;
  // Written back with its options' defaults filled in (and files' paths made absolute), so that
  // scenario.json says exactly what ran.
  const at = (p: string) => resolve(baseDir, p);
  const { model, data } = parsed.data;
  const scenario: Scenario = {
    ...parsed.data,
    algorithm: { ...(typeof parsed.data.algorithm === 'string' ? {} : parsed.data.algorithm), name: absolute },
    model: model.from === undefined ? model : { ...model, from: at(model.from) },
    ...(data ? { data: { ...data, train: at(data.train), ...(data.tokenizer === undefined ? {} : { tokenizer: at(data.tokenizer) }) } } : {}),
  };
  let problems: string[];
  try {
    problems = modelProblems(scenario, (raw as { model?: unknown }).model);
  } catch (e) {
    if (e instanceof ScenarioError) throw new ScenarioError(`${where}: ${e.message}`);
    throw e;
  }
  if (problems.length) throw new ScenarioError(`${where}: ${problems.length} problem(s):\n  ${shortList(problems).join('\n  ')}`);
  // With model.from, scenario.json says the shape that ran: the checkpoint's.
  if (scenario.model.from !== undefined) scenario.model = { ...scenario.model, ...checkpointShape(scenario.model.from) };
  try {
    const spec = algorithmSpec(scenario);
    scenario.algorithm = { ...spec.options, name: absolute };
    specs.set(scenario, spec);
  } catch (e) {
    if (e instanceof Error && !(e instanceof ScenarioError)) throw new ScenarioError(`${where}: ${e.message}`, { cause: e });
    throw e instanceof ScenarioError ? new ScenarioError(`${where}: ${e.message}`) : e;
  }
  try {
    const task = taskOf(scenario);
    const spec = policySpec(scenario);
    const width = task.promptLen + task.responseLen;
    if (width > spec.context) throw new ScenarioError(`data.prompt_tokens + task.max_new_tokens: ${task.promptLen} + ${task.responseLen} = ${width} positions; the model has ${spec.context}`);
    if (task.vocab > spec.vocab) throw new ScenarioError(`data.tokenizer: the tokenizer has ${task.vocab} tokens; the model's vocabulary ${spec.vocab}`);
    const bad = specProblem(spec);
    if (bad) throw new ScenarioError(`model: ${bad}`);
  } catch (e) {
    if (e instanceof TaskError) throw new ScenarioError(`${where}: ${scenario.data ? 'data' : 'task.max_new_tokens'}: ${e.message}`);
    if (e instanceof ScenarioError) throw new ScenarioError(`${where}: ${e.message}`);
    throw e;
  }
  resolvePlan(scenario, where);
  return scenario;
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

/** `model:`'s shape keys as a checkpoint's config.json sets them: written back into scenario.json. */
function checkpointShape(dir: string): Partial<Scenario['model']> {
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

/** Keys of `model:` that give a shape, which a checkpoint's config.json gives instead. */
const SHAPE_KEYS = ['family', 'layers', 'width', 'heads', 'kv_heads', 'ffn', 'rope_theta', 'tied'] as const;
/** Keys of `model:` that only the llama family has. */
const LLAMA_KEYS = ['kv_heads', 'ffn', 'rope_theta'] as const;

/** What is wrong with the scenario's model and data, by key (the file's raw `model:` tells given keys from defaults). */
function modelProblems(s: Scenario, rawModel: unknown): string[] {
  const errors: string[] = [];
  const given = typeof rawModel === 'object' && rawModel !== null ? Object.keys(rawModel) : [];
  if (s.model.from !== undefined) {
    // The checkpoint's own values (what a written-back scenario.json holds) are not a conflict.
    const actual = checkpointShape(s.model.from) as Record<string, unknown>;
    const raw = rawModel as Record<string, unknown>;
    for (const key of SHAPE_KEYS) {
      if (given.includes(key) && raw[key] !== actual[key])
        errors.push(
          `model.${key}: ${JSON.stringify(raw[key])}, but the checkpoint's config.json sets the shape of a model that starts from model.from (its ${key} is ${JSON.stringify(actual[key] ?? null)}); leave ${key} out`,
        );
    }
  } else if (s.model.family === 'gpt2') {
    for (const key of LLAMA_KEYS) if (given.includes(key)) errors.push(`model.${key}: only the llama family has it; set model.family: llama, or leave ${key} out`);
  }
  const rule = s.reward.rule;
  if (s.data && rule !== undefined && !(VERIFIERS as readonly string[]).includes(rule))
    errors.push(`reward.rule: a dataset's answers are checked by a verifier (${VERIFIERS.join(' or ')}); got '${rule}'`);
  if (!s.data && rule !== undefined && (VERIFIERS as readonly string[]).includes(rule))
    errors.push(`reward.rule: '${rule}' checks the answers of a dataset; this scenario has no data: (its prompts come from the '${s.task.name}' task)`);
  return errors;
}

function readText(file: string, what: string): string {
  try {
    return readFileSync(file, 'utf8');
  } catch (e) {
    throw new ScenarioError(`cannot read ${what} ${file}: ${(e as Error).message}`);
  }
}

/**
 * Reads and validates a scenario file. With `planFile` (a `plan:` as `npm run plan --write`
 * writes it), that plan replaces the scenario's before validation.
 */
export function loadScenario(file: string, planFile?: string): Scenario {
  let text = readText(file, 'scenario file');
  let where = file;
  if (planFile) {
    const doc = parseDocument(text);
    const plan = parseDocument(readText(planFile, 'plan file')).toJS() as unknown;
    if (plan === null || typeof plan !== 'object' || !('plan' in plan)) {
      throw new ScenarioError(`${planFile}: expected a YAML map with a 'plan' key (as npm run plan --write writes it), got ${describeValue(plan)}`);
    }
    doc.set('plan', (plan as { plan: unknown }).plan);
    // The lag the plan was searched for (npm run plan --write): a lagged run's k, a free-running
    // run's bound η (the planner prices it at its steady state), 0 for lock-step.
    const lag = (plan as { lag?: unknown }).lag;
    if (lag !== undefined) {
      const rl = (doc.get('rl') ?? {}) as unknown;
      const freeRunning = rl !== null && typeof rl === 'object' && 'get' in rl && Number((rl as { get(k: string): unknown }).get('staleness') ?? 0) > 0;
      doc.setIn(['rl', freeRunning ? 'staleness' : 'lag'], lag);
      if (!freeRunning) doc.setIn(['rl', 'staleness'], 0);
    }
    text = doc.toString();
    where = `${file} with the plan of ${planFile}`;
  }
  const s = parseScenario(text, where, dirname(file));
  const named = { ...s, name: s.name ?? basename(file, extname(file)) };
  specs.set(named, algorithmSpec(s));
  return named;
}

/**
 * loadScenario for a file whose algorithm may be a module of the user's: that module is imported
 * first. Every entry point (scenario, chaos, plan, the supervisor process) reads scenarios this way.
 */
export async function loadScenarioFile(file: string, planFile?: string): Promise<Scenario> {
  const raw = parseDocument(readText(file, 'scenario file')).toJS() as { algorithm?: unknown } | null;
  const a = raw?.algorithm;
  const name = typeof a === 'string' ? a : typeof a === 'object' && a !== null && typeof (a as { name?: unknown }).name === 'string' ? (a as { name: string }).name : undefined;
  if (name !== undefined && isPath(name)) await loadAlgorithmFile(algorithmPath(name, dirname(file)));
  return loadScenario(file, planFile);
}

/** The scenario with another plan (an elastic run's re-plan), checked against its cluster and models as a file's would be. */
export function withPlan(s: Scenario, plan: Scenario['plan']): Scenario {
  const out = { ...s, plan };
  specs.set(out, algorithmSpec(s));
  resolvePlan(out, 'the re-plan');
  return out;
}

/** The JSON Schema of scenario files, for editors (yaml-language-server, VS Code). */
export function scenarioJsonSchema(): object {
  return {
    ...z.toJSONSchema(Scenario, { io: 'input', unrepresentable: 'any' }),
    title: 'ferry scenario',
  };
}
