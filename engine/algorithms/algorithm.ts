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

/** The copy of ferry's modules that made an algorithm: defineAlgorithm marks each with it. */
const MADE_BY = Symbol.for('ferry.algorithm');
const THIS_COPY: { readonly url: string } = Object.freeze({ url: import.meta.url });

export function defineAlgorithm<S extends z.ZodType>(a: Algorithm<S>): Algorithm<S> {
  if (typeof a === 'object' && a !== null && !Object.isFrozen(a)) Object.defineProperty(a, MADE_BY, { value: THIS_COPY });
  return a;
}

/**
 * Where another copy of ferry's modules lives when that copy made the algorithm (a user's file that
 * imports `engine/api.ts` from another checkout): its losses, its built-in graphs' loss look-ups
 * and its `tf` are not this process's. Undefined when this copy made it, or nothing says.
 */
export function madeByAnotherCopy(a: object): string | undefined {
  const by = (a as Record<symbol, unknown>)[MADE_BY] as { url?: unknown } | undefined;
  if (by === undefined || by === THIS_COPY) return undefined;
  return typeof by?.url === 'string' ? by.url : 'an unknown place';
}
