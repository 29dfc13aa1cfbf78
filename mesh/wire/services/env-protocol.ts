// The environment protocol: how a generating device plays multi-turn episodes against any process
// on the bus, in any language. docs/environment-protocol.md is the contract for implementers; this
// module is ferry's side of it. An episode is `env.reset` → an observation, then `env.step` (the
// policy's action, as text) → an observation, a reward for the step and `done`, until `done` or
// the turn budget; `env.close` at the end. Everything is plain msgpack, as the reward protocol's.
import { z } from 'zod';
import { token } from '../bus/subjects.ts';

/** The protocol's version; a message of another version is refused with a reply that says so. */
export const ENV_PROTOCOL_VERSION = 1;

/** The most bytes of text one observation may carry, and the most `info` entries. */
export const ENV_LIMITS = { observationBytes: 65536, actionBytes: 65536, infoKeys: 32 } as const;

/** Subjects of the environment service `name` (letters, digits, '-' and '_'). */
export function envSubjects(name: string) {
  const root = `ferry.env.${token('environment name', name)}`;
  return {
    /** Requests to any instance (for other clients); every instance subscribes in the queue group `queue`. */
    request: root,
    queue: `ferry-env-${name}`,
    /** Requests to one instance: ferry sends here, since an episode lives on the instance that reset it. */
    instance: (id: string) => `${root}.i.${token('environment instance id', id)}`,
    /** Each instance says it is there, every second. */
    presence: `${root}.hb`,
  } as const;
}

const v = z.literal(ENV_PROTOCOL_VERSION);
const int = z.number().int();
const text = (max: number) => z.string().refine((s) => Buffer.byteLength(s) <= max, { message: `longer than ${max} bytes` });

/** What the episode is about: the task's row (a prompt and its answer) or only a seed. */
export const EnvTask = z.object({
  /** The row's prompt as text, empty when the environment makes its own. */
  prompt_text: z.string(),
  /** What a perfect answer would be, when the task knows it. */
  ground_truth: z.string().optional(),
  /** A seed for the episode's randomness: the same seed, the same episode. */
  seed: int.nonnegative(),
});
export type EnvTask = z.infer<typeof EnvTask>;

const request = { v, id: z.string(), run: z.string(), episode: z.string() };

export const EnvReset = z.object({ type: z.literal('env.reset'), ...request, task: EnvTask, max_turns: int.positive() });
export type EnvReset = z.infer<typeof EnvReset>;

export const EnvStep = z.object({
  type: z.literal('env.step'),
  ...request,
  /** 1 for the first action after the reset. */
  turn: int.positive(),
  action: text(ENV_LIMITS.actionBytes),
  /** True when ferry is bringing a new instance to where a failed one was: the observation is not used. */
  replay: z.boolean().optional(),
});
export type EnvStep = z.infer<typeof EnvStep>;

export const EnvClose = z.object({ type: z.literal('env.close'), ...request });
export type EnvClose = z.infer<typeof EnvClose>;

/** Optional: an episode played by the environment's own expert, for a warm-up to learn from (the expert acts on what the policy would see). */
export const EnvDemo = z.object({ type: z.literal('env.demo'), ...request, task: EnvTask, max_turns: int.positive() });
export type EnvDemo = z.infer<typeof EnvDemo>;

export const EnvRequest = z.discriminatedUnion('type', [EnvReset, EnvStep, EnvClose, EnvDemo]);
export type EnvRequest = z.infer<typeof EnvRequest>;

export const EnvObservation = z.object({
  type: z.literal('env.observation'),
  v,
  id: z.string(),
  instance: z.string(),
  episode: z.string(),
  /** Text the policy reads next (appended to its sequence); empty is allowed. */
  observation: text(ENV_LIMITS.observationBytes),
  /** This step's reward (0 for a reset). */
  reward: z.number().refine(Number.isFinite, { message: 'not a finite number' }).default(0),
  done: z.boolean(),
  /** Metrics of the step, averaged per iteration under `env/<key>`. */
  info: z
    .record(z.string(), z.number().refine(Number.isFinite, { message: 'not a finite number' }))
    .refine((r) => Object.keys(r).length <= ENV_LIMITS.infoKeys, { message: `more than ${ENV_LIMITS.infoKeys} entries` })
    .optional(),
});
export type EnvObservation = z.infer<typeof EnvObservation>;

export const EnvClosed = z.object({ type: z.literal('env.closed'), v, id: z.string(), instance: z.string(), episode: z.string() });

/** The expert's episode: the reset's observation, then each action and the observation that answered it. */
export const EnvDemonstration = z.object({
  type: z.literal('env.demonstration'),
  v,
  id: z.string(),
  instance: z.string(),
  episode: z.string(),
  observation: text(ENV_LIMITS.observationBytes),
  turns: z.array(z.object({ action: text(ENV_LIMITS.actionBytes), observation: text(ENV_LIMITS.observationBytes) })).min(1),
});
export type EnvDemonstration = z.infer<typeof EnvDemonstration>;

export const EnvError = z.object({
  type: z.literal('env.error'),
  v: int,
  id: z.string().optional(),
  instance: z.string().optional(),
  message: z.string(),
});

export const EnvReply = z.discriminatedUnion('type', [EnvObservation, EnvClosed, EnvDemonstration, EnvError]);
export type EnvReply = z.infer<typeof EnvReply>;

export const EnvPresence = z.object({ type: z.literal('env.hello'), v, name: z.string(), instance: z.string() });
export type EnvPresence = z.infer<typeof EnvPresence>;
