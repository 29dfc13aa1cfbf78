// The ledger: which rollouts a trained shard's parameters have taken in. Each training call
// appends an entry on the device (engine/device.ts); the entries travel with the shard's state
// through checkpoints and restores, so at the end of a run, however many recoveries it went
// through, they say whether every prompt was trained on exactly once.
import { createHash } from 'node:crypto';
import type { LedgerEntry } from '../../mesh/wire/index.ts';

export interface RolloutAccount {
  /** Prompts the run generated (iterations × batch) per trained model. */
  prompts: number;
  /** Prompts some trained shard never took in (or took in from a different rollout). */
  lost: number;
  /** Prompts some trained shard took in more than once. */
  duplicated: number;
}

/**
 * Counts, from the trained shards' ledgers, the prompts of each rollout that were trained on
 * exactly once. A prompt is lost when some rank of a trained model never took its iteration in
 * (or took in other tokens than the rollout's), duplicated when some rank took it in twice.
 */
export function accountRollouts(ledgers: Record<string, LedgerEntry[][]>, rollouts: ReadonlyArray<{ iteration: number; rows: number; sha256: string; version?: number }>): RolloutAccount {
  let lost = 0;
  let duplicated = 0;
  let prompts = 0;
  for (const ranks of Object.values(ledgers)) {
    for (const ro of rollouts) {
      prompts += ro.rows;
      const counts = ranks.map((ledger) => ledger.filter((e) => e.iteration === ro.iteration && e.sha256 === ro.sha256 && e.rows === ro.rows && e.version === ro.version).length);
      if (counts.some((c) => c === 0)) lost += ro.rows;
      else if (counts.some((c) => c > 1)) duplicated += ro.rows;
    }
  }
  return { prompts, lost, duplicated };
}

/** The SHA-256 a ledger entry holds for a rollout's tokens. */
export function tokensDigest(tokens: Int32Array): string {
  return createHash('sha256')
    .update(new Uint8Array(tokens.buffer, tokens.byteOffset, tokens.byteLength))
    .digest('hex');
}
