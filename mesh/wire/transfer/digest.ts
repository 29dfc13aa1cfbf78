// Digests of the bytes that travel on the bus (chunks, shards, snapshots), each naming its
// algorithm: `blake3:<64 hex>`. BLAKE3 (through @napi-rs/blake-hash, a native build from npm)
// hashes about three times as fast as node's SHA-256 on these machines (about 6 GB/s against 2
// over 64 KiB blocks), and every byte of a transfer is hashed by its sender and by its receiver.
// A digest that names no algorithm (64 hex digits alone) is SHA-256: what protocol version 6 and
// earlier wrote, so a record of theirs still reads as what it is. SHA-256 stays where others read
// the digest (the object store's `SHA-256=` metadata that `nats object get` checks) and where a
// digest names a file or tokens rather than bytes on the bus (loss modules, the shards' ledgers).
import { createHash } from 'node:crypto';
import { Blake3Hasher, blake3 } from '@napi-rs/blake-hash';

export const DIGEST_ALGORITHMS = ['blake3', 'sha256'] as const;
export type DigestAlgorithm = (typeof DIGEST_ALGORITHMS)[number];

/** The algorithm of every digest this protocol writes on the chunk path (chunks, manifests, shards, snapshots, states). */
export const BUS_DIGEST: DigestAlgorithm = 'blake3';

/** How people write each algorithm's name. */
export const ALGORITHM_NAMES: Record<DigestAlgorithm, string> = { blake3: 'BLAKE3', sha256: 'SHA-256' };

/** Bytes of a typed array, as a view (no copy). */
export const bytesOf = (data: Float32Array | Uint8Array): Uint8Array => (data instanceof Uint8Array ? data : new Uint8Array(data.buffer, data.byteOffset, data.byteLength));

/** The same bytes as a Buffer (a view, no copy): what the native BLAKE3 takes. */
const bufferOf = (bytes: Uint8Array): Buffer => (Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength));

/** The raw digest (32 bytes) of `data`'s bytes. */
export function rawDigest(data: Float32Array | Uint8Array, algorithm: DigestAlgorithm = BUS_DIGEST): Buffer {
  const bytes = bytesOf(data);
  return algorithm === 'blake3' ? blake3(bufferOf(bytes)) : createHash('sha256').update(bytes).digest();
}

/** A raw digest as ferry writes it: `<algorithm>:<hex>`. */
export const tagged = (algorithm: DigestAlgorithm, raw: Uint8Array): string => `${algorithm}:${Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength).toString('hex')}`;

/** The digest of `data`'s bytes (exactly the view's, not its whole buffer), naming its algorithm. */
export function digestOf(data: Float32Array | Uint8Array, algorithm: DigestAlgorithm = BUS_DIGEST): string {
  return tagged(algorithm, rawDigest(data, algorithm));
}

/** A digest of several pieces in turn: `update` each, then `digest` (naming its algorithm) once. */
export interface Hasher {
  update(piece: string | Uint8Array): Hasher;
  digest(): string;
}

export function hasher(algorithm: DigestAlgorithm = BUS_DIGEST): Hasher {
  if (algorithm === 'sha256') {
    const h = createHash('sha256');
    const self: Hasher = { update: (p) => (h.update(p), self), digest: () => tagged('sha256', h.digest()) };
    return self;
  }
  const h = new Blake3Hasher();
  const self: Hasher = { update: (p) => (h.update(typeof p === 'string' ? p : bufferOf(p)), self), digest: () => tagged('blake3', h.digestBuffer()) };
  return self;
}

const TAGGED = /^(blake3|sha256):([0-9a-f]{64})$/;
const LEGACY = /^[0-9a-f]{64}$/;

/**
 * What a digest string says: its algorithm and hex; 64 hex digits alone are SHA-256 (protocol
 * version 6 and earlier). Undefined for anything else.
 */
export function parseDigest(digest: string): { algorithm: DigestAlgorithm; hex: string } | undefined {
  const t = TAGGED.exec(digest);
  if (t) return { algorithm: t[1] as DigestAlgorithm, hex: t[2]! };
  return LEGACY.test(digest) ? { algorithm: 'sha256', hex: digest } : undefined;
}

/** The algorithm a digest names (SHA-256 for an untagged one), or undefined for a string that is not a digest. */
export const digestAlgorithm = (digest: string): DigestAlgorithm | undefined => parseDigest(digest)?.algorithm;

/** Whether two digest strings say the same digest (an untagged one read as SHA-256). */
export function sameDigest(a: string, b: string): boolean {
  const x = parseDigest(a);
  const y = parseDigest(b);
  return x !== undefined && y !== undefined && x.algorithm === y.algorithm && x.hex === y.hex;
}

/**
 * Checks `data` against `expected` in the algorithm `expected` names. Returns undefined where it
 * matches, else the bytes' digest in that algorithm, for a message; a string that is not a digest
 * never matches (the bytes' digest is then BUS_DIGEST's).
 */
export function digestMismatch(data: Float32Array | Uint8Array, expected: string): string | undefined {
  const want = parseDigest(expected);
  if (!want) return digestOf(data);
  const raw = rawDigest(data, want.algorithm);
  return raw.toString('hex') === want.hex ? undefined : tagged(want.algorithm, raw);
}

/** A digest shortened for a message: its algorithm's name and the first 12 hex digits. */
export function shortDigest(digest: string): string {
  const d = parseDigest(digest);
  return d ? `${ALGORITHM_NAMES[d.algorithm]} ${d.hex.slice(0, 12)}…` : JSON.stringify(digest.slice(0, 24));
}
