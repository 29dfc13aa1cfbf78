import { describe, it, expect } from 'vitest';
import { createHash } from 'node:crypto';
import { decode, encode } from './codec.ts';
import { Chunk, PROTOCOL_VERSION } from './protocol.ts';
import { Assembler, TransferError, chunkElements, chunksOf, manifestOf, modelDigest, sha256, type NamedTensor } from './transfer.ts';

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

const model = (): NamedTensor[] => [tensor('wte', [11, 13]), tensor('h0.attn.wq', [7, 7], 1), tensor('head.b', [5], 2)];

describe('sha256', () => {
  it('hashes exactly the bytes of a view, not its whole buffer', () => {
    const whole = new Float32Array([1, 2, 3, 4]);
    const view = whole.subarray(1, 3);
    const expected = createHash('sha256').update(Buffer.from(new Float32Array([2, 3]).buffer)).digest('hex');
    expect(sha256(view)).toBe(expected);
  });
});

describe('chunkElements', () => {
  it('leaves 512 bytes of room and counts 4-byte elements', () => {
    // (1024 − 512) / 4 = 128; (1 MiB − 512) / 4 = 262016
    expect(chunkElements(1024)).toBe(128);
    expect(chunkElements(1 << 20)).toBe(262016);
    expect(chunkElements(516)).toBe(1);
  });

  it('refuses a payload with no room for one element', () => {
    expect(() => chunkElements(515)).toThrow(TransferError);
    expect(() => chunkElements(515)).toThrow(/max payload 515 leaves no room/);
  });
});

describe('chunksOf', () => {
  it('every encoded chunk fits the max payload it was cut for', () => {
    const tensors = [tensor('wte', [33, 64]), tensor('wpe', [16, 64]), tensor('lnf.g', [64])];
    for (const chunkBytes of [516, 600, 1024, 4096, 10_000]) {
      let n = 0;
      for (const chunk of chunksOf('xfer-123456', tensors, chunkBytes)) {
        expect(encode(chunk).length).toBeLessThanOrEqual(chunkBytes);
        n += 1;
      }
      expect(n).toBeGreaterThan(0);
    }
  });

  it('cuts tensors in order, at offsets of chunkElements, with the right totals and digests', () => {
    const tensors = [tensor('a', [300]), tensor('b', [128]), tensor('c', [1])];
    const chunks = [...chunksOf('t1', tensors, 1024)]; // 128 elements per chunk
    // a: 300 = 128 + 128 + 44 → 3 chunks; b: exactly 1 chunk; c: 1 chunk
    expect(chunks.map((c) => [c.tensor, c.offset, c.data.length, c.total])).toEqual([
      ['a', 0, 128, 300],
      ['a', 128, 128, 300],
      ['a', 256, 44, 300],
      ['b', 0, 128, 128],
      ['c', 0, 1, 1],
    ]);
    for (const c of chunks) {
      expect(c.type).toBe('chunk');
      expect(c.v).toBe(PROTOCOL_VERSION);
      expect(c.transfer).toBe('t1');
      expect(c.sha256).toBe(sha256(c.data));
    }
  });

  it('an empty tensor still travels as one empty chunk', () => {
    const chunks = [...chunksOf('t', [{ name: 'e', shape: [0], data: new Float32Array(0) }], 1024)];
    expect(chunks).toHaveLength(1);
    expect(chunks[0]!.total).toBe(0);
    expect(chunks[0]!.data.length).toBe(0);
  });
});

describe('Assembler', () => {
  it('reassembles bit-exact from chunks in reverse and shuffled order', () => {
    const tensors = model();
    const chunks = [...chunksOf('t', tensors, 600)]; // 22 elements per chunk: many chunks
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
    for (const c of chunksOf('t', tensors, 700)) asm.accept(decode('s', encode(c), Chunk));
    expect(modelDigest(asm.finish())).toBe(modelDigest(tensors));
  });

  it('with an empty manifest it is complete at once and finishes with nothing', () => {
    const asm = new Assembler('t', []);
    expect(asm.complete).toBe(true);
    expect(asm.finish()).toEqual([]);
  });

  describe('rejects a chunk', () => {
    const tensors = [tensor('w', [10])];
    const good = (): Chunk => [...chunksOf('t', tensors, 1024)][0]!;

    it('whose data does not match its digest', () => {
      const asm = new Assembler('t', manifestOf(tensors));
      const c = good();
      const e = rejection(() => asm.accept({ ...c, data: flipBit(c.data, 3) }));
      expect(e.message).toContain("transfer t, tensor 'w' at offset 0: chunk digest");
      expect(e.message).toContain(`does not match ${c.sha256}`);
      expect(asm.chunks).toBe(0);
      expect(asm.bytes).toBe(0);
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
      const e = rejection(() => asm.accept({ ...good(), total: 11 }));
      expect(e.message).toContain('expected a tensor of 10 elements, chunk says 11');
    });

    it('that runs past the end of its tensor', () => {
      const asm = new Assembler('t', manifestOf(tensors));
      const c = good();
      const data = c.data.subarray(0, 4);
      // offset 7 + 4 elements = 11 > 10
      const e = rejection(() => asm.accept({ ...c, offset: 7, data, sha256: sha256(data) }));
      expect(e.message).toBe("transfer t, tensor 'w' at offset 7: 4 elements run past the end (10)");
      expect(asm.complete).toBe(false);
    });
  });

  describe('finish', () => {
    it('rejects a whole tensor whose digest differs from the manifest (chunks themselves fine)', () => {
      const tensors = [tensor('a', [4]), tensor('b', [6], 3)];
      const manifest = manifestOf(tensors);
      const tampered = [tensors[0]!, { ...tensors[1]!, data: flipBit(tensors[1]!.data, 5) }];
      const asm = new Assembler('t', manifest);
      for (const c of chunksOf('t', tampered, 1024)) asm.accept(c); // each chunk carries its own, valid digest
      expect(asm.complete).toBe(true);
      const e = rejection(() => asm.finish());
      expect(e.message).toContain("transfer t: tensor 'b' digest");
      expect(e.message).toContain(`does not match the manifest's ${manifest[1]!.sha256}`);
    });

    it('rejects incomplete tensors', () => {
      const tensors = [tensor('a', [300])];
      const asm = new Assembler('t', manifestOf(tensors));
      const chunks = [...chunksOf('t', tensors, 1024)]; // 128 + 128 + 44
      asm.accept(chunks[0]!);
      asm.accept(chunks[2]!);
      expect(asm.complete).toBe(false);
      expect(rejection(() => asm.finish()).message).toBe("transfer t: tensor 'a' has 172 of 300 elements");
    });

    it('rejects a tensor that no chunk was sent for', () => {
      const tensors = [tensor('a', [4]), tensor('b', [4])];
      const asm = new Assembler('t', manifestOf(tensors));
      for (const c of chunksOf('t', [tensors[0]!], 1024)) asm.accept(c);
      expect(rejection(() => asm.finish()).message).toBe("transfer t: tensor 'b' has 0 of 4 elements");
    });
  });

  it('a chunk delivered twice neither completes the transfer early nor breaks it', () => {
    // Delivery may repeat a message (a retry, a redelivery). A chunk is identified by its offset,
    // so accepting it again must be harmless: with chunks A, A, B the tensor is complete only
    // after B, and finishes with the right bytes.
    const tensors = [tensor('w', [256])];
    const [a, b] = [...chunksOf('t', tensors, 1024)]; // 128 + 128
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
});

describe('manifestOf and modelDigest', () => {
  it('the manifest lists names, shapes (copied) and per-tensor digests', () => {
    const tensors = model();
    const m = manifestOf(tensors);
    expect(m.map((e) => e.name)).toEqual(['wte', 'h0.attn.wq', 'head.b']);
    expect(m[0]!.shape).toEqual([11, 13]);
    expect(m[0]!.shape).not.toBe(tensors[0]!.shape);
    expect(m[1]!.sha256).toBe(sha256(tensors[1]!.data));
    expect(m[1]!.sha256).toMatch(/^[0-9a-f]{64}$/);
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
