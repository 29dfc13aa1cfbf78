// The scenario file's schema (zod), from which the JSON Schema for editors is generated too
// (`npm run schema`): every key has a default or is required, and says what it does; an unknown
// key is an error naming its path, never a silent no-op.
import { z } from 'zod';
import { EnvironmentKey } from '../../environments/index.ts';
import { BACKENDS } from '../../model/index.ts';
import { TASKS, VERIFIERS } from '../../device/index.ts';
import { DEVICE_NAMES, MODELS as MODEL_PRESETS } from '../plan/catalog.ts';

const PRESETS = Object.keys(MODEL_PRESETS) as [string, ...string[]];

const pos = z.number().int().positive();
const nat = z.number().int().nonnegative();

export const STRATEGIES = ['one_for_one', 'one_for_all', 'rest_for_one'] as const;
export const POLICIES = ['permanent', 'transient', 'temporary'] as const;
/** The calls a kill can land in (for the supervisor: while it sends that call). */
export const CHAOS_CALLS = ['load', 'sft', 'generate', 'inference', 'train', 'realloc', 'checkpoint', 'restore', 'manifest', 'switch'] as const;

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

/**
 * A chaos event the run may skip. By default every kill, loss and join must happen: one that never
 * does (a re-plan moved the call off its device, the run ended first) fails `npm run chaos`.
 */
const OPTIONAL_EVENT = z
  .boolean()
  .optional()
  .describe('true: the run may skip this event (say, a re-plan before it moves the call off its device); by default an event that never fires is reported and fails npm run chaos');

export const Chaos = z.strictObject({
  kills: z
    .array(
      z.union([
        z.strictObject({
          actor: z.string().describe("a model of the algorithm whose worker dies (its rank 0 for the call), or 'supervisor'"),
          call: z.enum(CHAOS_CALLS).describe('the call during which it dies'),
          iteration: z.number().int().min(-1).describe('-1: during setup'),
          how: z.enum(['kill', 'hang']).default('kill').describe('kill: SIGKILL; hang: SIGSTOP, found by missed heartbeats, then killed'),
          optional: OPTIONAL_EVENT,
        }),
        z.strictObject({
          lose: z.number().int().min(0).describe('a device lost for good: its worker is killed during the call and never restarted (needs elastic:)'),
          call: z.enum(CHAOS_CALLS).describe('the call during which it is lost'),
          iteration: z.number().int().min(0).describe('the iteration'),
          optional: OPTIONAL_EVENT,
        }),
      ]),
    )
    .default([]),
  joins: z
    .array(
      z.strictObject({
        device: nat.describe('a device of the cluster: one the run lost, or one its plan does not use'),
        iteration: z.number().int().min(1).describe('its worker starts once the iteration before this one is done; the supervisor offers it to the planner at the next boundary'),
        optional: OPTIONAL_EVENT,
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
      optional: OPTIONAL_EVENT.describe('true: the run may skip any of the drawn kills; by default one that never fires fails npm run chaos'),
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
      adapter: z
        .string()
        .min(1)
        .optional()
        .describe(
          "a PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors) that the policy's adapters start from; its base is model.from, and model.lora, where given, must say what its adapter_config.json says",
        ),
      lora: z
        .strictObject({
          rank: pos.default(8).describe("each adapter's rank r"),
          alpha: z.number().positive().default(8).describe('the update is W + (alpha / rank)·B·A (PEFT’s lora_alpha; default 8, as PEFT’s)'),
          targets: z
            .array(z.string().min(1))
            .optional()
            .describe(
              'the modules that carry an adapter, by the family’s Hugging Face names (gpt2: c_attn, c_proj, c_fc; llama: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj); default every one',
            ),
          modules_to_save: z
            .array(z.string().min(1))
            .optional()
            .describe("whole modules that train beside the adapters, as PEFT's modules_to_save: lm_head (a policy's untied head; a value model's head always trains)"),
          dropout: z.number().min(0).max(1).default(0).describe('dropout on an adapter’s input: only 0 (ferry’s adapters train without it, as policy-gradient RL with LoRA does)'),
        })
        .optional()
        .describe('LoRA adapters on the trained models (the policy and a value model): the base is frozen, and only the adapters (and a value head) train, move and are stored'),
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
      response: pos.optional().describe('the response budget: the most tokens a response may have'),
      response_mean: pos
        .optional()
        .describe('the mean response length, below the budget: responses end early with a long tail (priced as an exponential of that mean cut at the budget; decoding drops rows that have ended)'),
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
      slots: nat
        .default(0)
        .describe(
          'continuous generation: each replica of a generation decodes this many sequences at once, and a response that ends gives its slot to the next prompt at once; each response goes to the run’s store and to the reward actors the moment it ends; with an environment, an episode waiting on it gives its slot to another, in place of environment.group_size (0: off, every prompt of the call decoded as one batch, episodes in groups); the samples are the same bit for bit either way',
        ),
      inflight: z
        .boolean()
        .default(false)
        .describe(
          'in-flight weight updates (with rl.staleness): when the next version reaches the rollout devices, the generation running there goes on with it from its next decoding pass instead of finishing on the old one; each token records the version that drew it and its behaviour log-probability, which the decoupled loss reads; the pass is a decision written ahead, and --replay re-runs it (generates continuously: rl.slots, or every row of a call at once)',
        ),
      inflight_kv: z
        .enum(['keep', 'recompute'])
        .default('keep')
        .describe('in flight, the keys and values written before a switch: keep the old version’s (PipelineRL) or write them again with the new one (AReaL)'),
      switches: z
        .record(z.string(), z.record(z.string(), z.array(z.strictObject({ version: nat, steps: z.array(nat.nullable()) }))))
        .optional()
        .describe(
          'an in-flight run’s recorded decisions, by iteration and generate call: the version each generation switched to and, per replica, the pass it did so from (written by npm run scenario -- --replay; with rl.inflight and rl.versions)',
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

/** The JSON Schema of scenario files, for editors (yaml-language-server, VS Code). */
export function scenarioJsonSchema(): object {
  return {
    ...z.toJSONSchema(Scenario, { io: 'input', unrepresentable: 'any' }),
    title: 'ferry scenario',
  };
}
