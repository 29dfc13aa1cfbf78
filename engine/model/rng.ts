// Seeded randomness that every process derives the same way. A stream is named by integers
// (run seed, iteration, prompt index, purpose), so sampling does not depend on which process runs
// it or in which order calls arrive.

/** Mixes integers into one 32-bit seed (murmur3's finaliser over a running hash). */
export function seedOf(...parts: number[]): number {
  let h = 0x811c9dc5;
  for (const part of parts) {
    let k = Math.imul(part >>> 0, 0xcc9e2d51);
    k = (k << 15) | (k >>> 17);
    h ^= Math.imul(k, 0x1b873593);
    h = Math.imul((h << 13) | (h >>> 19), 5) + 0xe6546b64;
    // Fold in the high bits of values above 2^32 too.
    h ^= Math.floor(part / 0x100000000);
  }
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** Purposes, so that streams for different uses of the same indices never coincide. */
export const Stream = {
  init: 1,
  prompts: 2,
  sample: 3,
  shuffle: 4,
  demos: 5,
  pairs: 6,
  /** An episode's seed for its environment (shared by the samples of one prompt). */
  episodes: 7,
} as const;

/** mulberry32: small, fast, and identical everywhere JavaScript runs. */
export class Rng {
  private state: number;
  constructor(seed: number) {
    this.state = seed >>> 0;
  }
  nextU32(): number {
    this.state = (this.state + 0x6d2b79f5) >>> 0;
    let t = this.state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (t ^ (t >>> 14)) >>> 0;
  }
  /** Uniform in [0, 1), 53 bits. */
  uniform(): number {
    return (this.nextU32() * 0x200000 + (this.nextU32() >>> 11)) / 2 ** 53;
  }
  int(n: number): number {
    return Math.floor(this.uniform() * n);
  }
  normal(): number {
    // Box–Muller; 1 - u keeps the log away from zero.
    const u = 1 - this.uniform();
    const v = this.uniform();
    return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v);
  }
  /** A permutation of 0..n-1 (Fisher–Yates). */
  permutation(n: number): number[] {
    const p = Array.from({ length: n }, (_, i) => i);
    for (let i = n - 1; i > 0; i--) {
      const j = this.int(i + 1);
      [p[i], p[j]] = [p[j]!, p[i]!];
    }
    return p;
  }
}

/** The index of the largest value (the first, on ties): greedy decoding. */
export function argmax(values: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < values.length; i++) if (values[i]! > values[best]!) best = i;
  return best;
}

/** How a token is drawn from the next-token logits. */
export interface Sampling {
  /** Divides the logits before the softmax (> 0). */
  temperature: number;
  /** Only the k likeliest tokens (0: all). */
  topK?: number;
  /** Only the smallest set of likeliest tokens whose probability reaches p (1: all). */
  topP?: number;
  /** The likeliest token, always (the others are ignored). */
  greedy?: boolean;
}

/** What is wrong with sampling settings, or undefined. */
export function samplingProblem(s: Sampling): string | undefined {
  if (!(s.temperature > 0) || !Number.isFinite(s.temperature)) return `temperature must be a positive number, got ${s.temperature}`;
  if (s.topK !== undefined && !(Number.isInteger(s.topK) && s.topK >= 0)) return `top_k must be a whole number ≥ 0 (0: off), got ${s.topK}`;
  if (s.topP !== undefined && !(s.topP > 0 && s.topP <= 1)) return `top_p must be in (0, 1] (1: off), got ${s.topP}`;
  return undefined;
}

/**
 * Draws a token from logits with one uniform number `u`: softmax at the temperature in float64
 * with the maximum subtracted; then, if asked, only the top-k tokens, and of those the smallest
 * set whose probability reaches top-p (ranked by probability, ties to the lower index; at least
 * one token stays); then the inverse CDF in index order (a fixed reduction order). Without
 * top-k and top-p, every token takes part.
 */
export function sampleToken(logits: Float32Array, s: Sampling | number, u: number): number {
  const { temperature, topK = 0, topP = 1, greedy = false } = typeof s === 'number' ? { temperature: s } : s;
  if (greedy) return argmax(logits);
  let max = -Infinity;
  for (let i = 0; i < logits.length; i++) max = Math.max(max, logits[i]!);
  let sum = 0;
  const w = new Float64Array(logits.length);
  for (let i = 0; i < logits.length; i++) {
    w[i] = Math.exp((logits[i]! - max) / temperature);
    sum += w[i]!;
  }
  const V = w.length;
  if ((topK > 0 && topK < V) || topP < 1) {
    const order = Array.from({ length: V }, (_, i) => i).sort((a, b) => w[b]! - w[a]! || a - b);
    let keep = topK > 0 ? Math.min(topK, V) : V;
    if (topP < 1) {
      let kept = 0;
      for (let j = 0; j < keep; j++) kept += w[order[j]!]!;
      let acc = 0;
      for (let j = 0; j < keep; j++) {
        acc += w[order[j]!]!;
        if (acc >= topP * kept) {
          keep = j + 1;
          break;
        }
      }
    }
    for (let j = keep; j < V; j++) w[order[j]!] = 0;
    sum = 0;
    for (let i = 0; i < V; i++) sum += w[i]!;
  }
  let acc = 0;
  const target = u * sum;
  let last = 0;
  for (let i = 0; i < V; i++) {
    if (w[i]! === 0) continue;
    acc += w[i]!;
    last = i;
    if (target < acc) return i;
  }
  return last;
}
