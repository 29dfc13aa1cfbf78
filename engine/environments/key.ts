// The scenario's `environment:` key: the service its episodes are played against, their budgets,
// how the environment's reward joins the others, and optionally the command ferry starts as the
// environment's own processes on the run's bus.
import { z } from 'zod';

const pos = z.number().int().positive();

export const EnvironmentKey = z.strictObject({
  name: z
    .string()
    .regex(/^[A-Za-z0-9_-]+$/, 'letters, digits, - and _ (it is a NATS subject token)')
    .describe('the environment service (docs/environment-protocol.md)'),
  max_turns: pos.default(4).describe("actions per episode, at most; then the episode ends (counted in the metrics' turn_limit)"),
  turn_tokens: pos.default(16).describe('tokens of one action, at most (its end-of-turn token included)'),
  stop_strings: z.array(z.string().min(1)).default([]).describe("an action also ends when its text ends with one of these (besides the task's end token)"),
  weight: z.number().nonnegative().default(1).describe("weight of an episode's return (the sum of its steps' rewards) in the reward, beside the rule's and reward actors'"),
  group_size: pos.default(8).describe('episodes decoded as one batch; while a group waits on the environment, the device decodes the others'),
  timeout_seconds: z.number().positive().default(10).describe('one request; then the episode moves to another instance'),
  retries: z.number().int().nonnegative().default(2).describe('further attempts after the first, each on another instance'),
  wait_seconds: z.number().positive().default(60).describe('how long to wait for an instance to appear'),
  command: z
    .union([z.string().min(1), z.array(z.string().min(1)).min(1)])
    .optional()
    .describe(
      "a command ferry starts as the environment's processes (a string runs in a shell), on the run's bus with the environment's credentials; without it an environment started by hand joins by name",
    ),
  instances: pos.default(1).describe('processes of `command` to start'),
  seconds: z
    .number()
    .nonnegative()
    .optional()
    .describe('what one answer (a reset or a step) takes the environment itself, as far as you know it: the planner prices the generation’s waits with it, beside the bus’s round trip (npm run plan)'),
});
export type EnvironmentKey = z.output<typeof EnvironmentKey>;
