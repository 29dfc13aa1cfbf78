// The safetensors format (Hugging Face's checkpoints): an 8-byte little-endian header length, a
// JSON header naming each tensor's dtype, shape and byte range in the data that follows, then the
// data. Read tensor by tensor from an open file (a checkpoint need not fit in memory twice), with
// F32, F16 and BF16 widened to float32; written as F32 or BF16. Every way a file can be wrong is
// refused with the file and the tensor named: a short file, a header that is not JSON, an
// unsupported dtype, a shape that disagrees with its byte range, ranges that overlap or run past
// the end. A sharded checkpoint (`model.safetensors.index.json` and its files) reads as one.
import { closeSync, existsSync, fstatSync, openSync, readFileSync, readSync } from 'node:fs';
import { join } from 'node:path';

export class SafetensorsError extends Error {
  override name = 'SafetensorsError';
}

export type Dtype = 'F32' | 'F16' | 'BF16';

const WIDTH: Record<Dtype, number> = { F32: 4, F16: 2, BF16: 2 };

/** The most a header may take (the reference implementation's limit): more is not a checkpoint. */
const MAX_HEADER = 100 * 1024 * 1024;

export interface TensorEntry {
  name: string;
  dtype: Dtype;
  shape: number[];
  /** Byte range in the data section, [begin, end). */
  begin: number;
  end: number;
}

/** Bytes at an offset of something readable: a file opened for reading, or bytes in memory. */
interface Source {
  size: number;
  read(offset: number, length: number): Uint8Array;
  close(): void;
}

function fileSource(file: string): Source {
  let fd: number;
  try {
    fd = openSync(file, 'r');
  } catch (e) {
    throw new SafetensorsError(`${file}: cannot open: ${(e as Error).message}`);
  }
  return {
    size: fstatSync(fd).size,
    read(offset, length) {
      const out = new Uint8Array(length);
      let done = 0;
      while (done < length) {
        const n = readSync(fd, out, done, length - done, offset + done);
        if (n === 0) throw new SafetensorsError(`${file}: ended at byte ${offset + done} while reading ${length} bytes from ${offset}`);
        done += n;
      }
      return out;
    },
    close: () => closeSync(fd),
  };
}

function bytesSource(bytes: Uint8Array): Source {
  return { size: bytes.length, read: (offset, length) => bytes.subarray(offset, offset + length), close() {} };
}

/** One safetensors file, its header read and checked; tensors are read on demand. */
export class SafetensorsFile {
  readonly tensors: ReadonlyMap<string, TensorEntry>;
  readonly metadata: Readonly<Record<string, string>>;
  private readonly dataStart: number;

  private constructor(
    readonly file: string,
    private readonly source: Source,
  ) {
    const where = file;
    if (source.size < 8) throw new SafetensorsError(`${where}: expected at least 8 bytes (the header's length), got ${source.size}: the file is truncated or not safetensors`);
    const n = Number(new DataView(source.read(0, 8).slice().buffer).getBigUint64(0, true));
    if (n > MAX_HEADER) throw new SafetensorsError(`${where}: the header claims ${n} bytes, more than the ${MAX_HEADER} a header may take: not a safetensors file`);
    if (8 + n > source.size) throw new SafetensorsError(`${where}: the header claims ${n} bytes but the file has ${source.size - 8} after the length: the file is truncated`);
    let header: unknown;
    try {
      header = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(source.read(8, n)));
    } catch (e) {
      throw new SafetensorsError(`${where}: the header is not UTF-8 JSON: ${(e as Error).message}`);
    }
    if (typeof header !== 'object' || header === null || Array.isArray(header))
      throw new SafetensorsError(`${where}: expected the header to be a JSON object, got ${JSON.stringify(header)?.slice(0, 80)}`);
    this.dataStart = 8 + n;
    const dataLength = source.size - this.dataStart;
    const tensors = new Map<string, TensorEntry>();
    let metadata: Record<string, string> = {};
    for (const [name, value] of Object.entries(header as Record<string, unknown>)) {
      if (name === '__metadata__') {
        if (typeof value !== 'object' || value === null || Object.values(value).some((v) => typeof v !== 'string'))
          throw new SafetensorsError(`${where}: expected __metadata__ to map names to strings, got ${JSON.stringify(value).slice(0, 80)}`);
        metadata = value as Record<string, string>;
        continue;
      }
      tensors.set(name, entryOf(where, name, value, dataLength));
    }
    // Ranges in order must not overlap.
    const sorted = [...tensors.values()].sort((a, b) => a.begin - b.begin || a.end - b.end);
    for (let i = 1; i < sorted.length; i++) {
      const [p, q] = [sorted[i - 1]!, sorted[i]!];
      if (q.begin < p.end) throw new SafetensorsError(`${where}: tensor ${q.name} (bytes ${q.begin}–${q.end}) overlaps ${p.name} (bytes ${p.begin}–${p.end})`);
    }
    this.tensors = tensors;
    this.metadata = metadata;
  }

  static open(file: string): SafetensorsFile {
    const source = fileSource(file);
    try {
      return new SafetensorsFile(file, source);
    } catch (e) {
      source.close();
      throw e;
    }
  }

  static fromBytes(bytes: Uint8Array, name = 'bytes'): SafetensorsFile {
    return new SafetensorsFile(name, bytesSource(bytes));
  }

  /** A tensor's values, widened to float32 in row-major order. */
  read(name: string): Float32Array {
    const e = this.tensors.get(name);
    if (!e) throw new SafetensorsError(`${this.file}: no tensor ${name}`);
    return widen(e.dtype, this.source.read(this.dataStart + e.begin, e.end - e.begin));
  }

  close(): void {
    this.source.close();
  }
}

function entryOf(where: string, name: string, value: unknown, dataLength: number): TensorEntry {
  const at = `${where}: tensor ${name}`;
  if (typeof value !== 'object' || value === null) throw new SafetensorsError(`${at}: expected {dtype, shape, data_offsets}, got ${JSON.stringify(value)}`);
  const { dtype, shape, data_offsets: offsets } = value as Record<string, unknown>;
  if (typeof dtype !== 'string') throw new SafetensorsError(`${at}: expected a dtype, got ${JSON.stringify(dtype)}`);
  if (!(dtype in WIDTH)) throw new SafetensorsError(`${at}: dtype ${dtype} is not supported; expected one of ${Object.keys(WIDTH).join(', ')}`);
  if (!Array.isArray(shape) || !shape.every((d) => Number.isInteger(d) && d >= 0)) throw new SafetensorsError(`${at}: expected a shape of whole numbers, got ${JSON.stringify(shape)}`);
  if (!Array.isArray(offsets) || offsets.length !== 2 || !offsets.every((o) => Number.isInteger(o) && o >= 0))
    throw new SafetensorsError(`${at}: expected data_offsets [begin, end], got ${JSON.stringify(offsets)}`);
  const [begin, end] = offsets as [number, number];
  if (end < begin) throw new SafetensorsError(`${at}: data_offsets [${begin}, ${end}] end before they begin`);
  if (end > dataLength) throw new SafetensorsError(`${at}: data_offsets [${begin}, ${end}] run past the end of the data (${dataLength} bytes): the file is truncated`);
  const want = (shape as number[]).reduce((a, b) => a * b, 1) * WIDTH[dtype as Dtype];
  if (end - begin !== want) throw new SafetensorsError(`${at}: shape [${shape.join(', ')}] of ${dtype} needs ${want} bytes, data_offsets [${begin}, ${end}] hold ${end - begin}`);
  return { name, dtype: dtype as Dtype, shape: shape as number[], begin, end };
}

// ---- dtypes --------------------------------------------------------------------------------------

/** IEEE half → float32, exactly (every half is a float32). */
export function halfToFloat(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >> 10) & 0x1f;
  const frac = h & 0x3ff;
  if (exp === 0) return sign * frac * 2 ** -24;
  if (exp === 31) return frac ? Number.NaN : sign * Number.POSITIVE_INFINITY;
  return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}

function widen(dtype: Dtype, bytes: Uint8Array): Float32Array {
  // A copy aligned for the typed views (the file's offsets need not be).
  const b = bytes.slice();
  if (dtype === 'F32') return new Float32Array(b.buffer, 0, b.length / 4);
  const half = new Uint16Array(b.buffer, 0, b.length / 2);
  const out = new Float32Array(half.length);
  if (dtype === 'BF16') {
    // bfloat16 is the top half of a float32.
    const bits = new Uint32Array(out.buffer);
    for (let i = 0; i < half.length; i++) bits[i] = half[i]! << 16;
  } else {
    for (let i = 0; i < half.length; i++) out[i] = halfToFloat(half[i]!);
  }
  return out;
}

/** float32 → bfloat16 bits, rounded to nearest, ties to even; NaN stays NaN. */
export function toBf16(x: Float32Array): Uint16Array {
  const bits = new Uint32Array(x.buffer, x.byteOffset, x.length);
  const out = new Uint16Array(x.length);
  for (let i = 0; i < x.length; i++) {
    const b = bits[i]!;
    if ((b & 0x7f800000) === 0x7f800000 && b & 0x7fffff) {
      out[i] = (b >>> 16) | 0x40; // a quiet NaN, whatever its payload
      continue;
    }
    out[i] = (b + 0x7fff + ((b >>> 16) & 1)) >>> 16;
  }
  return out;
}

// ---- writing -------------------------------------------------------------------------------------

export interface NamedTensor {
  name: string;
  shape: number[];
  data: Float32Array;
}

/**
 * A safetensors file of `tensors` in the order given, as F32 or BF16 (rounded to nearest even).
 * The header is padded with spaces to a multiple of 8 bytes, as the reference writer does, so that
 * the data is aligned.
 */
export function encodeSafetensors(tensors: readonly NamedTensor[], dtype: 'F32' | 'BF16' = 'F32', metadata: Record<string, string> = {}): Uint8Array {
  const header: Record<string, unknown> = Object.keys(metadata).length ? { __metadata__: metadata } : {};
  let offset = 0;
  const parts: Uint8Array[] = [];
  const seen = new Set<string>();
  for (const t of tensors) {
    if (seen.has(t.name)) throw new SafetensorsError(`cannot write tensor ${t.name} twice`);
    seen.add(t.name);
    const n = t.shape.reduce((a, b) => a * b, 1);
    if (n !== t.data.length) throw new SafetensorsError(`tensor ${t.name}: shape [${t.shape.join(', ')}] has ${n} values, its data ${t.data.length}`);
    const bytes = dtype === 'F32' ? new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength) : new Uint8Array(toBf16(t.data).buffer);
    header[t.name] = { dtype, shape: t.shape, data_offsets: [offset, offset + bytes.length] };
    parts.push(bytes);
    offset += bytes.length;
  }
  let json = JSON.stringify(header);
  const length = new TextEncoder().encode(json).length;
  json += ' '.repeat((8 - ((8 + length) % 8)) % 8);
  const head = new TextEncoder().encode(json);
  const out = new Uint8Array(8 + head.length + offset);
  new DataView(out.buffer).setBigUint64(0, BigInt(head.length), true);
  out.set(head, 8);
  let at = 8 + head.length;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

// ---- checkpoints of one or several files -----------------------------------------------------------

export const SINGLE_FILE = 'model.safetensors';
export const INDEX_FILE = 'model.safetensors.index.json';

/** A Hugging Face checkpoint directory's tensors: one file, or the shards its index names. */
export class SafetensorsCheckpoint {
  private constructor(
    readonly dir: string,
    private readonly files: SafetensorsFile[],
    private readonly where: ReadonlyMap<string, SafetensorsFile>,
  ) {}

  static open(dir: string): SafetensorsCheckpoint {
    const single = join(dir, SINGLE_FILE);
    const index = join(dir, INDEX_FILE);
    if (existsSync(index)) return SafetensorsCheckpoint.sharded(dir, index);
    if (!existsSync(single)) throw new SafetensorsError(`${dir}: expected ${SINGLE_FILE} or ${INDEX_FILE}, found neither`);
    const f = SafetensorsFile.open(single);
    return new SafetensorsCheckpoint(dir, [f], new Map([...f.tensors.keys()].map((k) => [k, f])));
  }

  private static sharded(dir: string, index: string): SafetensorsCheckpoint {
    let parsed: unknown;
    try {
      parsed = JSON.parse(readFileSync(index, 'utf8'));
    } catch (e) {
      throw new SafetensorsError(`${index}: not JSON: ${(e as Error).message}`);
    }
    const map = (parsed as { weight_map?: unknown })?.weight_map;
    if (typeof map !== 'object' || map === null || Object.values(map).some((v) => typeof v !== 'string'))
      throw new SafetensorsError(`${index}: expected {"weight_map": {tensor: file, …}}, got ${JSON.stringify(parsed).slice(0, 80)}`);
    const byFile = new Map<string, SafetensorsFile>();
    const where = new Map<string, SafetensorsFile>();
    try {
      for (const [tensor, name] of Object.entries(map as Record<string, string>)) {
        if (name.includes('/') || name.includes('\\')) throw new SafetensorsError(`${index}: tensor ${tensor} names file ${name}, outside the checkpoint's directory`);
        let f = byFile.get(name);
        if (!f) {
          const path = join(dir, name);
          if (!existsSync(path)) throw new SafetensorsError(`${index}: tensor ${tensor} is in ${name}, which does not exist`);
          f = SafetensorsFile.open(path);
          byFile.set(name, f);
        }
        if (!f.tensors.has(tensor)) throw new SafetensorsError(`${index}: tensor ${tensor} should be in ${name}, which does not have it`);
        where.set(tensor, f);
      }
      for (const f of byFile.values())
        for (const t of f.tensors.keys()) if (where.get(t) !== f) throw new SafetensorsError(`${f.file}: tensor ${t} is not in ${INDEX_FILE}'s weight map for this file`);
    } catch (e) {
      for (const f of byFile.values()) f.close();
      throw e;
    }
    return new SafetensorsCheckpoint(dir, [...byFile.values()], where);
  }

  names(): string[] {
    return [...this.where.keys()];
  }

  entry(name: string): TensorEntry | undefined {
    return this.where.get(name)?.tensors.get(name);
  }

  /** The file a tensor is in, for errors that name it. */
  fileOf(name: string): string {
    return this.where.get(name)?.file ?? this.dir;
  }

  read(name: string): Float32Array {
    const f = this.where.get(name);
    if (!f) throw new SafetensorsError(`${this.dir}: no tensor ${name}`);
    return f.read(name);
  }

  close(): void {
    for (const f of this.files) f.close();
  }
}
