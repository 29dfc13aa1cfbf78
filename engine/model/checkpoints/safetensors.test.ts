// safetensors: files written by hand byte for byte, every refusal, dtypes, round trips, shards.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { SafetensorsCheckpoint, SafetensorsError, SafetensorsFile, encodeSafetensors, halfToFloat, toBf16 } from './safetensors.ts';

/** A file from a header object and raw data bytes, as the format lays them out. */
function file(header: unknown, data: Uint8Array | number[] = [], headerText = JSON.stringify(header)): Uint8Array {
  const head = new TextEncoder().encode(headerText);
  const out = new Uint8Array(8 + head.length + data.length);
  new DataView(out.buffer).setBigUint64(0, BigInt(head.length), true);
  out.set(head, 8);
  out.set(data, 8 + head.length);
  return out;
}

const f32 = (...xs: number[]) => new Uint8Array(new Float32Array(xs).buffer);
const u16 = (...xs: number[]) => new Uint8Array(new Uint16Array(xs).buffer);

describe('reading', () => {
  it('reads F32, F16 and BF16 tensors, widened to float32 (hand-made bytes)', () => {
    const data = new Uint8Array([...f32(1.5, -2), ...u16(0x3c00, 0xc000, 0x7bff, 0x0001), ...u16(0x3f80, 0xc040)]);
    const st = SafetensorsFile.fromBytes(
      file(
        {
          __metadata__: { format: 'pt' },
          a: { dtype: 'F32', shape: [2], data_offsets: [0, 8] },
          h: { dtype: 'F16', shape: [2, 2], data_offsets: [8, 16] },
          b: { dtype: 'BF16', shape: [2], data_offsets: [16, 20] },
        },
        data,
      ),
    );
    expect([...st.read('a')]).toEqual([1.5, -2]);
    expect([...st.read('h')]).toEqual([1, -2, 65504, 2 ** -24]);
    expect([...st.read('b')]).toEqual([1, -3]);
    expect(st.tensors.get('h')!.shape).toEqual([2, 2]);
    expect(st.metadata).toEqual({ format: 'pt' });
  });

  it('reads a tensor of zero elements, and a header with no tensors', () => {
    const st = SafetensorsFile.fromBytes(file({ e: { dtype: 'F32', shape: [0, 3], data_offsets: [0, 0] } }));
    expect(st.read('e').length).toBe(0);
    expect(SafetensorsFile.fromBytes(file({})).tensors.size).toBe(0);
  });

  it('half precision: subnormals, infinities and NaN', () => {
    expect(halfToFloat(0x8000)).toBe(-0);
    expect(halfToFloat(0x0200)).toBe(2 ** -15);
    expect(halfToFloat(0x7c00)).toBe(Number.POSITIVE_INFINITY);
    expect(halfToFloat(0xfc00)).toBe(Number.NEGATIVE_INFINITY);
    expect(halfToFloat(0x7e00)).toBeNaN();
  });
});

describe('refusals name the file and the tensor', () => {
  const refuse = (bytes: Uint8Array, pattern: RegExp) => {
    expect(() => SafetensorsFile.fromBytes(bytes, 'x.safetensors')).toThrow(SafetensorsError);
    expect(() => SafetensorsFile.fromBytes(bytes, 'x.safetensors')).toThrow(pattern);
  };
  const ok = { a: { dtype: 'F32', shape: [2], data_offsets: [0, 8] } };

  it('a file shorter than its header length, or than its header', () => {
    refuse(new Uint8Array(5), /x\.safetensors: expected at least 8 bytes .* got 5: the file is truncated/);
    refuse(file(ok, f32(1, 2)).subarray(0, 20), /the header claims \d+ bytes but the file has 12 after the length: the file is truncated/);
  });

  it('a header that is not JSON, or not an object', () => {
    refuse(file(undefined, [], '{"a": '), /the header is not UTF-8 JSON/);
    refuse(file([1, 2]), /expected the header to be a JSON object, got \[1,2\]/);
  });

  it('an absurd header length', () => {
    const bytes = new Uint8Array(16);
    new DataView(bytes.buffer).setBigUint64(0, 1n << 40n, true);
    refuse(bytes, /the header claims 1099511627776 bytes, more than/);
  });

  it('an unsupported dtype', () => {
    refuse(file({ t: { dtype: 'I64', shape: [1], data_offsets: [0, 8] } }, new Uint8Array(8)), /tensor t: dtype I64 is not supported; expected one of F32, F16, BF16/);
  });

  it('a shape that disagrees with the byte range', () => {
    refuse(file({ t: { dtype: 'F32', shape: [3], data_offsets: [0, 8] } }, f32(1, 2)), /tensor t: shape \[3\] of F32 needs 12 bytes, data_offsets \[0, 8\] hold 8/);
    refuse(file({ t: { dtype: 'F32', shape: [1.5], data_offsets: [0, 8] } }, f32(1, 2)), /tensor t: expected a shape of whole numbers, got \[1.5\]/);
  });

  it('offsets that run past the end (a truncated file), end before they begin, or are missing', () => {
    refuse(file({ t: { dtype: 'F32', shape: [4], data_offsets: [0, 16] } }, f32(1, 2)), /tensor t: data_offsets \[0, 16\] run past the end of the data \(8 bytes\): the file is truncated/);
    refuse(file({ t: { dtype: 'F32', shape: [0], data_offsets: [8, 4] } }, f32(1, 2)), /tensor t: data_offsets \[8, 4\] end before they begin/);
    refuse(file({ t: { dtype: 'F32', shape: [2] } }, f32(1, 2)), /tensor t: expected data_offsets \[begin, end\], got undefined/);
  });

  it('tensors whose bytes overlap', () => {
    refuse(
      file(
        {
          a: { dtype: 'F32', shape: [2], data_offsets: [0, 8] },
          b: { dtype: 'F32', shape: [2], data_offsets: [4, 12] },
        },
        f32(1, 2, 3),
      ),
      /tensor b \(bytes 4–12\) overlaps a \(bytes 0–8\)/,
    );
  });

  it('a tensor that is not there', () => {
    expect(() => SafetensorsFile.fromBytes(file(ok, f32(1, 2)), 'x.safetensors').read('b')).toThrow(/x\.safetensors: no tensor b/);
  });
});

describe('writing', () => {
  it('round-trips F32 bit for bit, in the order given, with the data aligned to 8 bytes', () => {
    const tensors = [
      { name: 'w', shape: [2, 3], data: new Float32Array([1, -2, 3.25, Math.PI, -0, 1e-40]) },
      { name: 'b', shape: [3], data: new Float32Array([Number.POSITIVE_INFINITY, 0.1, -7]) },
    ];
    const bytes = encodeSafetensors(tensors, 'F32', { format: 'pt' });
    const headerLength = Number(new DataView(bytes.buffer).getBigUint64(0, true));
    expect((8 + headerLength) % 8).toBe(0);
    const st = SafetensorsFile.fromBytes(bytes);
    expect([...st.tensors.keys()]).toEqual(['w', 'b']);
    for (const t of tensors) expect(new Uint32Array(st.read(t.name).buffer)).toEqual(new Uint32Array(t.data.buffer));
    expect(st.metadata).toEqual({ format: 'pt' });
  });

  it('BF16: rounds to nearest, ties to even, and reads back as the rounded values', () => {
    // 1 + 2⁻⁸ lies halfway between bf16's 1 and 1 + 2⁻⁷: ties to even (1). 1 + 3·2⁻⁸ ties up to 1 + 2⁻⁶.
    const x = new Float32Array([1, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20, -3, Number.NaN]);
    expect([...toBf16(x)].slice(0, 5)).toEqual([0x3f80, 0x3f80, 0x3f82, 0x3f81, 0xc040]);
    const back = SafetensorsFile.fromBytes(encodeSafetensors([{ name: 'x', shape: [6], data: x }], 'BF16')).read('x');
    expect([...back.slice(0, 5)]).toEqual([1, 1, 1 + 2 ** -6, 1 + 2 ** -7, -3]);
    expect(back[5]).toBeNaN();
  });

  it('refuses data that does not match its shape, and a name written twice', () => {
    expect(() => encodeSafetensors([{ name: 'w', shape: [2, 2], data: new Float32Array(3) }])).toThrow(/tensor w: shape \[2, 2\] has 4 values, its data 3/);
    const t = { name: 'w', shape: [1], data: new Float32Array(1) };
    expect(() => encodeSafetensors([t, t])).toThrow(/cannot write tensor w twice/);
  });
});

describe('checkpoint directories', () => {
  let dir = '';
  afterEach(() => rmSync(dir, { recursive: true, force: true }));
  const tensor = (name: string, ...xs: number[]) => ({ name, shape: [xs.length], data: new Float32Array(xs) });

  it('reads one model.safetensors from a file on disk', () => {
    dir = mkdtempSync(join(tmpdir(), 'ferry-st-'));
    writeFileSync(join(dir, 'model.safetensors'), encodeSafetensors([tensor('a', 1, 2), tensor('b', 3)]));
    const ck = SafetensorsCheckpoint.open(dir);
    expect(ck.names().sort()).toEqual(['a', 'b']);
    expect([...ck.read('b')]).toEqual([3]);
    ck.close();
  });

  it('reads shards through their index, and refuses an index that disagrees with its files', () => {
    dir = mkdtempSync(join(tmpdir(), 'ferry-st-'));
    writeFileSync(join(dir, 'model-00001-of-00002.safetensors'), encodeSafetensors([tensor('a', 1, 2)]));
    writeFileSync(join(dir, 'model-00002-of-00002.safetensors'), encodeSafetensors([tensor('b', 3), tensor('c', 4)]));
    const index = (map: Record<string, string>) => writeFileSync(join(dir, 'model.safetensors.index.json'), JSON.stringify({ metadata: {}, weight_map: map }));
    index({ a: 'model-00001-of-00002.safetensors', b: 'model-00002-of-00002.safetensors', c: 'model-00002-of-00002.safetensors' });
    const ck = SafetensorsCheckpoint.open(dir);
    expect([...ck.read('a')]).toEqual([1, 2]);
    expect([...ck.read('c')]).toEqual([4]);
    expect(ck.fileOf('c')).toMatch(/model-00002-of-00002\.safetensors$/);
    ck.close();
    index({ a: 'model-00001-of-00002.safetensors', b: 'model-00002-of-00002.safetensors' });
    expect(() => SafetensorsCheckpoint.open(dir)).toThrow(/model-00002-of-00002\.safetensors: tensor c is not in model\.safetensors\.index\.json's weight map/);
    index({ a: 'model-00001-of-00002.safetensors', b: 'model-00001-of-00002.safetensors', c: 'model-00002-of-00002.safetensors' });
    expect(() => SafetensorsCheckpoint.open(dir)).toThrow(/tensor b should be in model-00001-of-00002\.safetensors, which does not have it/);
    index({ a: 'model-00003-of-00002.safetensors' });
    expect(() => SafetensorsCheckpoint.open(dir)).toThrow(/tensor a is in model-00003-of-00002\.safetensors, which does not exist/);
    index({ a: '../elsewhere.safetensors' });
    expect(() => SafetensorsCheckpoint.open(dir)).toThrow(/outside the checkpoint's directory/);
  });

  it('refuses a directory with neither file, naming both', () => {
    dir = mkdtempSync(join(tmpdir(), 'ferry-st-'));
    expect(() => SafetensorsCheckpoint.open(dir)).toThrow(/expected model\.safetensors or model\.safetensors\.index\.json, found neither/);
  });

  it('refuses a file on disk cut short, naming it', () => {
    dir = mkdtempSync(join(tmpdir(), 'ferry-st-'));
    const bytes = encodeSafetensors([tensor('a', 1, 2, 3, 4)]);
    writeFileSync(join(dir, 'model.safetensors'), bytes.subarray(0, bytes.length - 3));
    expect(() => SafetensorsCheckpoint.open(dir)).toThrow(/model\.safetensors: tensor a: data_offsets \[0, 16\] run past the end of the data \(13 bytes\): the file is truncated/);
  });
});
