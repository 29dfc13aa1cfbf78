// A decoding session of sequences at positions of their own, on one rank (GptRank.decoder): what
// episodes of several turns and continuous generation decode through. Each pass feeds every row its
// tokens at its own start; rows can be refilled with prompts prefilled as a batch of their own,
// dropped, copied out and put back. The session keeps the rows' KV cache and left padding; the rank
// keeps the model and does the passes (DecodingRank).
import { KvCache } from './kv-cache.ts';

/** Rows of a decoding session copied out (RowDecoder.stash); the holder disposes it. */
export interface RowStash {
  readonly rows: number;
  readonly cache: KvCache;
  readonly pads?: Int32Array;
  dispose(): void;
}

/** A decoding session of sequences at positions of their own (GptRank.decoder). */
export interface RowDecoder {
  readonly capacity: number;
  /** Sequences held now (fewer after `keep`). */
  readonly rows: number;
  /** Tokens [rows, n] at each row's own start; the logits [rows, V] at each row's column `last`. */
  pass(tokens: Int32Array, n: number, starts: Int32Array, last: Int32Array): Promise<Float32Array>;
  /**
   * Prompts [k, n] prefilled as a batch of their own from position 0, exactly as a generate call
   * prefills them, and placed into rows `into` (what those rows held before is dropped, their
   * left padding now the prompts'): the logits [k, V] after each prompt's last token.
   */
  prefill(into: Int32Array, prompts: Int32Array, n: number): Promise<Float32Array>;
  /** Keeps rows `rows` only (indices of the rows held now), in that order. */
  keep(rows: ArrayLike<number>): void;
  /** Copies rows `rows` out (their keys, values and left padding), for `restore` to put back into any rows later. */
  stash(rows: Int32Array): RowStash;
  /** Rows `into` take what `stash` copied out, as they were (what they held before is dropped). */
  restore(into: Int32Array, stash: RowStash): void;
  /**
   * The log-probabilities of `k` whole sequences' sampled tokens [k, width] (prompts of `promptLen`),
   * as a generate call computes them (a forward pass over the sequences, as training reads them;
   * 0 after each `eos`): [k, width − promptLen].
   */
  logprobs(tokens: Int32Array, k: number, promptLen: number, eos?: number): Promise<Float32Array>;
  /**
   * The passes from now on go through `next` (another version of the same model on the same
   * layout: its heads are this rank's); the keys and values written so far stay, as the old
   * version wrote them. The old rank is closed.
   */
  switchTo(next: DecodingRank): void;
  /**
   * Rows `into` written again from position 0 with the passes' rank as it is now: each row's
   * sequence [n] (its prompt and what it has drawn but the last token, which the next pass feeds)
   * prefilled as a batch of its own, as `prefill` does; rows of one length together.
   */
  recompute(into: Int32Array, sequences: Int32Array[]): Promise<void>;
  dispose(): void;
}

/** What a session needs of its rank: one stage that has the logits (pp = 1). */
export interface DecodingRank {
  /** Key/value heads this rank holds, and their size. */
  readonly heads: number;
  readonly headSize: number;
  /** One pass of `b` rows of `T` tokens at `start` through `cache`: the logits [b, V] at each row's column `last` (its last without). */
  pass(tag: string, tokens: Int32Array, b: number, T: number, start: number | Int32Array, cache: KvCache, pads?: Int32Array, last?: Int32Array): Promise<Float32Array>;
  /** Each row's left padding among its first `limit` tokens, for a model with a pad token. */
  padsOf(tokens: Int32Array, b: number, T: number, limit: number): Int32Array | undefined;
  /** RowDecoder.logprobs, for sequences of `promptLen` prompts. */
  logprobs(tag: string, tokens: Int32Array, b: number, promptLen: number, eos?: number): Promise<Float32Array>;
  /** Called once the session is disposed. */
  closed(): void;
}

/** A session of `rows` sequences of up to `capacity` positions on `rank`; `pads`: the rows' left padding to start with. */
export function openRowDecoder(first: DecodingRank, rows: number, capacity: number, pads?: Int32Array): RowDecoder {
  let rank = first;
  const { heads, headSize } = rank;
  const kv = new KvCache(rows * heads, headSize, capacity);
  let passes = 0;
  let open = true;
  let held = rows;
  /** Rows `into` take left padding `from` (none: no padding). */
  const padInto = (into: Int32Array, from: Int32Array | undefined) => {
    if (!from && !pads) return;
    pads ??= new Int32Array(held);
    into.forEach((r, j) => (pads![r] = from?.[j] ?? 0));
  };
  const dec: RowDecoder = {
    capacity,
    get rows() {
      return held;
    },
    pass: (tokens, n, starts, last) => rank.pass(`ep/${passes++}`, tokens, held, n, starts, kv, pads, last),
    prefill: async (into, prompts, n) => {
      const k = into.length;
      const own = new KvCache(k * heads, headSize, n);
      const theirs = rank.padsOf(prompts, k, n, n);
      try {
        const logits = await rank.pass(`ep/${passes++}`, prompts, k, n, 0, own, theirs);
        kv.put(into, own, heads);
        padInto(into, theirs);
        return logits;
      } finally {
        own.dispose();
      }
    },
    keep: (kept) => {
      kv.keep(kept, heads);
      held = kept.length;
      if (pads) pads = Int32Array.from(kept, (r) => pads![r]!);
    },
    stash: (which) => {
      const cache = kv.take(which, heads);
      return { rows: which.length, cache, ...(pads ? { pads: Int32Array.from(which, (r) => pads![r]!) } : {}), dispose: () => cache.dispose() };
    },
    restore: (into, stash) => {
      kv.put(into, stash.cache, heads);
      padInto(into, stash.pads);
    },
    logprobs: (tokens, k, promptLen, eos) => rank.logprobs(`ep/${passes++}`, tokens, k, promptLen, eos),
    switchTo(next) {
      if (next.heads !== heads || next.headSize !== headSize)
        throw new Error(`a decoding session of ${heads} heads of ${headSize} cannot go on with a rank of ${next.heads} heads of ${next.headSize}`);
      rank.closed();
      rank = next;
    },
    async recompute(into, sequences) {
      const byLength = new Map<number, number[]>();
      sequences.forEach((seq, j) => byLength.set(seq.length, [...(byLength.get(seq.length) ?? []), j]));
      for (const [n, js] of [...byLength].sort((a, b) => a[0] - b[0])) {
        const tokens = new Int32Array(js.length * n);
        js.forEach((j, i) => tokens.set(sequences[j]!, i * n));
        await dec.prefill(
          Int32Array.from(js, (j) => into[j]!),
          tokens,
          n,
        );
      }
    },
    dispose: () => {
      if (!open) return;
      open = false;
      kv.dispose();
      rank.closed();
    },
  };
  return dec;
}
