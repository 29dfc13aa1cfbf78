// What an algorithm is: a name, its options (a schema with defaults, checked like the rest of a
// scenario) and a function from options to its graph. Built-in ones sit beside this file, one
// module each; a user's is one file that default-exports `defineAlgorithm({...})`.
import type { z } from 'zod';
import type { Graph } from './graph.ts';

/** The scenario's `rl:` section: what every algorithm's iteration has. */
export interface RlConfig {
  iterations: number;
  /** Prompts (or pairs) per iteration. */
  batch: number;
  epochs: number;
  minibatches: number;
  /** ε of the clipped policy loss. */
  clip: number;
  /** β of the KL term (in the reward or in the loss, as the algorithm uses it). */
  kl_coef: number;
  temperature: number;
  /** The policy's learning rate. */
  lr: number;
  clip_norm: number;
}

export interface Algorithm<S extends z.ZodType = z.ZodType> {
  name: string;
  /** One line for listings. */
  summary: string;
  /** The options under `algorithm:` besides `name`; a strict object whose keys all have defaults. */
  options: S;
  graph(options: z.output<S>, rl: RlConfig): Graph;
}

export function defineAlgorithm<S extends z.ZodType>(a: Algorithm<S>): Algorithm<S> {
  return a;
}
