// The messages of ferry's bus, as schemas. Each message is a msgpack map with a `type` and the
// protocol version `v`; decoding (mesh/wire/messages/codec.ts) is the one place where bytes become these
// types. What a run records of itself (re-plans, recoveries, progress, metrics, events) is
// records.ts's, what generation carries beside its calls (episodes, samples, in flight)
// generation.ts's, a transfer's messages transfer.ts's, all re-exported here; the pieces they are
// built from, primitives.ts's.
import { z } from 'zod';
import { Digest, PROTOCOL_VERSION, f32, i32, nat, pos, u32, v } from './primitives.ts';
import { LOSS_TRIGGERS } from './records.ts';
import { EpisodeRecordWire, EpisodesSpec, InflightSpec } from './generation.ts';

export { PROTOCOL_VERSION } from './primitives.ts';
export * from './records.ts';
export * from './generation.ts';
export * from './transfer.ts';

/** A model's name in a run (as the algorithm names it: `policy`, `value`, …); a view adds `@<call>`. */
export const ModelName = z.string().regex(/^[A-Za-z][A-Za-z0-9_-]*$/, 'a letter, then letters, digits, - and _');

/** A model's shape. `policy` has a token head, `value` a scalar head, `rule` has no parameters. */
export const ModelSpec = z.discriminatedUnion('kind', [
  z.strictObject({
    kind: z.enum(['policy', 'value']),
    vocab: pos,
    context: pos,
    layers: pos,
    width: pos,
    heads: pos,
    /** A policy whose head is its token embedding, transposed (GPT-2's). */
    tied: z.boolean().optional(),
    /** gpt2 (the default) or llama: RMSNorm, rotary positions, SwiGLU, grouped-query attention. */
    family: z.enum(['gpt2', 'llama']).optional(),
    kvHeads: pos.optional(),
    ffn: pos.optional(),
    ropeTheta: z.number().positive().optional(),
    normEps: z.number().positive().optional(),
    qkvBias: z.boolean().optional(),
    /** The padding token of left-padded prompts, masked out of attention. */
    pad: nat.optional(),
    /** LoRA adapters on the named modules (the family's Hugging Face names): the base is frozen. */
    lora: z.strictObject({ rank: pos, alpha: z.number().positive(), targets: z.array(z.string().min(1)).min(1), modulesToSave: z.array(z.string().min(1)).optional() }).optional(),
  }),
  /**
   * A rule: a digit task's (with its digits and base), or a verifier of a dataset's answers
   * (exact, math), which reads responses through the tokenizer in `tokenizer` (a directory).
   */
  z.strictObject({ kind: z.literal('rule'), rule: z.string(), digits: pos.optional(), base: pos.optional(), tokenizer: z.string().optional() }),
]);
export type ModelSpec = z.infer<typeof ModelSpec>;

/**
 * Where one model function call runs: a mesh of devices and a dp × tp × pp strategy over it.
 * Ranks are laid out tp fastest, then pp, then dp, so tensor groups sit on neighbouring devices.
 */
export const Layout = z.strictObject({
  devices: z.array(nat).min(1),
  dp: pos,
  tp: pos,
  pp: pos,
});
export type Layout = z.infer<typeof Layout>;

export const Optim = z.strictObject({
  lr: z.number().positive(),
  beta1: z.number().min(0).max(1),
  beta2: z.number().min(0).max(1),
  eps: z.number().positive(),
  clipNorm: z.number().nonnegative(),
});
export type Optim = z.infer<typeof Optim>;

/** A batch of sequences: `tokens` holds `batch` rows of `promptLen + responseLen` tokens. */
const Batch = {
  tokens: i32,
  batch: pos,
  promptLen: pos,
  responseLen: pos,
};

/**
 * A user's loss module: its path (relative to the checkout's root when it lies inside it, so each
 * process reads its own copy) and the SHA-256 of the file the supervisor planned with.
 */
export const LossModule = z.strictObject({ file: z.string().min(1), sha256: z.string().regex(/^[0-9a-f]{64}$/) });
export type LossModule = z.infer<typeof LossModule>;

/** A loss by name (engine/model/losses' registry), its parameters, and the module of a user's loss. */
export const LossSpec = z.strictObject({
  name: z.string().min(1),
  params: z.record(z.string(), z.union([z.number(), z.string(), z.boolean()])),
  module: LossModule.optional(),
});
export type LossSpec = z.infer<typeof LossSpec>;

/** A range along one axis of a parameter (axis null: the whole parameter). */
const SliceSpec = z.strictObject({
  name: z.string(),
  shape: z.array(nat),
  axis: nat.nullable(),
  start: nat,
  end: nat,
});

/**
 * One training call a shard applied: the iteration, how many prompts (rows) it trained on, and the
 * SHA-256 of their tokens. It travels with the shard's state (checkpoints and restores), so after
 * any recovery the ledger says which rollouts the parameters have really been trained on.
 */
/** A rollout a shard trained on: the iteration (the update) that consumed it, and under asynchrony the policy version that generated it. */
export const LedgerEntry = z.strictObject({ iteration: nat, rows: nat, sha256: z.string(), version: nat.optional() });
export type LedgerEntry = z.infer<typeof LedgerEntry>;

/** A shard as a plain record: its weight slices, its optimizer's step and moments, and its ledger. */
export const Checkpoint = z.strictObject({
  tensors: z.array(z.strictObject({ name: z.string(), shape: z.array(nat), data: f32 })),
  optimizer: z.strictObject({ step: nat, moments: z.array(z.strictObject({ name: z.string(), m: f32, v: f32 })) }).optional(),
  ledger: z.array(LedgerEntry).optional(),
});
export type Checkpoint = z.infer<typeof Checkpoint>;

/**
 * The protocol versions whose checkpoint files read as this one's: version 2 changed only how
 * chunks travel, version 3 only the reset call (shards it keeps), version 4 only where snapshots
 * are written (by each device), version 5 only a call's `beside`, version 6 only a restore's
 * `digest`, version 7 only the digests on the chunk path (BLAKE3, each naming its algorithm; a
 * checkpoint file holds none but its ledgers' SHA-256s of tokens, unchanged), version 8 only a
 * view's kept base (load's `base`, release's `keep`, manifest's `base`), version 9 only in-flight
 * weight updates (generate's `inflight`, the `switch` call), so a run directory written by
 * versions 1 to 8 still resumes.
 */
export const CHECKPOINT_VERSIONS = [1, 2, 3, 4, 5, 6, 7, 8, PROTOCOL_VERSION] as const;

/** A run's checkpoint file: every rank of the kept models (those with parameters) after `iteration`. */
export const CheckpointFile = z.strictObject({
  type: z.literal('checkpoint'),
  v: z.literal(CHECKPOINT_VERSIONS),
  /** -1: taken after setup, before the first iteration. */
  iteration: z.number().int().min(-1),
  models: z.record(z.string(), z.array(Checkpoint)),
  /** The layout each model's ranks were taken on (a run goes on with another plan by resharding); absent in older files. */
  layouts: z.record(z.string(), Layout).optional(),
  /**
   * Data-parallel replicas are kept once: for each rank of a model, the index in `models[model]`
   * of the checkpoint it holds (replicas share one). Absent: one checkpoint per rank, in order.
   */
  replicas: z.record(z.string(), z.array(nat)).optional(),
});

/**
 * One rank's state as its device writes it into its own snapshot bucket (mesh/wire/transfer/shelf.ts):
 * the model, the layout and rank it was taken on, the iteration it follows, and the checkpoint.
 */
export const ShardObject = z.strictObject({
  type: z.literal('shard'),
  v,
  model: z.string(),
  layout: Layout,
  rank: nat,
  iteration: z.number().int().min(-1),
  checkpoint: Checkpoint,
  /**
   * A model with adapters: `checkpoint` holds what trains alone (weights and moments), and the
   * frozen base is this object of the same bucket (a BaseObject), whose bytes have this digest.
   */
  base: z.strictObject({ object: z.string(), digest: z.string() }).optional(),
});
export type ShardObject = z.infer<typeof ShardObject>;

/** A rank's frozen base (a model with adapters), written once for the snapshots that name it. */
export const BaseObject = z.strictObject({
  type: z.literal('base'),
  v,
  model: z.string(),
  layout: Layout,
  rank: nat,
  tensors: Checkpoint.shape.tensors,
});
export type BaseObject = z.infer<typeof BaseObject>;

/** An object's name in a device's snapshot bucket: what a NATS subject token takes, and dots. */
export const ObjectName = z.string().regex(/^[A-Za-z0-9_.-]+$/, "letters, digits, '.', '-' and '_'");

/** Where one rank's state of a snapshot is: the device whose bucket holds it, the object, its size, the object's digest and the state's (stateDigest). */
export const ShardEntry = z.strictObject({ device: nat, object: ObjectName, bytes: nat, digest: Digest, state: Digest });
export type ShardEntry = z.infer<typeof ShardEntry>;

/**
 * A snapshot as the supervisor records it: which device wrote which rank, and how to check it.
 * Ranks are listed once per distinct slice set (data-parallel replicas share one); `replicas`, as
 * in a checkpoint file, gives each rank's index into its model's list.
 */
export const SnapshotManifest = z.strictObject({
  type: z.literal('snapshot'),
  v,
  iteration: z.number().int().min(-1),
  models: z.record(z.string(), z.array(ShardEntry)),
  replicas: z.record(z.string(), z.array(nat)),
  layouts: z.record(z.string(), Layout),
});
export type SnapshotManifest = z.infer<typeof SnapshotManifest>;

/** A tensor a device holds: its name, shape and digest (tensorDigest). */
const TensorManifest = z.strictObject({ name: z.string(), shape: z.array(nat), digest: Digest });
export type TensorManifest = z.infer<typeof TensorManifest>;

/** What a caller may ask of a device. Every call names the model whose shard it concerns. */

export const CallBody = z.discriminatedUnion('fn', [
  z.strictObject({
    fn: z.literal('load'),
    /** The model this shard belongs to (a view's owner: the name without `@<call>`). */
    role: ModelName,
    spec: ModelSpec,
    layout: Layout,
    rank: nat,
    /** Seeds the initial weights; a view that a reallocation will fill has none and starts at zero. */
    seed: nat.optional(),
    /** A Hugging Face model directory whose weights replace the seeded ones it has (a value head stays seeded). */
    from: z.string().optional(),
    /** A PEFT adapter directory whose adapters (and saved head) replace the seeded ones, after `from`. */
    adapter: z.string().optional(),
    /** Only the training layout owns an optimizer; generation or inference views do not. */
    optim: Optim.optional(),
    /** The user's loss modules its train calls use: loaded and checked (digest) before anything runs. */
    losses: z.array(LossModule).optional(),
    /** A learned reward model: serve it on the bus as the reward actor of this name (docs/reward-protocol.md). */
    serve: z
      .string()
      .regex(/^[A-Za-z0-9_-]+$/)
      .optional(),
    /**
     * A view of a model with adapters: take back the frozen base this device kept when the view was
     * last released (release's `keep`), if it was kept under this digest of the owner's base, for
     * the same layout and rank, and still hashes as it did then; the answer's `base_kept` says.
     */
    base: z.string().optional(),
  }),
  /** A reward model learns from preference pairs (Bradley–Terry); `chosen` and `rejected` are whole sequences, row for row. */
  z.strictObject({
    fn: z.literal('preference'),
    chosen: i32,
    rejected: i32,
    batch: pos,
    promptLen: pos,
    responseLen: pos,
    steps: pos,
    minibatch: pos,
    lr: z.number().positive(),
    seed: nat,
  }),
  /** Supervised steps on demonstrations; with `eos`, a response counts up to its first end token. */
  z.strictObject({
    fn: z.literal('sft'),
    ...Batch,
    steps: pos,
    minibatch: pos,
    lr: z.number().positive(),
    seed: nat,
    /** A response counts up to its first end token; or, for demonstrations of several turns, where `mask` [batch, responseLen] is 1. */
    eos: nat.optional(),
    mask: f32.optional(),
  }),
  z.strictObject({
    fn: z.literal('generate'),
    prompts: i32,
    batch: pos,
    promptLen: pos,
    responseLen: pos,
    /** One sampling seed per row, derived from (run seed, iteration, prompt, sample). */
    seeds: u32,
    temperature: z.number().positive(),
    /** The most likely token at every step instead of a sample (a baseline to compare samples with). */
    greedy: z.boolean().optional(),
    /** Only the k likeliest tokens take part (0 or absent: all). */
    topK: nat.optional(),
    /** Only the smallest set of likeliest tokens whose probability reaches p (absent: 1, all). */
    topP: z.number().gt(0).max(1).optional(),
    /** The end-of-sequence token: a row stops after it, and the rest of its response is this token again. */
    eos: nat.optional(),
    /** Episodes of several turns: each row plays one against the environment. */
    episodes: EpisodesSpec.optional(),
    /** Continuous generation: each replica decodes this many rows at once, a row that ends giving its slot to the next at once. */
    slots: pos.optional(),
    /** With slots: the stage the device names when it sends each row as it ends (SampleLog); none: it sends none. */
    samples: z.string().min(1).optional(),
    /** With slots: in-flight weight updates (engine/generation/inflight.ts). */
    inflight: InflightSpec.optional(),
  }),
  z.strictObject({
    fn: z.literal('inference'),
    ...Batch,
    /** For a verifier rule: each row's reference answer. */
    answers: z.array(z.string()).optional(),
    /** A model with adapters: its base alone, the adapters off (a reference that is the policy's base). */
    base: z.boolean().optional(),
  }),
  z.strictObject({
    fn: z.literal('train'),
    ...Batch,
    seed: nat,
    /** Passes over the batch, each in seeded mini-batches. */
    epochs: pos,
    minibatches: pos,
    loss: LossSpec,
    /** The loss's per-token arrays by port (`old`, `advantages`, `returns`, `ref`, …), [batch, responseLen] each. */
    data: z.record(z.string(), f32),
    /** Under asynchrony: the policy version that generated the rollout (the shard's ledger keeps it). */
    version: nat.optional(),
  }),
  z.strictObject({
    fn: z.literal('realloc'),
    /** The reallocation this is part of: its ready and go subjects, and its transfers' prefix. */
    realloc: z.string(),
    /** The model whose parameters this device sends or copies (the call's model receives). */
    source: z.string(),
    /**
     * Transfers this device publishes: each a set of slices of the source, and the devices that
     * receive it (it answers their requests to resend a chunk until each has said `received`).
     */
    sends: z.array(z.strictObject({ transfer: z.string(), pieces: z.array(SliceSpec), to: z.array(nat) })),
    /** Transfers this device receives into the call's model, each from one source device. */
    recvs: z.array(z.strictObject({ transfer: z.string(), pieces: z.array(SliceSpec), from: nat })),
    /** Slices it copies from the source's shard on this same device. */
    locals: z.array(SliceSpec),
    chunkBytes: pos,
  }),
  /**
   * A raw exchange for measurement: on go, publish `bytes` of plain payload per send transfer; for
   * each receive transfer, count bytes until `bytes` have come. The same ready/go as a realloc.
   */
  z.strictObject({
    fn: z.literal('probe'),
    realloc: z.string(),
    sends: z.array(z.strictObject({ transfer: z.string(), bytes: nat })),
    recvs: z.array(z.strictObject({ transfer: z.string(), bytes: nat })),
    chunkBytes: pos,
  }),
  /** The process's memory, for benchmarks and reports. */
  z.strictObject({ fn: z.literal('stats') }),
  /** `base`: the digest of the frozen base alone (a model with adapters: what does not train). */
  z.strictObject({ fn: z.literal('manifest'), base: z.boolean().optional() }),
  /** The shard's own slices of the weights, as they are (for inspection and tests; small models). */
  z.strictObject({ fn: z.literal('weights') }),
  /**
   * A checkpoint of the shard, streamed as chunks on `transfer` once `go` comes (an exchange, as a
   * reallocation): its weight slices as `w:<name>`, and on the training layout its optimizer's
   * moments as `m:<name>` and `v:<name>`. The reply carries the optimizer's step. `optimizer`: what
   * the caller expects; a shard that has (or lacks) it otherwise is refused before anything moves.
   */
  z.strictObject({ fn: z.literal('checkpoint'), realloc: z.string(), transfer: z.string(), chunkBytes: pos, optimizer: z.boolean() }),
  /**
   * The shard's state (what `checkpoint` streams, as one ShardObject) written by the device itself
   * into its own snapshot bucket as `object`: nothing of it passes through the supervisor, which
   * records the reply (size, the object's digest, the state's digest) in the snapshot's manifest.
   */
  z.strictObject({ fn: z.literal('snapshot'), object: ObjectName, optimizer: z.boolean() }),
  /**
   * Puts this rank's state back from a snapshot's object, read by the device itself from the
   * bucket that holds it (its own, or a data-parallel replica's device's): nothing of it passes
   * through the supervisor. Checked before anything changes: its digest against the manifest's,
   * its model, and that its rank holds this rank's slices; `optimizer` as in `restore`.
   */
  z.strictObject({ fn: z.literal('reload'), object: ShardEntry, optimizer: z.boolean() }),
  /**
   * Puts a streamed checkpoint (as `checkpoint` sends it) back into a loaded shard of the same
   * layout and rank. `onto`: the shard held here moves onto this layout and rank instead, keeping
   * the elements it holds of its new slices; only the pieces it lacks are sent (mesh/parallel/relaid.ts).
   * `digest`: the reply carries the digest of the weights held after it (as `manifest` gives it),
   * so that a caller that checks them needs no second round. `inline`: the tensors themselves,
   * where they fit one message (half a chunk at most), each with its digest (tensorDigest, checked
   * on arrival as a chunk's is): one round, no exchange — `realloc` and `transfer` name the call only.
   */
  z.strictObject({
    fn: z.literal('restore'),
    realloc: z.string(),
    transfer: z.string(),
    step: nat,
    optimizer: z.boolean(),
    ledger: z.array(LedgerEntry).default([]),
    /**
     * `stale`: parameters the shard held past the snapshot (what trains, where its frozen base is
     * the snapshot's): sent whole, whatever of them the shard held.
     */
    onto: z.strictObject({ layout: Layout, rank: nat, stale: z.array(z.string()).optional() }).optional(),
    digest: z.literal(true).optional(),
    inline: z.array(z.strictObject({ name: z.string(), shape: z.array(nat), data: f32, digest: Digest })).optional(),
  }),
  /**
   * In-flight weight updates: the call's model (a view's other copy) holds `version`, and the
   * continuous generation of `generation.iteration` running on `generation.model` goes on with it.
   * Without `at`: from its next pass, which it stops before and names in the reply (absent: no such
   * generation runs here); it goes on once told again with `at` (the decision written ahead). With
   * `at`: from that pass (held for a generation not yet there).
   */
  z.strictObject({ fn: z.literal('switch'), generation: z.strictObject({ iteration: nat, model: z.string().min(1) }), version: nat, at: nat.optional() }),
  /** `keep`: keep the frozen base (a model with adapters) under this digest of its owner's base, for the next load of this view. */
  z.strictObject({ fn: z.literal('release'), keep: z.string().optional() }),
  /**
   * Back to a fresh device, whatever it was doing: the running call is abandoned (its askers get
   * `interrupted`), every shard is dropped, remembered answers are forgotten. The supervisor sends
   * it to every device before it restores a snapshot; `epoch` names that recovery. `keep`: models
   * the plan puts on this device again keep their shards; the reply gives each kept shard's
   * layout, rank and state digest, so that the supervisor sends only what differs from the
   * snapshot (a restore `onto` the new layout). One a call was still running on is `busy` (kept
   * for now, undigested): the supervisor resets again, and leaves it out of `keep` to drop it.
   */
  z.strictObject({ fn: z.literal('reset'), epoch: nat, keep: z.array(z.string()).optional() }),
  z.strictObject({ fn: z.literal('shutdown') }),
]);
export type CallBody = z.infer<typeof CallBody>;
export type CallFn = CallBody['fn'];

export const Call = z.strictObject({
  type: z.literal('call'),
  v,
  /** Unique per attempt-independent call: handling the same id twice is harmless. */
  id: z.string().min(1),
  model: z.string().min(1),
  iteration: z.number().int(),
  /**
   * Shared by the calls that the ranks of one mesh run together: it names their collective
   * messages, so that ranks of one call never mix with another's.
   */
  group: z.string().optional(),
  /**
   * The supervisor's recovery epoch when it made the call. A device that has been reset for a
   * later epoch refuses it (`interrupted`): work abandoned by a recovery never reaches the state
   * the recovery restored.
   */
  epoch: nat.optional(),
  /**
   * Runs beside the call the device is running, if neither changes a model the other touches:
   * the next policy version's view loaded, filled and released while a generation goes on with
   * the one before (engine/device/beside.ts). Only load, realloc and release may.
   */
  beside: z.literal(true).optional(),
  body: CallBody,
});
export type Call = z.infer<typeof Call>;

/** Activations, gradients and partial sums between the ranks of one call. */
export const Collective = z.strictObject({
  type: z.literal('coll'),
  v,
  group: z.string(),
  tag: z.string(),
  from: nat,
  /** Large tensors travel in parts no larger than the server's max payload. */
  part: nat,
  parts: pos,
  data: z.union([f32, i32]),
});
export type Collective = z.infer<typeof Collective>;

/**
 * `loss`: the call's loss was refused or failed (unknown, another file, not finite): it would fail
 * the same way again. `environment`: an environment failed an episode past its retries, never
 * appeared, or answered what the episode cannot take: the run stops, naming it.
 */
export const ERROR_CODES = [
  'malformed',
  'busy',
  'not_loaded',
  'unsupported',
  'invalid_state',
  'digest_mismatch',
  'timeout',
  'unreachable',
  'too_large',
  'interrupted',
  'failed',
  'loss',
  'environment',
] as const;
export type ErrorCode = (typeof ERROR_CODES)[number];

/**
 * A worker process's seal: random bits it makes when it starts, says in its hello and heartbeats
 * (on a closed bus only the supervisor and the launcher hear those) and puts on every reply to a
 * call. Anyone who holds the device's credential can hear its calls and answer first; only the
 * process the supervisor welcomed can seal the answer.
 */
const seal = z.string().optional();

export const Result = z.strictObject({
  type: z.literal('result'),
  v,
  id: z.string(),
  body: z.record(z.string(), z.unknown()),
  /** Milliseconds the device spent running the call, to tell compute from transport. */
  ms: z.number().nonnegative().optional(),
  seal,
});
export type Result = z.infer<typeof Result>;

export const ErrorReply = z.strictObject({
  type: z.literal('error'),
  v,
  id: z.string().optional(),
  code: z.enum(ERROR_CODES),
  message: z.string(),
  /** The subject the offending message came on, when there was one. */
  subject: z.string().optional(),
  seal,
});
export type ErrorReply = z.infer<typeof ErrorReply>;

export const Reply = z.discriminatedUnion('type', [Result, ErrorReply]);
export type Reply = z.infer<typeof Reply>;

export const Hello = z.strictObject({
  type: z.literal('hello'),
  v,
  worker: z.string(),
  /** The device slot this worker asks for; any free one when absent. */
  device: nat.optional(),
  pid: nat,
  host: z.string(),
  backend: z.string(),
  seal,
});
export type Hello = z.infer<typeof Hello>;

export const Welcome = z.strictObject({ type: z.literal('welcome'), v, device: nat, run: z.string() });
export type Welcome = z.infer<typeof Welcome>;
export const JoinReply = z.discriminatedUnion('type', [Welcome, ErrorReply]);

export const Heartbeat = z.strictObject({
  type: z.literal('heartbeat'),
  v,
  device: nat,
  worker: z.string(),
  state: z.string(),
  at: z.number(),
  /** So that a supervisor started later can adopt a worker from its beats alone. */
  pid: nat.optional(),
  backend: z.string().optional(),
  /**
   * Something the worker rejected (a malformed call, say). A worker may publish nothing on the
   * run's events: its supervisor says it there for it.
   */
  warning: z.string().optional(),
  /** So that a supervisor that adopts the worker from its beats knows its seal. */
  seal,
});
export type Heartbeat = z.infer<typeof Heartbeat>;

/** The supervisor is alive (every second); `pid` tells the launcher which process beats. */
export const SupervisorBeat = z.strictObject({ type: z.literal('beat'), v, pid: nat, at: z.number() });

/**
 * Chaos testing: a process that has reached a scheduled kill point asks the launcher to kill it
 * (and waits, so the kill lands inside the call); the launcher kills it, or answers `spare` when
 * that kill has already been done (a replayed call).
 */
export const ChaosAsk = z.strictObject({ type: z.literal('chaos'), v, target: z.string(), pid: nat, where: z.string() });
export type ChaosAsk = z.infer<typeof ChaosAsk>;
export const ChaosSpare = z.strictObject({ type: z.literal('spare'), v, target: z.string() });

/** A request to run on without a device (npm run cordon, or the launcher): the supervisor answers. */
export const CordonAsk = z.strictObject({ type: z.literal('cordon'), v, device: nat, trigger: z.enum(LOSS_TRIGGERS), reason: z.string() });
export type CordonAsk = z.infer<typeof CordonAsk>;
/** The supervisor takes the device out of the run: it re-plans on `left` at the next boundary. */
export const Cordoned = z.strictObject({ type: z.literal('cordoned'), v, device: nat, left: z.array(nat) });
export const CordonReply = z.discriminatedUnion('type', [Cordoned, ErrorReply]);

/** What each call returns, checked by the caller when the reply arrives. */
export const ResultBodies = {
  load: z.strictObject({ parameters: nat, digest: z.string(), base_kept: z.boolean().optional() }),
  sft: z.strictObject({ loss: z.number(), first_loss: z.number() }),
  preference: z.strictObject({ loss: z.number(), first_loss: z.number(), accuracy: z.number() }),
  /** With episodes, also the action mask, the step rewards by token, the episodes' records and the device's busy and total seconds. */
  generate: z.strictObject({
    tokens: i32,
    logprobs: f32,
    mask: f32.optional(),
    rewards: f32.optional(),
    episodes: z.array(EpisodeRecordWire).optional(),
    busy_seconds: z.number().optional(),
    seconds: z.number().optional(),
    /** In flight: the version that drew each token [batch, responseLen] (−1 after the end), and each replica's switches (the pass each version was taken from). */
    versions: i32.optional(),
    switches: z.array(z.array(z.strictObject({ step: nat, version: nat }))).optional(),
  }),
  inference: z.union([z.strictObject({ logprobs: f32 }), z.strictObject({ values: f32 }), z.strictObject({ scores: f32 })]),
  /** The loss, its statistics (clip fraction, …: what the loss declares) and the gradient's norm. */
  train: z.strictObject({ loss: z.number(), grad_norm: z.number(), stats: z.record(z.string(), z.number()) }),
  realloc: z.strictObject({
    sent_bytes: nat,
    received_bytes: nat,
    copied_bytes: nat,
    chunks: nat,
    /**
     * Where this device's time went, in ms (transfer.ts's TransferTimes), with `ready_ms` from the
     * call to its go and `wall_ms` from go to done.
     */
    times: z
      .strictObject({ export: z.number(), hash: z.number(), encode: z.number(), publish: z.number(), decode: z.number(), place: z.number(), ready_ms: z.number(), wall_ms: z.number() })
      .optional(),
    /**
     * The most this exchange made the device hold beyond what it held before, in MiB: tensors
     * (the new slices) and JavaScript buffers (chunks in flight, copies), sampled as chunks land.
     */
    held_mb: z.number().optional(),
  }),
  probe: z.strictObject({ sent_bytes: nat, received_bytes: nat }),
  stats: z.strictObject({
    rss_mb: z.number(),
    /** The highest RSS sampled (every 10 ms) since the previous stats call. */
    window_peak_rss_mb: z.number(),
    /** The process's highest RSS over its lifetime. */
    peak_rss_mb: z.number(),
    heap_mb: z.number(),
  }),
  manifest: z.strictObject({ manifest: z.array(TensorManifest), digest: z.string(), ledger: z.array(LedgerEntry).default([]) }),
  weights: z.strictObject({ tensors: z.array(z.strictObject({ name: z.string(), shape: z.array(nat), data: f32 })) }),
  checkpoint: z.strictObject({ step: nat, optimizer: z.boolean(), bytes: nat, ledger: z.array(LedgerEntry).default([]) }),
  snapshot: z.strictObject({ bytes: nat, digest: Digest, state: Digest }),
  /**
   * `bytes`: what was read from the bucket (the snapshot's object, and its base object where it was
   * read); `base_kept_bytes`: the bytes of the base object not read, as this shard still held that
   * base (its digest checked).
   */
  reload: z.strictObject({ bytes: nat, base_kept_bytes: nat.optional() }),
  /** `digest`: where the call asked, the digest of the weights held now (modelDigest, as `manifest`'s). */
  restore: z.strictObject({ digest: z.string().optional() }),
  reset: z.strictObject({
    dropped: z.array(z.string()),
    interrupted: z.string().optional(),
    /** Shards kept: where they are (layout, rank), their state's digest (weights, optimizer, ledger: stateDigest) and parameter count. */
    /** `base`: of a shard with adapters and an optimizer, the digest of what does not train (baseDigest), which a recovery compares with the snapshot's. */
    kept: z.array(z.strictObject({ model: z.string(), layout: Layout, rank: nat, state: z.string(), parameters: nat, base: z.string().optional() })).default([]),
    /** Models to keep that a call was still running on: neither kept nor dropped; a reset again says which. */
    busy: z.array(z.string()).default([]),
  }),
  release: z.strictObject({}),
  /** The pass the generation stops before (absent: none runs here, or it had ended). */
  switch: z.strictObject({ step: nat.optional() }),
  shutdown: z.strictObject({}),
} satisfies Record<CallFn, z.ZodType>;
export type ResultOf<F extends CallFn> = z.infer<(typeof ResultBodies)[F]>;
export type CallOf<F extends CallFn> = Extract<CallBody, { fn: F }>;
