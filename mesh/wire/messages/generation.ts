// What generation carries on the bus beside its calls: episodes against an environment (how a
// device reads an action as text, an episode's record, the answers it received and logs as they
// come), the samples of a continuous generation as each ends, and what a generation needs to take
// new versions in flight.
import { z } from 'zod';
import { PROTOCOL_VERSION, f32, i32, nat, pos } from './primitives.ts';

/** How a device reads an action's tokens as text and an observation's text as tokens. */
export const TurnCodecSpec = z.discriminatedUnion('kind', [
  /** A digit task's: a token is its base-36 digit; other characters are refused. */
  z.strictObject({ kind: z.literal('digits'), base: pos }),
  /** A tokenizer directory's (tokenizer.json); with `template`, observations are rendered as user messages by its chat template. */
  z.strictObject({ kind: z.literal('tokenizer'), dir: z.string().min(1), template: z.boolean() }),
]);
export type TurnCodecSpec = z.infer<typeof TurnCodecSpec>;

/** One step of an episode as it happened (its record, kept in the run's store). */
export const TurnRecordWire = z.strictObject({
  action: z.array(nat),
  text: z.string(),
  observation: z.string(),
  observationTokens: nat,
  reward: z.number(),
  done: z.boolean(),
  info: z.record(z.string(), z.number()).optional(),
  instance: z.string(),
  seconds: z.number(),
});

export const EpisodeRecordWire = z.strictObject({
  id: z.string(),
  reset: z.strictObject({ observation: z.string(), tokens: nat, instance: z.string(), seconds: z.number() }),
  turns: z.array(TurnRecordWire),
  return: z.number(),
  end: z.enum(['done', 'turns', 'truncated']),
});
export type EpisodeRecordWire = z.infer<typeof EpisodeRecordWire>;

/**
 * One answer of the environment as a generating device received it: the reset's (`k` 0) or the
 * k-th step's, with the action it answered. Devices send them to the supervisor as they come
 * (TurnLog); a generate call played again after a fault carries them back (`recorded`), and the
 * device reads them instead of asking the environment again.
 */
export const EnvAnswer = z.strictObject({
  episode: z.string(),
  k: nat,
  /** The action's text as sent (a step's), checked against the action played again. */
  action: z.string().optional(),
  observation: z.string(),
  reward: z.number(),
  done: z.boolean(),
  info: z.record(z.string(), z.number()).optional(),
  instance: z.string(),
  seconds: z.number(),
});
export type EnvAnswer = z.infer<typeof EnvAnswer>;

/** What a device's log of a call's progress names: the call's recovery epoch, iteration and the graph's call (the stage its result is stored under). */
const callStage = { epoch: nat, iteration: nat, stage: z.string().min(1) };

/** A device's answers from the environment, on its own `turns` subject as they arrive. */
export const TurnLog = z.strictObject({
  type: z.literal('turns'),
  v: z.literal(PROTOCOL_VERSION),
  ...callStage,
  answers: z.array(EnvAnswer),
});
export type TurnLog = z.infer<typeof TurnLog>;

/**
 * A sample of a continuous generation (a generate call with `slots`) the moment it ended, on its
 * device's own `samples` subject: its row in the call's batch, its tokens [promptLen + responseLen]
 * and log-probabilities [responseLen], exactly as the call's reply will hold them.
 */
export const SampleLog = z.strictObject({
  type: z.literal('sample'),
  v: z.literal(PROTOCOL_VERSION),
  ...callStage,
  row: nat,
  tokens: i32,
  logprobs: f32,
  /** In flight: the version that drew each token [responseLen] (−1 after the end). */
  versions: i32.optional(),
});
export type SampleLog = z.infer<typeof SampleLog>;

/**
 * A continuous generation that may take newer versions in flight: the version it starts with, what
 * becomes of the keys and values written before a switch, and (a replay) the switches decided
 * before: each a version and, for each replica of the call (its dp rank), the pass it is taken
 * from, or null where that replica did not take it.
 */
export const InflightSpec = z.strictObject({
  version: nat,
  kv: z.enum(['keep', 'recompute']),
  switches: z.array(z.strictObject({ version: nat, steps: z.array(nat.nullable()) })).optional(),
});
export type InflightSpec = z.infer<typeof InflightSpec>;

/** A generate call's episodes of several turns against an environment on the bus (docs/environment-protocol.md). */
export const EpisodesSpec = z.strictObject({
  /** The environment service's name. */
  environment: z.string().min(1),
  /** One episode id and task per row of the call. */
  ids: z.array(z.string()),
  tasks: z.array(z.strictObject({ prompt_text: z.string(), ground_truth: z.string().optional(), seed: nat })),
  max_turns: pos,
  turn_tokens: pos,
  /** Tokens that end an action (kept in it), and texts that end one too. */
  stop: z.array(nat),
  stop_strings: z.array(z.string()).optional(),
  /** Episodes decoded as one batch. */
  group_size: pos,
  /** Instead of groups: episodes decoded this many at once, one waiting on its environment giving its slot to another. */
  slots: pos.optional(),
  codec: TurnCodecSpec,
  /** The token after a sequence's end. */
  fill: nat,
  timeout_ms: pos,
  retries: nat,
  wait_ms: pos,
  /** The stage the device names when it sends its answers to the supervisor (TurnLog); none: it sends none. */
  log: z.string().min(1).optional(),
  /** Answers recorded before a fault, by episode, in order from its reset: read instead of asking again. */
  recorded: z.record(z.string(), z.array(EnvAnswer)).optional(),
});
export type EpisodesSpec = z.infer<typeof EpisodesSpec>;
