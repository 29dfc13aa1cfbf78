// --replay compares digests of the same algorithm only: a run recorded before protocol version 7
// (its summary's digests SHA-256, 64 hex digits alone) is refused, naming the algorithm.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { replayOf, replayVerdict } from './replay.ts';

const dir = mkdtempSync(join(tmpdir(), 'ferry-replay-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function run(name: string, digests: Record<string, string>): string {
  const at = join(dir, name);
  mkdirSync(at, { recursive: true });
  writeFileSync(join(at, 'scenario.json'), JSON.stringify({ rl: { iterations: 4, staleness: 1 } }));
  writeFileSync(join(at, 'summary.json'), JSON.stringify({ status: 'succeeded', digests, staleness: { versions: [0, 0, 1, 2] } }));
  return at;
}

describe('--replay and digests', () => {
  it("refuses a run whose summary's digests are SHA-256 (an earlier ferry's), naming the algorithm and the model", async () => {
    const old = run('old', { actor: 'ab'.repeat(32), critic: 'cd'.repeat(32) });
    await expect(replayOf(old, join(dir, 'out-old'))).rejects.toThrow(
      /--replay: .*summary\.json records its models' digests in SHA-256 \(actor: SHA-256 abababababab…; critic: SHA-256 cdcdcdcdcdcd…\), not in BLAKE3, which this ferry writes \(since protocol version 7; SHA-256 before\): a replay's digests could never equal them/,
    );
  });

  it("takes a run of this version's digests (BLAKE3), and compares them whole", () => {
    const a = `blake3:${'12'.repeat(32)}`;
    const b = `blake3:${'34'.repeat(32)}`;
    expect(replayVerdict({ actor: a }, { actor: a })).toEqual({ equal: true, lines: ['actor: equal (BLAKE3 121212121212…)'] });
    expect(replayVerdict({ actor: a }, { actor: b })).toEqual({ equal: false, lines: ['actor: DIFFERENT: recorded BLAKE3 121212121212…, replayed BLAKE3 343434343434…'] });
    // The same hex in another algorithm is not the same digest.
    expect(replayVerdict({ actor: a }, { actor: `sha256:${'12'.repeat(32)}` }).equal).toBe(false);
  });
});
