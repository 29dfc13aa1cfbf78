import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import type { LedgerEntry } from '../../mesh/wire/messages/protocol.ts';
import { accountRollouts, tokensDigest } from './ledger.ts';

const ROWS = 8;
const tokensOf = (iteration: number) => Int32Array.from({ length: ROWS * 6 }, (_, i) => (i * 7 + iteration * 13) % 10);
const rollouts = [0, 1, 2].map((iteration) => ({ iteration, rows: ROWS, sha256: tokensDigest(tokensOf(iteration)) }));
const entry = (iteration: number): LedgerEntry => ({ ...rollouts[iteration]! });
/** A rank that took in every rollout once. */
const complete = (): LedgerEntry[] => rollouts.map((ro) => entry(ro.iteration));

describe('accountRollouts', () => {
  it('finds nothing lost or duplicated when every rank took in each rollout once', () => {
    const ledgers = { actor: [complete(), complete()], critic: [complete(), complete()] };
    expect(accountRollouts(ledgers, rollouts)).toEqual({ prompts: 3 * ROWS * 2, lost: 0, duplicated: 0 });
  });

  it('does not depend on the order of a ledger', () => {
    const ledgers = { actor: [complete().reverse()], critic: [[entry(1), entry(2), entry(0)]] };
    expect(accountRollouts(ledgers, rollouts)).toEqual({ prompts: 3 * ROWS * 2, lost: 0, duplicated: 0 });
  });

  it('counts an iteration a rank missed as lost, once per model', () => {
    const missing = [entry(0), entry(2)];
    expect(accountRollouts({ actor: [complete(), missing], critic: [complete()] }, rollouts)).toEqual({ prompts: 48, lost: ROWS, duplicated: 0 });
    // Both models missing it: lost for each.
    expect(accountRollouts({ actor: [missing], critic: [missing, missing] }, rollouts)).toEqual({ prompts: 48, lost: 2 * ROWS, duplicated: 0 });
    // A rank with an empty ledger lost everything.
    expect(accountRollouts({ actor: [complete(), []] }, rollouts)).toEqual({ prompts: 24, lost: 3 * ROWS, duplicated: 0 });
  });

  it('counts an entry for other tokens as lost', () => {
    const other = tokensDigest(Int32Array.from([9, 9, 9]));
    const wrong = [entry(0), { iteration: 1, rows: ROWS, sha256: other }, entry(2)];
    expect(accountRollouts({ actor: [complete(), wrong] }, rollouts)).toEqual({ prompts: 24, lost: ROWS, duplicated: 0 });
  });

  it('counts an entry with another number of rows as lost', () => {
    const partial = [entry(0), { ...entry(1), rows: ROWS / 2 }, entry(2)];
    expect(accountRollouts({ actor: [partial] }, rollouts)).toEqual({ prompts: 24, lost: ROWS, duplicated: 0 });
  });

  it('counts an iteration a rank took in twice as duplicated', () => {
    const twice = [...complete(), entry(1)];
    expect(accountRollouts({ actor: [complete(), twice], critic: [complete()] }, rollouts)).toEqual({ prompts: 48, lost: 0, duplicated: ROWS });
    const thrice = [...complete(), entry(2), entry(2), entry(0)];
    expect(accountRollouts({ critic: [thrice] }, rollouts)).toEqual({ prompts: 24, lost: 0, duplicated: 2 * ROWS });
  });

  it('counts an iteration as lost, not duplicated, when one rank missed it and another took it twice', () => {
    const ledgers = {
      actor: [
        [entry(0), entry(2)],
        [...complete(), entry(1)],
      ],
    };
    expect(accountRollouts(ledgers, rollouts)).toEqual({ prompts: 24, lost: ROWS, duplicated: 0 });
  });

  it('ignores entries for iterations that are not among the rollouts', () => {
    const extra = [...complete(), { iteration: 7, rows: ROWS, sha256: rollouts[0]!.sha256 }];
    expect(accountRollouts({ actor: [extra] }, rollouts)).toEqual({ prompts: 24, lost: 0, duplicated: 0 });
  });

  it('counts rows per rollout, whatever their number', () => {
    const uneven = [
      { iteration: 0, rows: 5, sha256: 'a' },
      { iteration: 1, rows: 3, sha256: 'b' },
    ];
    expect(accountRollouts({ actor: [[{ iteration: 0, rows: 5, sha256: 'a' }]] }, uneven)).toEqual({ prompts: 8, lost: 3, duplicated: 0 });
  });

  it('has nothing to count without ledgers or rollouts', () => {
    expect(accountRollouts({}, rollouts)).toEqual({ prompts: 0, lost: 0, duplicated: 0 });
    expect(accountRollouts({ actor: [complete()] }, [])).toEqual({ prompts: 0, lost: 0, duplicated: 0 });
  });
});

describe('tokensDigest', () => {
  it("is the SHA-256 of the tokens' bytes, in hex", () => {
    const tokens = Int32Array.from([1, 2, 3, -4]);
    const expected = createHash('sha256').update(Buffer.from(tokens.buffer)).digest('hex');
    expect(tokensDigest(tokens)).toBe(expected);
    expect(tokensDigest(tokens)).toMatch(/^[0-9a-f]{64}$/);
  });

  it('is equal for equal tokens and differs for different ones', () => {
    expect(tokensDigest(Int32Array.from([5, 6, 7]))).toBe(tokensDigest(Int32Array.from([5, 6, 7])));
    expect(tokensDigest(Int32Array.from([5, 6, 7]))).not.toBe(tokensDigest(Int32Array.from([5, 6, 8])));
    expect(tokensDigest(Int32Array.from([5, 6, 7]))).not.toBe(tokensDigest(Int32Array.from([5, 6])));
    expect(tokensDigest(Int32Array.from([5, 6, 7]))).not.toBe(tokensDigest(Int32Array.from([7, 6, 5])));
    expect(tokensDigest(new Int32Array(0))).toBe(createHash('sha256').digest('hex'));
  });

  it('hashes only the bytes a subarray views', () => {
    const whole = Int32Array.from([100, 1, 2, 3, 200, 300]);
    const view = whole.subarray(1, 4);
    expect(view.byteOffset).toBe(4);
    expect(tokensDigest(view)).toBe(tokensDigest(Int32Array.from([1, 2, 3])));
    expect(tokensDigest(view)).toBe(tokensDigest(view.slice()));
    expect(tokensDigest(view)).not.toBe(tokensDigest(whole));
    expect(tokensDigest(whole.subarray(2, 5))).toBe(tokensDigest(Int32Array.from([2, 3, 200])));
  });
});
