// Digests on the bus name their algorithm: BLAKE3 as written since protocol version 7, and a
// SHA-256 alone (64 hex digits, as version 6 and earlier wrote it) still reads as SHA-256 and
// verifies.
import { describe, expect, it } from 'vitest';
import { createHash } from 'node:crypto';
import { ALGORITHM_NAMES, BUS_DIGEST, digestAlgorithm, digestMismatch, digestOf, hasher, parseDigest, rawDigest, sameDigest, shortDigest } from './digest.ts';
import { Assembler, BadChunkError, BLOCK, blockDigests, chunksOf, listDigest, manifestOf, modelDigest, stateDigest, tensorDigest, type NamedTensor } from './chunks.ts';
import { PROTOCOL_VERSION, type Chunk } from '../messages/protocol.ts';

/** The reference test vectors' input: `n` bytes of 0, 1, …, 250, 0, 1, … */
const input = (n: number) => Uint8Array.from({ length: n }, (_, i) => i % 251);
const sha256 = (b: Uint8Array) => createHash('sha256').update(b).digest('hex');

describe('BLAKE3', () => {
  it("matches the reference test vectors (BLAKE3's test_vectors.json, the first 32 bytes of each hash)", () => {
    const vectors: Array<[number, string]> = [
      [0, 'af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262'],
      [1, '2d3adedff11b61f14c886e35afa036736dcd87a74d27b5c1510225d0f592e213'],
      [1023, '10108970eeda3eb932baac1428c7a2163b0e924c9a9e25b35bba72b28f70bd11'],
      [1024, '42214739f095a406f3fc83deb889744ac00df831c10daa55189b5d121c855af7'],
      [1025, 'd00278ae47eb27b34faecf67b4fe263f82d5412916c1ffd97c8cb7fb814b8444'],
      [102400, 'bc3e3d41a1146b069abffad3c0d44860cf664390afce4d9661f7902e7943e085'],
    ];
    for (const [n, hex] of vectors) {
      expect(digestOf(input(n)), `${n} bytes`).toBe(`blake3:${hex}`);
      expect(rawDigest(input(n)).toString('hex')).toBe(hex);
      // Streamed in two pieces, the same.
      expect(
        hasher()
          .update(input(n).subarray(0, n >> 1))
          .update(input(n).subarray(n >> 1))
          .digest(),
      ).toBe(`blake3:${hex}`);
    }
    expect(BUS_DIGEST).toBe('blake3');
  });

  it('hashes exactly the bytes of a view (an offset into a larger buffer, a Float32Array), not its buffer', () => {
    const big = input(3 * BLOCK * 4 + 7);
    const view = big.subarray(5, 5 + BLOCK * 4 + 3);
    expect(digestOf(view)).toBe(digestOf(Uint8Array.from(view)));
    const floats = new Float32Array(big.buffer, 4, BLOCK + 9);
    expect(digestOf(floats)).toBe(digestOf(Uint8Array.from(new Uint8Array(big.buffer, 4, (BLOCK + 9) * 4))));
    expect(blockDigests(floats).map((d) => d.toString('hex'))).toEqual([
      rawDigest(Uint8Array.from(new Uint8Array(big.buffer, 4, BLOCK * 4))).toString('hex'),
      rawDigest(Uint8Array.from(new Uint8Array(big.buffer, 4 + BLOCK * 4, 36))).toString('hex'),
    ]);
  });
});

describe('a digest names its algorithm', () => {
  it('reads blake3:<hex> and sha256:<hex>, 64 hex digits alone as SHA-256 (version 6), and nothing else', () => {
    const hex = 'ab'.repeat(32);
    expect(parseDigest(`blake3:${hex}`)).toEqual({ algorithm: 'blake3', hex });
    expect(parseDigest(`sha256:${hex}`)).toEqual({ algorithm: 'sha256', hex });
    expect(parseDigest(hex)).toEqual({ algorithm: 'sha256', hex });
    for (const bad of ['', 'x', `md5:${hex}`, `blake3:${hex}0`, `BLAKE3:${hex}`, hex.toUpperCase(), `blake3:${hex.slice(1)}`]) expect(parseDigest(bad), bad).toBeUndefined();
    expect(digestAlgorithm(hex)).toBe('sha256');
    expect(sameDigest(hex, `sha256:${hex}`)).toBe(true);
    expect(sameDigest(`blake3:${hex}`, `sha256:${hex}`)).toBe(false);
    expect(sameDigest('x', 'x')).toBe(false);
    expect(shortDigest(`blake3:${hex}`)).toBe(`BLAKE3 ${hex.slice(0, 12)}…`);
    expect(shortDigest(hex)).toBe(`SHA-256 ${hex.slice(0, 12)}…`);
    expect(ALGORITHM_NAMES).toEqual({ blake3: 'BLAKE3', sha256: 'SHA-256' });
  });

  it("checks bytes in the algorithm the record names: an old record's SHA-256 (no tag) verifies; a changed byte is caught in that algorithm", () => {
    const bytes = input(100_000);
    const old = sha256(bytes);
    expect(digestMismatch(bytes, old)).toBeUndefined();
    expect(digestMismatch(bytes, `sha256:${old}`)).toBeUndefined();
    expect(digestMismatch(bytes, digestOf(bytes))).toBeUndefined();
    const changed = Uint8Array.from(bytes);
    changed[77_777]! ^= 1;
    expect(digestMismatch(changed, old)).toBe(`sha256:${sha256(changed)}`);
    expect(digestMismatch(changed, digestOf(bytes))).toBe(digestOf(changed));
    // A string that is no digest never matches; the bytes' digest is then BLAKE3's.
    expect(digestMismatch(bytes, 'x')).toBe(digestOf(bytes));
  });

  it('model and state digests are BLAKE3, tagged, and as SHA-256 when asked (what an old record holds)', () => {
    const tensors: NamedTensor[] = [{ name: 'w', shape: [2, 3], data: Float32Array.from([1, 2, 3, 4, 5, 6]) }];
    const h = createHash('sha256').update('w:2x3;').update(new Uint8Array(tensors[0]!.data.buffer)).digest('hex');
    expect(modelDigest(tensors, 'sha256')).toBe(`sha256:${h}`);
    expect(modelDigest(tensors)).toBe(hasher().update('w:2x3;').update(new Uint8Array(tensors[0]!.data.buffer)).digest());
    expect(modelDigest(tensors)).toMatch(/^blake3:[0-9a-f]{64}$/);
    expect(stateDigest({ tensors })).toMatch(/^blake3:[0-9a-f]{64}$/);
    expect(stateDigest({ tensors }, 'sha256')).toMatch(/^sha256:[0-9a-f]{64}$/);
  });
});

describe('chunks check in the algorithm their digest names', () => {
  const t: NamedTensor = { name: 'w', shape: [2 * BLOCK + 5], data: Float32Array.from({ length: 2 * BLOCK + 5 }, (_, i) => Math.sin(i)) };
  /** Chunks of `t` as protocol version 6 cut them: SHA-256 of SHA-256s, 64 hex digits alone. */
  const oldChunks = (): Chunk[] =>
    [...chunksOf('t', [t], 2 * BLOCK * 4 + 1024)].map((c) => ({
      ...c,
      digest: listDigest(blockDigests(c.data, 'sha256'), 'sha256').slice('sha256:'.length),
      whole: tensorDigest(t.data, 'sha256').slice('sha256:'.length),
    }));

  it('a manifest of SHA-256 digests (no tag) takes SHA-256 chunks and verifies the tensor', () => {
    const asm = new Assembler('t', [{ name: 'w', shape: t.shape, digest: tensorDigest(t.data, 'sha256').slice('sha256:'.length) }]);
    for (const c of oldChunks()) asm.accept(c);
    expect(asm.finish()[0]!.data).toEqual(t.data);
  });

  it("refuses a chunk whose digest names another algorithm than its tensor's, or none, saying which", () => {
    const asm = new Assembler('t', manifestOf([t]));
    const e = (() => {
      try {
        asm.accept(oldChunks()[0]!);
      } catch (err) {
        return err as Error;
      }
    })();
    expect(e).toBeInstanceOf(BadChunkError);
    expect(e!.message).toBe("transfer t, tensor 'w' at offset 0: chunk digest is SHA-256; this tensor's digests are BLAKE3");
    const [c] = [...chunksOf('t', [t], 2 * BLOCK * 4 + 1024)];
    expect(() => asm.accept({ ...c!, digest: 'md5:00' })).toThrow(/chunk digest "md5:00" names no algorithm this receiver knows/);
    // Without a manifest, a receiver takes this protocol's (BLAKE3) chunks only.
    const bare = new Assembler('t', [{ name: 'w', shape: t.shape }]);
    expect(() => bare.accept(oldChunks()[0]!)).toThrow(/chunk digest is SHA-256; this tensor's digests are BLAKE3/);
    for (const k of chunksOf('t', [t], 2 * BLOCK * 4 + 1024)) bare.accept(k);
    expect(bare.finish()[0]!.data).toEqual(t.data);
    expect(c!.v).toBe(PROTOCOL_VERSION);
    expect(c!.digest).toMatch(/^blake3:/);
  });
});
