import { describe, it, expect } from 'vitest';
import { createHash } from 'node:crypto';
import { blake3 } from '@napi-rs/blake-hash';
import { decode, encode } from '../messages/codec.ts';
import { Chunk, PROTOCOL_VERSION } from '../messages/protocol.ts';
import {
  Assembler,
  BadChunkError,
  BLOCK,
  FLUSH_EVERY,
  pacer,
  TransferError,
  blockDigests,
  chunkElements,
  chunksOf,
  listDigest,
  manifestOf,
  modelDigest,
  digestOf,
  tensorDigest,
  type NamedTensor,
} from './transfer.ts';
import type { Bus } from '../bus/bus.ts';
import { FramePool } from './frames.ts';

/** Deterministic, non-trivial float data (no two neighbours equal). */
function tensor(name: string, shape: number[], salt = 0): NamedTensor {
  const size = shape.reduce((a, b) => a * b, 1);
  const data = new Float32Array(size);
  for (let i = 0; i < size; i++) data[i] = Math.sin(i * 1.37 + salt) * 100 + i / 7;
  return { name, shape, data };
}

const bits = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString('hex');

/** Flips the lowest mantissa bit of element i of a copy. */
function flipBit(data: Float32Array, i: number): Float32Array {
  const copy = data.slice();
  new Uint32Array(copy.buffer)[i]! ^= 1;
  return copy;
}

function rejection(fn: () => unknown): TransferError {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(TransferError);
    return e as TransferError;
  }
  throw new Error('expected a TransferError');
}

/** Bytes in one hashed block: 16384 float32 elements × 4 bytes = 64 KiB. */
const BLOCK_BYTES = 64 * 1024;
/** Max payloads: 1024 bytes of room for the chunk's other fields, plus whole 64 KiB blocks. */
const ONE_BLOCK = BLOCK_BYTES + 1024; // 66560: exactly 1 block (16384 elements) per chunk
const TWO_BLOCKS = 2 * BLOCK_BYTES + 1024; // 132096: 2 blocks (32768 elements) per chunk
const FOUR_BLOCKS = 256 * 1024 + 1024; // 263168: 4 blocks (65536 elements) per chunk

/** Raw BLAKE3 of some bytes, by hand (the package itself, not ferry's digest module; a copy, not a view). */
const H = (bytes: Uint8Array): Buffer => blake3(Buffer.from(bytes));
/** A raw BLAKE3 as ferry writes it. */
const B3 = (raw: Buffer): string => `blake3:${raw.toString('hex')}`;

/**
 * The digest scheme computed independently of the module: BLAKE3 over the concatenation of the
 * raw BLAKE3s of consecutive 64 KiB slices of the bytes (the last slice may be shorter; no bytes
 * at all count as one empty slice), written `blake3:<hex>`.
 */
function byHand(data: Float32Array): string {
  const bytes = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  const digests: Buffer[] = [];
  for (let o = 0; o < bytes.length; o += BLOCK_BYTES) digests.push(H(bytes.subarray(o, o + BLOCK_BYTES)));
  if (digests.length === 0) digests.push(H(new Uint8Array(0)));
  return B3(H(Buffer.concat(digests)));
}

// wte: 41 × 2048 = 83968 elements = 5 blocks + 2048; wq: 131 × 131 = 17161 = 1 block + 777; head.b: 5.
const model = (): NamedTensor[] => [tensor('wte', [41, 2048]), tensor('h0.attn.wq', [131, 131], 1), tensor('head.b', [5], 2)];

describe('digestOf', () => {
  it('hashes exactly the bytes of a view, not its whole buffer', () => {
    const whole = new Float32Array([1, 2, 3, 4]);
    const view = whole.subarray(1, 3);
    const expected = B3(blake3(Buffer.from(new Float32Array([2, 3]).buffer)));
    expect(digestOf(view)).toBe(expected);
    expect(digestOf(view, 'sha256')).toBe(
      `sha256:${createHash('sha256')
        .update(Buffer.from(new Float32Array([2, 3]).buffer))
        .digest('hex')}`,
    );
  });
});

describe('tensorDigest', () => {
  it('is BLAKE3 over the raw BLAKE3s of the 64 KiB blocks, computed by hand', () => {
    expect(BLOCK).toBe(16384); // 16384 float32 = 65536 bytes
    // 3 full blocks and 123 elements more, as a view into a larger buffer (one element each side).
    const n = 3 * 16384 + 123;
    const data = tensor('x', [n + 2]).data.subarray(1, n + 1);
    const bytes = Buffer.from(data.buffer, data.byteOffset, data.byteLength); // 49275 × 4 = 197100 bytes
    // Blocks are bytes [0, 65536), [65536, 131072), [131072, 196608), [196608, 197100).
    const d0 = H(bytes.subarray(0, 65536));
    const d1 = H(bytes.subarray(65536, 131072));
    const d2 = H(bytes.subarray(131072, 196608));
    const d3 = H(bytes.subarray(196608, 197100));
    const expected = B3(H(Buffer.concat([d0, d1, d2, d3])));
    expect(blockDigests(data)).toEqual([d0, d1, d2, d3]);
    expect(tensorDigest(data)).toBe(expected);
    expect(listDigest([d0, d1, d2, d3])).toBe(expected);
    // Not the plain BLAKE3 of the bytes.
    expect(tensorDigest(data)).not.toBe(digestOf(data));
    // The same scheme in SHA-256 (protocol version 6's), when asked, naming it.
    const s = (b: Uint8Array) => createHash('sha256').update(b).digest();
    const blocks = [s(bytes.subarray(0, 65536)), s(bytes.subarray(65536, 131072)), s(bytes.subarray(131072, 196608)), s(bytes.subarray(196608))];
    expect(tensorDigest(data, 'sha256')).toBe(`sha256:${s(Buffer.concat(blocks)).toString('hex')}`);
  });

  it('a tensor of exactly whole blocks has no trailing empty block', () => {
    // 2 × 16384 elements = bytes [0, 65536) and [65536, 131072): two digests, nothing after.
    const data = tensor('x', [2 * 16384]).data;
    const bytes = Buffer.from(data.buffer);
    const expected = B3(H(Buffer.concat([H(bytes.subarray(0, 65536)), H(bytes.subarray(65536, 131072))])));
    expect(blockDigests(data)).toHaveLength(2);
    expect(tensorDigest(data)).toBe(expected);
  });

  it('an empty tensor is one empty block: BLAKE3 of BLAKE3("")', () => {
    // BLAKE3("") = af1349b9…3262 (the reference test vector); BLAKE3 of those 32 raw bytes = 82878ed8…c227.
    expect(tensorDigest(new Float32Array(0))).toBe('blake3:82878ed8a480ee41775636820e05a934ca5c747223ca64306658ee5982e6c227');
    // Protocol version 6's, in SHA-256: SHA-256 of SHA-256("") (e3b0c442…b855) = 5df6e0e2…9456.
    expect(tensorDigest(new Float32Array(0), 'sha256')).toBe('sha256:5df6e0e2761359d30a8275058e299fcc0381534545f55cf43e41983f5d4c9456');
  });
});

describe('chunkElements', () => {
  it('leaves 1024 bytes of room and counts whole blocks of 16384 4-byte elements', () => {
    // (66560 − 1024) / 65536 = 1 block = 16384 elements
    expect(chunkElements(ONE_BLOCK)).toBe(16384);
    // (132095 − 1024) / 65536 = 1.99… → 1 block: never part of a block
    expect(chunkElements(TWO_BLOCKS - 1)).toBe(16384);
    expect(chunkElements(TWO_BLOCKS)).toBe(32768);
    expect(chunkElements(FOUR_BLOCKS)).toBe(65536);
    // (1 MiB − 1024) / 65536 = 15.98 → 15 blocks = 245760 elements
    expect(chunkElements(1 << 20)).toBe(245760);
  });

  it('refuses a payload with no room for one block', () => {
    // 66559 − 1024 = 65535 bytes < one 64 KiB block
    expect(() => chunkElements(ONE_BLOCK - 1)).toThrow(TransferError);
    expect(() => chunkElements(ONE_BLOCK - 1)).toThrow(/max payload 66559 is too small for one block of 65536 bytes/);
    expect(() => chunkElements(1024)).toThrow(TransferError);
  });
});

describe('chunksOf', () => {
  it('every encoded chunk fits the max payload it was cut for', () => {
    // wte: 33 × 4096 = 135168 elements = 8 blocks + 4096; wpe: 16 × 4096 = 65536 = 4 blocks;
    // lnf.g: 1000, less than a block. (400000 − 1024) / 65536 = 6.09 → 6 blocks per chunk.
    const tensors = [tensor('wte', [33, 4096]), tensor('wpe', [16, 4096]), tensor('lnf.g', [1000])];
    for (const chunkBytes of [ONE_BLOCK, ONE_BLOCK + 100, TWO_BLOCKS, FOUR_BLOCKS, 400_000]) {
      let n = 0;
      for (const chunk of chunksOf('xfer-123456', tensors, chunkBytes)) {
        expect(encode(chunk).length).toBeLessThanOrEqual(chunkBytes);
        n += 1;
      }
      expect(n).toBeGreaterThan(0);
    }
  });

  it('cuts tensors in order, at offsets of chunkElements, with the right totals and digests', () => {
    const tensors = [tensor('a', [5 * 16384 + 100]), tensor('b', [32768], 1), tensor('c', [1], 2)];
    const chunks = [...chunksOf('t1', tensors, TWO_BLOCKS)]; // 32768 elements (2 blocks) per chunk
    // a: 82020 = 32768 + 32768 + 16484 → 3 chunks; b: exactly 1 chunk; c: 1 chunk
    expect(chunks.map((c) => [c.tensor, c.offset, c.data.length, c.total])).toEqual([
      ['a', 0, 32768, 82020],
      ['a', 32768, 32768, 82020],
      ['a', 65536, 16484, 82020],
      ['b', 0, 32768, 32768],
      ['c', 0, 1, 1],
    ]);
    for (const c of chunks) {
      const t = tensors.find((x) => x.name === c.tensor)!;
      expect(c.type).toBe('chunk');
      expect(c.v).toBe(PROTOCOL_VERSION);
      expect(c.transfer).toBe('t1');
      expect(bits(c.data)).toBe(bits(t.data.subarray(c.offset, c.offset + c.data.length)));
      // A chunk's digest: BLAKE3 over its blocks' BLAKE3s, by the module and by hand.
      expect(c.digest).toBe(listDigest(blockDigests(c.data)));
      expect(c.digest).toBe(byHand(c.data));
      // Every chunk carries its tensor's digest.
      expect(c.whole).toBe(tensorDigest(t.data));
      expect(c.whole).toBe(byHand(t.data));
    }
    // The last chunk of a, by hand: one full block (bytes [0, 65536)) and 100 elements (400 bytes).
    const last = Buffer.from(chunks[2]!.data.buffer, chunks[2]!.data.byteOffset, chunks[2]!.data.byteLength);
    expect(last.length).toBe(65536 + 400);
    expect(chunks[2]!.digest).toBe(B3(H(Buffer.concat([H(last.subarray(0, 65536)), H(last.subarray(65536))]))));
    // The tensor digest of a is not the list of its chunk digests but of all 6 of its blocks.
    expect(chunks[0]!.whole).not.toBe(listDigest(chunks.slice(0, 3).map((c) => Buffer.from(c.digest.slice('blake3:'.length), 'hex'))));
    expect(blockDigests(tensors[0]!.data)).toHaveLength(6);
  });

  it('an empty tensor still travels as one empty chunk', () => {
    const chunks = [...chunksOf('t', [{ name: 'e', shape: [0], data: new Float32Array(0) }], ONE_BLOCK)];
    expect(chunks).toHaveLength(1);
    expect(chunks[0]!.offset).toBe(0);
    expect(chunks[0]!.total).toBe(0);
    expect(chunks[0]!.data.length).toBe(0);
    // One empty block: BLAKE3 of BLAKE3("") for the chunk and for the tensor.
    expect(chunks[0]!.digest).toBe('blake3:82878ed8a480ee41775636820e05a934ca5c747223ca64306658ee5982e6c227');
    expect(chunks[0]!.whole).toBe(chunks[0]!.digest);
  });

  it("a tensor's digest does not depend on the chunk size", () => {
    const t = tensor('w', [5 * 16384 + 300]); // 6 blocks, the last of 300 elements
    const small = [...chunksOf('t', [t], ONE_BLOCK)]; // 1 block per chunk: 6 chunks
    const large = [...chunksOf('t', [t], FOUR_BLOCKS)]; // 4 blocks per chunk: 4 + 2 → 2 chunks
    expect(small).toHaveLength(6);
    expect(large).toHaveLength(2);
    // The two cuts really differ: their first chunks hold 1 and 4 blocks.
    expect(small[0]!.digest).not.toBe(large[0]!.digest);
    const wholes = new Set([...small, ...large].map((c) => c.whole));
    expect([...wholes]).toEqual([tensorDigest(t.data)]);
    expect([...wholes]).toEqual(manifestOf([t]).map((m) => m.digest));
    // Both cuts assemble against the same manifest.
    for (const cut of [small, large]) {
      const asm = new Assembler('t', manifestOf([t]));
      cut.forEach((c) => asm.accept(c));
      expect(bits(asm.finish()[0]!.data)).toBe(bits(t.data));
    }
  });
});

describe('Assembler', () => {
  it('reassembles bit-exact from chunks in reverse and shuffled order', () => {
    const tensors = model();
    const chunks = [...chunksOf('t', tensors, ONE_BLOCK)]; // 1 block per chunk: 6 + 2 + 1 = 9 chunks
    expect(chunks.length).toBeGreaterThan(8);
    for (const order of [chunks.slice().reverse(), chunks.filter((_, i) => i % 2).concat(chunks.filter((_, i) => i % 2 === 0))]) {
      const asm = new Assembler('t', manifestOf(tensors));
      order.forEach((c, i) => {
        expect(asm.complete).toBe(false);
        asm.accept(c);
        if (i < order.length - 1) expect(asm.complete).toBe(false);
      });
      expect(asm.complete).toBe(true);
      const out = asm.finish();
      expect(out.map((t) => t.name)).toEqual(tensors.map((t) => t.name)); // manifest order
      out.forEach((t, i) => {
        expect(t.shape).toEqual(tensors[i]!.shape);
        expect(bits(t.data)).toBe(bits(tensors[i]!.data));
      });
      expect(asm.chunks).toBe(chunks.length);
      expect(asm.bytes).toBe(tensors.reduce((n, t) => n + t.data.byteLength, 0));
      expect(modelDigest(out)).toBe(modelDigest(tensors));
    }
  });

  it('survives the encode/decode of every chunk (the wire path)', () => {
    const tensors = model();
    const asm = new Assembler('t', manifestOf(tensors));
    let n = 0;
    // (160000 − 1024) / 65536 = 2.43 → 2 blocks per chunk: 3 + 1 + 1 chunks
    for (const c of chunksOf('t', tensors, 160_000)) {
      asm.accept(decode('s', encode(c), Chunk));
      n += 1;
    }
    expect(n).toBe(5);
    expect(modelDigest(asm.finish())).toBe(modelDigest(tensors));
  });

  it('with an empty manifest it is complete at once and finishes with nothing', () => {
    const asm = new Assembler('t', []);
    expect(asm.complete).toBe(true);
    expect(asm.finish()).toEqual([]);
  });

  describe('rejects a chunk', () => {
    const tensors = [tensor('w', [2 * 16384 + 10])]; // 32778 elements
    const good = (): Chunk => [...chunksOf('t', tensors, TWO_BLOCKS)][0]!; // elements [0, 32768): 2 blocks

    it('whose data does not match its digest', () => {
      // A flipped bit in the first and in the second block of the chunk.
      for (const i of [3, 16384 + 3]) {
        const asm = new Assembler('t', manifestOf(tensors));
        const c = good();
        const e = rejection(() => asm.accept({ ...c, data: flipBit(c.data, i) }));
        expect(e.message).toContain("transfer t, tensor 'w' at offset 0: chunk digest");
        expect(e.message).toContain(`does not match ${c.digest}`);
        expect(asm.chunks).toBe(0);
        expect(asm.bytes).toBe(0);
      }
    });

    it('for a tensor not in the manifest', () => {
      const asm = new Assembler('t', manifestOf(tensors));
      const e = rejection(() => asm.accept({ ...good(), tensor: 'nope' }));
      expect(e.message).toBe("transfer t, tensor 'nope' at offset 0: tensor is not one this receiver expects");
    });

    it('of another transfer', () => {
      const asm = new Assembler('t', manifestOf(tensors));
      expect(rejection(() => asm.accept({ ...good(), transfer: 'u' })).message).toContain('chunk belongs to transfer u');
    });

    it('with the wrong total', () => {
      const asm = new Assembler('t', manifestOf(tensors));
      const e = rejection(() => asm.accept({ ...good(), total: 32779 }));
      expect(e.message).toContain('expected a tensor of 32778 elements, chunk says 32779');
    });

    it('that runs past the end of its tensor', () => {
      const asm = new Assembler('t', manifestOf(tensors));
      const c = good();
      // offset 16384 (a block boundary) + 32768 elements = 49152 > 32778; the digest itself is right
      const e = rejection(() => asm.accept({ ...c, offset: 16384 }));
      expect(e.message).toBe("transfer t, tensor 'w' at offset 16384: 32768 elements run past the end (32778)");
      expect(asm.complete).toBe(false);
      expect(asm.chunks).toBe(0);
    });

    it('whose offset is not on a block boundary', () => {
      // The second one-block chunk, elements [16384, 32768), moved by one element either way:
      // still inside the tensor (16385 + 16384 = 32769 ≤ 32778) and with a right digest.
      const c = [...chunksOf('t', tensors, ONE_BLOCK)][1]!;
      expect([c.offset, c.data.length]).toEqual([16384, 16384]);
      for (const offset of [16383, 16385, 10]) {
        const asm = new Assembler('t', manifestOf(tensors));
        const e = rejection(() => asm.accept({ ...c, offset }));
        expect(e.message).toBe(`transfer t, tensor 'w' at offset ${offset}: a chunk must start on a block boundary (16384 elements)`);
        expect(asm.chunks).toBe(0);
        expect(asm.bytes).toBe(0);
      }
      // At its own offset, the same chunk is fine.
      const asm = new Assembler('t', manifestOf(tensors));
      asm.accept(c);
      expect(asm.chunks).toBe(1);
    });
  });

  describe('finish', () => {
    it('rejects a whole tensor whose digest differs from the manifest (chunks themselves fine)', () => {
      const tensors = [tensor('a', [4]), tensor('b', [16384 + 6], 3)];
      const manifest = manifestOf(tensors);
      // A flipped bit in b's second block.
      const tampered = [tensors[0]!, { ...tensors[1]!, data: flipBit(tensors[1]!.data, 16384 + 5) }];
      const asm = new Assembler('t', manifest);
      for (const c of chunksOf('t', tampered, ONE_BLOCK)) asm.accept(c); // each chunk carries its own, valid digest
      expect(asm.complete).toBe(true);
      const e = rejection(() => asm.finish());
      expect(e.message).toContain("transfer t: tensor 'b' digest");
      expect(e.message).toContain(`does not match the manifest's ${manifest[1]!.digest}`);
    });

    it('rejects incomplete tensors', () => {
      const tensors = [tensor('a', [5 * 16384 + 100])]; // 82020 elements
      const asm = new Assembler('t', manifestOf(tensors));
      const chunks = [...chunksOf('t', tensors, TWO_BLOCKS)]; // 32768 + 32768 + 16484
      asm.accept(chunks[0]!);
      asm.accept(chunks[2]!);
      expect(asm.complete).toBe(false);
      // 32768 + 16484 = 49252
      expect(rejection(() => asm.finish()).message).toBe("transfer t: tensor 'a' has 49252 of 82020 elements");
    });

    it('rejects a tensor that no chunk was sent for', () => {
      const tensors = [tensor('a', [4]), tensor('b', [4])];
      const asm = new Assembler('t', manifestOf(tensors));
      for (const c of chunksOf('t', [tensors[0]!], ONE_BLOCK)) asm.accept(c);
      expect(rejection(() => asm.finish()).message).toBe("transfer t: tensor 'b' has 0 of 4 elements");
    });
  });

  it('a chunk delivered twice neither completes the transfer early nor breaks it', () => {
    // Delivery may repeat a message (a retry, a redelivery). A chunk is identified by its offset,
    // so accepting it again must be harmless: with chunks A, A, B the tensor is complete only
    // after B, and finishes with the right bytes.
    const tensors = [tensor('w', [2 * 16384])];
    const [a, b] = [...chunksOf('t', tensors, ONE_BLOCK)]; // 16384 + 16384
    const asm = new Assembler('t', manifestOf(tensors));
    asm.accept(a!);
    try {
      asm.accept(a!);
    } catch (e) {
      // Refusing the repeat is acceptable too; what must not happen is a wrong completion.
      expect(e).toBeInstanceOf(TransferError);
    }
    expect(asm.complete).toBe(false);
    asm.accept(b!);
    expect(asm.complete).toBe(true);
    expect(bits(asm.finish()[0]!.data)).toBe(bits(tensors[0]!.data));
  });

  describe('take', () => {
    it('hands each tensor over exactly once, when its last chunk arrives, and undefined for a repeat', () => {
      const tensors = [tensor('a', [3 * 16384 + 7]), tensor('b', [5], 1)];
      const chunks = [...chunksOf('t', tensors, ONE_BLOCK)];
      // a: 49159 = 16384 × 3 + 7 → 4 chunks; b: 1 chunk
      expect(chunks.map((c) => [c.tensor, c.offset])).toEqual([
        ['a', 0],
        ['a', 16384],
        ['a', 32768],
        ['a', 49152],
        ['b', 0],
      ]);
      const [a0, a1, a2, a3, b0] = chunks as [Chunk, Chunk, Chunk, Chunk, Chunk];
      const asm = new Assembler('t', manifestOf(tensors));
      expect(asm.take(a2)).toBeUndefined();
      expect(asm.take(a2)).toBeUndefined(); // a repeat before a is complete
      const b = asm.take(b0);
      expect(b?.name).toBe('b');
      expect(b?.shape).toEqual([5]);
      expect(bits(b!.data)).toBe(bits(tensors[1]!.data));
      expect(asm.take(b0)).toBeUndefined(); // b again: already handed over
      expect(asm.take(a0)).toBeUndefined();
      expect(asm.take(a3)).toBeUndefined();
      expect(asm.complete).toBe(false);
      const a = asm.take(a1); // a's last missing chunk
      expect(a?.name).toBe('a');
      expect(a?.shape).toEqual([3 * 16384 + 7]);
      expect(bits(a!.data)).toBe(bits(tensors[0]!.data));
      expect(asm.complete).toBe(true);
      // Every chunk again: nothing is handed over twice, nothing is counted twice.
      for (const c of chunks) expect(asm.take(c)).toBeUndefined();
      expect(asm.chunks).toBe(5);
      expect(asm.bytes).toBe((3 * 16384 + 7 + 5) * 4);
    });

    it('does not hand over a complete tensor whose digest differs from the manifest', () => {
      const tensors = [tensor('a', [2 * 16384 + 1])];
      const manifest = manifestOf(tensors);
      const tampered = { ...tensors[0]!, data: flipBit(tensors[0]!.data, 32768) }; // the last element
      const [c0, c1, c2] = [...chunksOf('t', [tampered], ONE_BLOCK)]; // 16384 + 16384 + 1, each valid
      const asm = new Assembler('t', manifest);
      expect(asm.take(c0!)).toBeUndefined();
      expect(asm.take(c2!)).toBeUndefined();
      const e = rejection(() => asm.take(c1!));
      expect(e.message).toContain("transfer t: tensor 'a' digest");
      expect(e.message).toContain(`does not match the manifest's ${manifest[0]!.digest}`);
    });
  });
});

describe('Assembler, for a receiver that asks for chunks again', () => {
  const w = () => tensor('w', [4 * 16384 + 9]); // 5 blocks, the last of 9 elements

  it("refuses a chunk from anyone but the transfer's sender, as a bad chunk", () => {
    const asm = new Assembler('t', manifestOf([w()]), { from: 2 });
    const [c] = [...chunksOf('t', [w()], ONE_BLOCK, { from: 3 })];
    const e = rejection(() => asm.accept(c!));
    expect(e).toBeInstanceOf(BadChunkError);
    expect(e.message).toBe("transfer t, tensor 'w' at offset 0: chunk says it comes from device 3; this transfer's sender is device 2");
    asm.accept({ ...c!, from: 2 });
    expect(asm.chunks).toBe(1);
  });

  it('places a chunk that overlaps blocks it already holds only where it is new, and counts each element once', () => {
    const t = w();
    const placed: Array<[number, number]> = [];
    const asm = new Assembler('t', manifestOf([t]), { place: (_name, offset, data) => placed.push([offset, data.length]) });
    const small = [...chunksOf('t', [t], ONE_BLOCK)]; // 1 block a chunk
    const large = [...chunksOf('t', [t], 263168)]; // 4 blocks a chunk
    asm.accept(small[1]!);
    asm.accept(small[3]!);
    asm.accept(large[0]!); // blocks 0-3: 0 and 2 are new
    expect(placed).toEqual([
      [16384, 16384],
      [49152, 16384],
      [0, 16384],
      [32768, 16384],
    ]);
    asm.accept(large[0]!); // nothing new: a repeat
    expect(placed).toHaveLength(4);
    expect(asm.complete).toBe(false);
    asm.accept(large[1]!);
    expect(asm.complete).toBe(true);
    expect(asm.bytes).toBe(t.data.byteLength);
    expect(listDigest(blockDigests(t.data))).toBe(manifestOf([t])[0]!.digest);
  });

  it('refuses a chunk whose block differs from one it already holds, and places none of it', () => {
    const t = w();
    const asm = new Assembler('t', manifestOf([t]));
    asm.accept([...chunksOf('t', [t], ONE_BLOCK)][1]!);
    // Blocks 0-3 of other bytes, with their own right chunk digest and the real tensor digest.
    const other = { ...t, data: flipBit(t.data, 16384 + 1) };
    const [c] = [...chunksOf('t', [other], 263168)];
    const e = rejection(() => asm.accept({ ...c!, whole: manifestOf([t])[0]!.digest }));
    expect(e).toBeInstanceOf(BadChunkError);
    expect(e.message).toBe("transfer t, tensor 'w' at offset 0: block 1 differs from the one an earlier chunk filled");
    expect(asm.chunks).toBe(1);
    expect(asm.lacks('w', 0)).toBe(true);
  });

  it('says which chunks it lacks: by a place a bad chunk names, and all of them for a chunk size', () => {
    const tensors = [w(), tensor('e', [0]), tensor('s', [3], 1)];
    const asm = new Assembler('t', manifestOf(tensors));
    const chunks = [...chunksOf('t', tensors, 132096)]; // 2 blocks a chunk: w at 0, 32768, 65536; e; s
    expect(asm.missing(32768)).toEqual([
      { tensor: 'w', offset: 0 },
      { tensor: 'w', offset: 32768 },
      { tensor: 'w', offset: 65536 },
      { tensor: 'e', offset: 0 },
      { tensor: 's', offset: 0 },
    ]);
    asm.accept(chunks[1]!);
    asm.take(chunks[3]!);
    expect(asm.missing(32768)).toEqual([
      { tensor: 'w', offset: 0 },
      { tensor: 'w', offset: 65536 },
      { tensor: 's', offset: 0 },
    ]);
    expect(asm.lacks('w', 0)).toBe(true);
    expect(asm.lacks('w', 16384)).toBe(true);
    expect(asm.lacks('w', 32768)).toBe(false); // held
    expect(asm.lacks('w', 100)).toBe(false); // not a block boundary: no chunk begins there
    expect(asm.lacks('w', 5 * 16384)).toBe(false); // past the end
    expect(asm.lacks('e', 0)).toBe(false); // complete (an empty tensor's one chunk)
    expect(asm.lacks('nope', 0)).toBe(false);
    expect(asm.lacks('s', 0)).toBe(true);
  });
});

describe('manifestOf and modelDigest', () => {
  it('the manifest lists names, shapes (copied) and per-tensor digests', () => {
    const tensors = model();
    const m = manifestOf(tensors);
    expect(m.map((e) => e.name)).toEqual(['wte', 'h0.attn.wq', 'head.b']);
    expect(m[0]!.shape).toEqual([41, 2048]);
    expect(m[0]!.shape).not.toBe(tensors[0]!.shape);
    m.forEach((e, i) => {
      expect(e.digest).toBe(tensorDigest(tensors[i]!.data));
      expect(e.digest).toBe(byHand(tensors[i]!.data));
      expect(e.digest).toMatch(/^blake3:[0-9a-f]{64}$/);
    });
    // h0.attn.wq is 17161 elements = 68644 bytes: blocks of bytes [0, 65536) and [65536, 68644).
    const wq = Buffer.from(tensors[1]!.data.buffer);
    expect(wq.length).toBe(68644);
    expect(m[1]!.digest).toBe(B3(H(Buffer.concat([H(wq.subarray(0, 65536)), H(wq.subarray(65536))]))));
  });

  it('modelDigest is deterministic and changes when one bit changes', () => {
    const tensors = model();
    const d = modelDigest(tensors);
    expect(modelDigest(model())).toBe(d);
    for (let t = 0; t < tensors.length; t++) {
      const changed = tensors.map((x, i) => (i === t ? { ...x, data: flipBit(x.data, x.data.length - 1) } : x));
      expect(modelDigest(changed)).not.toBe(d);
    }
  });

  it('modelDigest covers names, shapes and order, not only bytes', () => {
    const a = tensor('a', [2, 3]);
    const b = tensor('b', [4], 1);
    const d = modelDigest([a, b]);
    expect(modelDigest([{ ...a, name: 'x' }, b])).not.toBe(d);
    expect(modelDigest([{ ...a, shape: [3, 2] }, b])).not.toBe(d);
    expect(modelDigest([b, a])).not.toBe(d);
  });
});

describe('pacer', () => {
  it('flushes every FLUSH_EVERY publishes and waits for the window before the last, never more', async () => {
    const flushes: Array<() => void> = [];
    const bus = { flush: () => new Promise<void>((resolve) => flushes.push(resolve)) } as unknown as Bus;
    const pace = pacer(bus);
    for (let i = 0; i < FLUSH_EVERY; i++) await pace.published();
    expect(flushes.length).toBe(1); // window 1 is flushing; window 2 may be built meanwhile
    for (let i = 0; i < FLUSH_EVERY - 1; i++) await pace.published();
    let through = false;
    const last = pace.published().then(() => (through = true));
    await Promise.resolve();
    expect(through).toBe(false); // the end of window 2 waits for window 1
    flushes[0]!();
    await last;
    expect(flushes.length).toBe(2);
    const end = pace.end();
    flushes[1]!();
    await new Promise((r) => setImmediate(r));
    flushes[2]!();
    await end;
    expect(flushes.length).toBe(3);
  });

  it("gives a window's frames back to the pool only once the server has that window", async () => {
    const flushes: Array<() => void> = [];
    const bus = { flush: () => new Promise<void>((resolve) => flushes.push(resolve)) } as unknown as Bus;
    const pool = new FramePool(2 * FLUSH_EVERY);
    const pace = pacer(bus, FLUSH_EVERY, pool);
    const frames: Uint8Array[] = [];
    for (let i = 0; i < 2 * FLUSH_EVERY - 1; i++) {
      frames.push(pool.take(1 << 16));
      await pace.published(frames.at(-1));
    }
    expect(pool.size).toBe(0); // window 1 is flushing: its frames may still be read
    flushes[0]!();
    await new Promise((r) => setImmediate(r));
    expect(pool.size).toBe(FLUSH_EVERY);
    // The next frame is one of window 1's, not a new one.
    const again = pool.take(1 << 16);
    expect(frames.slice(0, FLUSH_EVERY).map((f) => f.buffer)).toContain(again.buffer);
    expect(pool.made).toBe(2 * FLUSH_EVERY - 1);
    await pace.published(again); // window 2 is full: its flush begins
    await pace.published(pool.take(1 << 16)); // window 3's one frame
    expect(pool.size).toBe(FLUSH_EVERY - 2);
    const end = pace.end();
    flushes[1]!();
    await new Promise((r) => setImmediate(r));
    expect(pool.size).toBe(2 * FLUSH_EVERY - 2); // window 2 is back; window 3 still flushing
    flushes[2]!();
    await end;
    expect(pool.size).toBe(2 * FLUSH_EVERY - 1);
    expect(pool.made).toBe(2 * FLUSH_EVERY - 1);
  });

  it('a flush that fails reaches the sender at its next wait, not as an unhandled rejection', async () => {
    const bus = { flush: () => Promise.reject(new Error('connection closed')) } as unknown as Bus;
    const unhandled: unknown[] = [];
    const onUnhandled = (e: unknown) => unhandled.push(e);
    process.on('unhandledRejection', onUnhandled);
    try {
      const pace = pacer(bus);
      for (let i = 0; i < FLUSH_EVERY; i++) await pace.published(); // window 1's flush fails, unseen yet
      await new Promise((r) => setImmediate(r));
      for (let i = 0; i < FLUSH_EVERY - 1; i++) await pace.published();
      await expect(pace.published()).rejects.toThrow('connection closed');
      await new Promise((r) => setImmediate(r));
      expect(unhandled).toEqual([]);
    } finally {
      process.off('unhandledRejection', onUnhandled);
    }
  });
});

describe('FramePool', () => {
  it('takes the smallest free frame that fits, else makes one; keeps whole frames of 64 KiB or more, up to its bound', () => {
    const pool = new FramePool(2);
    const a = pool.take(100_000);
    const b = pool.take(200_000);
    expect([a.length, b.length, pool.made]).toEqual([100_000, 200_000, 2]);
    // What a message used of a frame goes back as the whole frame.
    pool.give([b.subarray(0, 150_000), a.subarray(0, 10)]);
    expect(pool.size).toBe(2);
    expect(pool.take(90_000).buffer).toBe(a.buffer);
    expect(pool.take(150_000).buffer).toBe(b.buffer);
    expect([pool.made, pool.reused, pool.size]).toEqual([2, 2, 0]);
    // None fits: a new one.
    pool.give([a]);
    expect(pool.take(300_000).length).toBe(300_000);
    expect([pool.made, pool.size]).toEqual([3, 1]);
    // Small frames, views into another array, and frames past the bound are not kept.
    pool.give([new Uint8Array(1000), new Uint8Array(1 << 20).subarray(8), b, new Uint8Array(1 << 17)]);
    expect(pool.size).toBe(2);
  });
});
