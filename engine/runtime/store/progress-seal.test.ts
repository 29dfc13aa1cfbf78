// The run store's progress records are sealed: a 4-byte mark naming the digest's algorithm, the
// digest, the record. FSP2 (BLAKE3) is written; FSP1 (SHA-256), as protocol version 6 and
// earlier sealed them, still unseals and verifies.
import { describe, expect, it } from 'vitest';
import { createHash } from 'node:crypto';
import { blake3 } from '@napi-rs/blake-hash';
import { sealProgress, unsealProgress } from './jetstream-store.ts';

const record = Uint8Array.from({ length: 300 }, (_, i) => (i * 7) & 0xff);
const mark = (s: string) => new TextEncoder().encode(s);
const sealed = (m: string, digest: Uint8Array) => Uint8Array.from([...mark(m), ...digest, ...record]);

describe('sealed progress records', () => {
  it('are written FSP2, BLAKE3 of the record before it', () => {
    const out = sealProgress(record);
    expect(out).toEqual(sealed('FSP2', blake3(Buffer.from(record))));
    expect(unsealProgress('kv', out)).toEqual(record);
  });

  it("an old record's FSP1 seal (SHA-256) still verifies; a seal that does not match its mark's algorithm is refused", () => {
    const old = sealed('FSP1', createHash('sha256').update(record).digest());
    expect(unsealProgress('kv', old)).toEqual(record);
    // A BLAKE3 digest under the SHA-256 mark, and the other way round.
    expect(() => unsealProgress('kv', sealed('FSP1', blake3(Buffer.from(record))))).toThrow(/its seal does not match its contents/);
    expect(() => unsealProgress('kv', sealed('FSP2', createHash('sha256').update(record).digest()))).toThrow(/its seal does not match its contents/);
    const changed = Uint8Array.from(old);
    changed[100]! ^= 1;
    expect(() => unsealProgress('kv', changed)).toThrow(/its seal does not match its contents/);
    expect(() => unsealProgress('kv', sealed('FSP9', new Uint8Array(32)))).toThrow(/not a sealed progress record \(336 bytes\)/);
    expect(() => unsealProgress('kv', mark('FSP2'))).toThrow(/not a sealed progress record \(4 bytes\)/);
  });
});
