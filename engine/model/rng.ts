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

/**
 * Draws a token from logits at a temperature with one uniform number: softmax in float64 with
 * the maximum subtracted, then the inverse CDF in index order (a fixed reduction order).
 */
/** The index of the largest value (the first, on ties): greedy decoding. */
export function argmax(values: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < values.length; i++) if (values[i]! > values[best]!) best = i;
  return best;
}

export function sampleToken(logits: Float32Array, temperature: number, u: number): number {
  let max = -Infinity;
  for (let i = 0; i < logits.length; i++) max = Math.max(max, logits[i]!);
  let sum = 0;
  const w = new Float64Array(logits.length);
  for (let i = 0; i < logits.length; i++) {
    w[i] = Math.exp((logits[i]! - max) / temperature);
    sum += w[i]!;
  }
  let acc = 0;
  const target = u * sum;
  for (let i = 0; i < w.length; i++) {
    acc += w[i]!;
    if (target < acc) return i;
  }
  return w.length - 1;
}
