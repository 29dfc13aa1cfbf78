// What a loss is: a named, typed value, like an algorithm. Its name, the head it reads (log-probs
// or values), its ports (the per-token arrays of the batch it reads besides the tokens and the
// response mask), its parameters (a zod schema with defaults, checked with the scenario), the
// statistics it reports, and a function of TensorFlow.js tensors. Built-in losses sit beside this
// file, one module each; a user's are exported from their algorithm's file.
import * as tf from '@tensorflow/tfjs';
import type { z } from 'zod';

export class LossError extends Error {
  override name = 'LossError';
}

/** Parameters as they travel on the bus: scalars only. */
export type LossParams = Record<string, number | string | boolean>;

/**
 * What a mini-batch's loss divides by: its real (unmasked) response tokens and its rows, over the
 * whole mini-batch. A replica that holds part of the mini-batch divides its sums by these, so the
 * replicas' parts add up to the mini-batch's loss.
 */
export interface LossNorm {
  tokens: number;
  rows: number;
}

/** What a loss's function is given: every tensor is [rows, R] (R: the response length). */
export interface LossInput<P = LossParams> {
  /** The head's prediction: log π_θ of each response token (policy head) or the values (value head). */
  pred: tf.Tensor2D;
  /** The per-token arrays the loss reads, by port. */
  data: Record<string, tf.Tensor2D>;
  /** 1 at the tokens the loss counts, 0 at padding (all ones when the call has no mask). */
  mask: tf.Tensor2D;
  /**
   * The whole mini-batch's real tokens and rows. Divide sums by these, never by this part's own
   * counts: data-parallel replicas each hold part of the mini-batch, and their losses are added.
   */
  norm: LossNorm;
  /** The parameters, parsed by the loss's schema (defaults filled in). */
  params: P;
}

/**
 * The scalar to minimise, and the statistics the loss reports (each a scalar computed like the
 * loss: a sum over this part's rows divided by `norm`, so that replicas' parts add up). The train
 * call reports each as the mean over the last epoch's mini-batches, as it does the loss.
 */
export interface LossOutput {
  loss: tf.Scalar;
  stats?: Record<string, tf.Scalar>;
}

export interface LossDefinition<S extends z.ZodType> {
  /** Letters, digits and _; unique among the built-in losses and the run's algorithm file. */
  name: string;
  /** One line for listings. */
  summary: string;
  /** `policy`: reads the response's log-probs; `value`: the value head's outputs. */
  head: 'policy' | 'value';
  /**
   * 2 for a loss over pairs: the call's rows are every chosen row, then every rejected row (item i
   * is rows i and items + i); mini-batches and replicas split items. Default 1.
   */
  rowsPerItem?: 1 | 2;
  /** Its parameters: a strict object (z.strictObject); keys with defaults may be left out by a call. */
  params: S;
  /** The per-token arrays it reads (the train call binds each to a batch field). */
  ports: readonly string[] | ((params: z.output<S>) => readonly string[]);
  /** The statistics it reports besides the loss (a train call may write each to a batch field). */
  stats?: readonly string[];
  /** The mini-batch's loss; see LossInput for the shapes and the division by `norm`. */
  compute(input: LossInput<z.output<S>>): LossOutput;
}

const BRAND = Symbol.for('ferry.loss');

export interface Loss<S extends z.ZodType = z.ZodType> {
  readonly [BRAND]: true;
  readonly name: string;
  readonly summary: string;
  readonly head: 'policy' | 'value';
  readonly rowsPerItem: 1 | 2;
  readonly params: S;
  readonly stats: readonly string[];
  ports(params: LossParams): string[];
  compute(input: LossInput<z.output<S>>): LossOutput;
}

/** Whether a value (a module's export, say) is a loss made with defineLoss. */
export const isLoss = (x: unknown): x is Loss => typeof x === 'object' && x !== null && (x as Record<symbol, unknown>)[BRAND] === true;

const NAME = /^[A-Za-z][A-Za-z0-9_]*$/;

/** A loss as a value; its definition is checked here, so a bad one fails where it is written. */
export function defineLoss<S extends z.ZodType>(d: LossDefinition<S>): Loss<S> {
  const where = `defineLoss(${JSON.stringify(d?.name)})`;
  if (typeof d?.name !== 'string' || !NAME.test(d.name)) throw new LossError(`${where}: a loss's name is a letter, then letters, digits and _`);
  if (d.head !== 'policy' && d.head !== 'value') throw new LossError(`${where}: head: expected 'policy' or 'value', got ${JSON.stringify(d.head)}`);
  if (d.rowsPerItem !== undefined && d.rowsPerItem !== 1 && d.rowsPerItem !== 2) throw new LossError(`${where}: rowsPerItem: expected 1 or 2, got ${JSON.stringify(d.rowsPerItem)}`);
  if (typeof (d.params as { safeParse?: unknown } | undefined)?.safeParse !== 'function') throw new LossError(`${where}: params: expected a zod schema (z.strictObject({...}))`);
  if (typeof d.compute !== 'function') throw new LossError(`${where}: compute: expected a function of { pred, data, mask, norm, params }`);
  const stats = [...(d.stats ?? [])];
  for (const s of stats)
    if (!NAME.test(s) || s === 'loss' || s === 'grad_norm') throw new LossError(`${where}: stats: '${s}' is not a statistic's name (letters, digits and _; not loss or grad_norm)`);
  const ports = d.ports;
  return Object.freeze({
    [BRAND]: true as const,
    name: d.name,
    summary: d.summary,
    head: d.head,
    rowsPerItem: d.rowsPerItem ?? 1,
    params: d.params,
    stats,
    ports: (params: LossParams) => [...(typeof ports === 'function' ? ports(params as z.output<S>) : ports)],
    compute: d.compute,
  });
}

/**
 * A loss's parameters parsed by its schema: defaults filled in, unknown keys and wrong types
 * refused with the loss and the key named. What comes out must be scalars (they travel).
 */
export function lossParams(loss: Loss, given: unknown): LossParams {
  const parsed = loss.params.safeParse(given ?? {});
  if (!parsed.success) {
    const problems = parsed.error.issues.map((i) => `${i.path.length ? i.path.join('.') : '(params)'}: ${i.message}`);
    throw new LossError(`the loss '${loss.name}': ${problems.join('; ')}`);
  }
  const out: LossParams = {};
  for (const [k, v] of Object.entries((parsed.data ?? {}) as Record<string, unknown>)) {
    if (v === undefined) continue;
    if (typeof v !== 'number' && typeof v !== 'string' && typeof v !== 'boolean')
      throw new LossError(`the loss '${loss.name}': parameter '${k}' is ${typeof v}; a loss's parameters are numbers, strings or booleans`);
    out[k] = v;
  }
  return out;
}

/** What a loss's function gave back, checked: a scalar loss and exactly its declared statistics. */
export interface Evaluated {
  loss: tf.Scalar;
  stats: Record<string, tf.Scalar>;
}

/**
 * Runs a loss on a mini-batch (or a replica's part of it) and checks what it returns: the loss a
 * scalar tensor, each declared statistic a scalar. `data.mask` is the response mask (absent: every
 * token counts); `norm` the whole mini-batch's totals (absent: this part's own).
 */
export function evaluateLoss(loss: Loss, pred: tf.Tensor, data: Record<string, tf.Tensor>, params: LossParams, norm?: LossNorm): Evaluated {
  const mask = (data.mask ?? tf.onesLike(pred)) as tf.Tensor2D;
  const n = norm ?? { tokens: tf.sum(mask).arraySync() as number, rows: mask.shape[0]! };
  let out: LossOutput;
  try {
    out = loss.compute({ pred: pred as tf.Tensor2D, data: data as Record<string, tf.Tensor2D>, mask, norm: n, params: params as never });
  } catch (e) {
    if (e instanceof LossError) throw e;
    throw new LossError(`the loss '${loss.name}' failed: ${(e as Error)?.message ?? String(e)}`, { cause: e });
  }
  const value = out?.loss;
  if (!(value instanceof tf.Tensor)) throw new LossError(`the loss '${loss.name}' returned ${describe(value)} as its loss; expected a scalar tensor`);
  if (value.rank !== 0) throw new LossError(`the loss '${loss.name}' returned a loss of shape [${value.shape.join(', ')}]; expected a scalar (reduce it, e.g. with tf.sum(...) / norm.tokens)`);
  const stats: Record<string, tf.Scalar> = {};
  const given = out.stats ?? {};
  for (const k of Object.keys(given))
    if (!loss.stats.includes(k)) throw new LossError(`the loss '${loss.name}' reported the statistic '${k}', which it does not declare (stats: [${loss.stats.join(', ')}])`);
  for (const k of loss.stats) {
    const s = given[k];
    if (!(s instanceof tf.Tensor) || s.rank !== 0)
      throw new LossError(
        `the loss '${loss.name}' declares the statistic '${k}' but returned ${s instanceof tf.Tensor ? `a tensor of shape [${s.shape.join(', ')}]` : describe(s)}; expected a scalar tensor`,
      );
    stats[k] = s as tf.Scalar;
  }
  return { loss: value as tf.Scalar, stats };
}

/** A loss value read back: a NaN or an infinity is the loss's problem, not a fault to recover from. */
export function checkedValue(loss: Loss, value: number, where: string): number {
  if (!Number.isFinite(value)) throw new LossError(`the loss '${loss.name}' is ${value} ${where}; a loss must be finite (check its divisions and logarithms)`);
  return value;
}

const describe = (x: unknown) => (x === undefined ? 'nothing' : x === null ? 'null' : Array.isArray(x) ? 'an array' : typeof x === 'object' ? 'an object' : `a ${typeof x}`);

/**
 * The tensor as it is, with no gradient through it (sg(·) in the papers): for weights that scale
 * a gradient without being optimised themselves (CISPO's clipped ratio, GSPO-token's sequence ratio).
 */
export const stopGradient = tf.customGrad(((x: tf.Tensor) => ({ value: tf.clone(x), gradFunc: (dy: tf.Tensor) => tf.zerosLike(dy) })) as unknown as Parameters<typeof tf.customGrad>[0]) as unknown as <
  T extends tf.Tensor,
>(
  x: T,
) => T;
