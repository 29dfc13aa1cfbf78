// The reward protocol: how ferry asks any process on the bus, in any language, to score responses.
// docs/reward-protocol.md is the contract for implementers; this module is ferry's side of it.
// Everything is plain msgpack (maps, arrays, numbers, strings): no extension types, so any
// msgpack library reads it.
import { z } from 'zod';
import { token } from '../bus/subjects.ts';

/** The protocol's version; a message of another version is refused with a reply that says so. */
export const REWARD_PROTOCOL_VERSION = 1;

/** Subjects of the reward service `name` (letters, digits, '-' and '_'). */
export function rewardSubjects(name: string) {
  const root = `ferry.reward.${token('reward name', name)}`;
  return {
    /** Requests to any instance: every instance subscribes here in the queue group `queue`. */
    request: root,
    queue: `ferry-reward-${name}`,
    /** Requests to one instance (ferry uses these, to retry a slow instance's request elsewhere). */
    instance: (id: string) => `${root}.i.${token('reward instance id', id)}`,
    /** Each instance says it is there, every second. */
    presence: `${root}.hb`,
  } as const;
}

const v = z.literal(REWARD_PROTOCOL_VERSION);
const int = z.number().int();

export const RewardItem = z.object({
  /** Unique within the request; the reply's scores carry it back. */
  id: z.string(),
  prompt: z.array(int),
  response: z.array(int),
  prompt_text: z.string(),
  response_text: z.string(),
  /** What a perfect response would be, when the task knows it. */
  ground_truth: z.string().optional(),
});
export type RewardItem = z.infer<typeof RewardItem>;

export const RewardRequest = z.object({
  type: z.literal('reward.request'),
  v,
  /** The request's id: the reply carries it back. */
  id: z.string(),
  /** The run and iteration asking (for the reward actor's logs; scores must not depend on them). */
  run: z.string(),
  iteration: int,
  items: z.array(RewardItem),
});
export type RewardRequest = z.infer<typeof RewardRequest>;

export const RewardScores = z.object({
  type: z.literal('reward.reply'),
  v,
  id: z.string(),
  /** The instance that answered. */
  instance: z.string(),
  /** One per item, in the request's order, each naming its item. */
  scores: z.array(z.object({ id: z.string(), score: z.number() })),
});
export type RewardScores = z.infer<typeof RewardScores>;

export const RewardError = z.object({
  type: z.literal('reward.error'),
  v: int,
  id: z.string().optional(),
  instance: z.string().optional(),
  message: z.string(),
});

export const RewardReply = z.discriminatedUnion('type', [RewardScores, RewardError]);
export type RewardReply = z.infer<typeof RewardReply>;

export const RewardPresence = z.object({
  type: z.literal('reward.hello'),
  v,
  name: z.string(),
  instance: z.string(),
  /** Other fields an implementation may send (its language, its version) are ignored. */
});
export type RewardPresence = z.infer<typeof RewardPresence>;
