// msgpack on the wire; schemas at the boundary. Typed arrays travel as msgpack extensions
// (msgpackr `moreTypes`), so parameter bytes are never spelled out as lists of numbers.
//
// Parameter chunks, the bulk of the bytes, travel framed instead (see FRAME below): a small
// msgpack header, then the elements as they are in memory. The sender copies them once into the
// message; the receiver reads them where they arrived, with no decoding pass and, when they sit on
// a 4-byte boundary, no copy.
import { Packr } from 'msgpackr';
import type { z } from 'zod';
import { formatIssues, shortList } from './issues.ts';
import { PROTOCOL_VERSION } from './protocol.ts';

const packr = new Packr({ useRecords: false, moreTypes: true, mapsAsObjects: true });

export class ProtocolError extends Error {
  override name = 'ProtocolError';
  constructor(
    readonly subject: string,
    readonly problem: string,
    options?: { cause?: unknown },
  ) {
    super(`bad message on ${subject}: ${problem}`, options);
  }
}

/**
 * A message's bytes. A chunk is framed into the bytes `alloc` gives (at least the size asked, its
 * contents anything: every byte of the frame is written), a new array unless said.
 */
export function encode(message: { type: string; v: number; [key: string]: unknown }, alloc: (size: number) => Uint8Array = newBytes): Uint8Array {
  if (message.type === 'chunk' && message.data instanceof Float32Array) return frame(message, message.data, alloc);
  return packr.pack(message);
}

const newBytes = (size: number) => new Uint8Array(size);

/** Room a large message's map keys, names, shapes and small fields get beyond its typed arrays. */
const SIZED_SLACK = 64 << 10;

/**
 * A large message (a shard's state: megabytes of typed arrays) encoded as `encode` does, bit for
 * bit, into one array of its own sized from `typedBytes`, the bytes of its typed arrays. msgpackr's
 * shared buffer would grow to fit it by copying what it has written into one of twice its size (or
 * four times), more than once, and keep the largest for every message after: a snapshot cost as
 * much in those copies as in hashing it. Where the room is short after all, msgpackr grows it.
 */
export function encodeSized(message: { type: string; v: number; [key: string]: unknown }, typedBytes: number): Uint8Array {
  packr.useBuffer(Buffer.allocUnsafeSlow(typedBytes + SIZED_SLACK + Math.ceil(typedBytes / 100)));
  try {
    return packr.pack(message);
  } finally {
    // The next message starts in a small array of its own, not in what is left of this one.
    packr.useBuffer(Buffer.allocUnsafeSlow(8192));
  }
}

/**
 * A framed message: the 4 bytes FRAME, the header's length as a little-endian u32, the header (a
 * msgpack map: the message without its `data`), zeros up to a multiple of 4 bytes, then `data`'s
 * elements as little-endian float32 (the byte order of every platform Node.js runs on here).
 */
export const FRAME = new Uint8Array([0x46, 0x43, 0x48, 0x31]); // 'FCH1'

/** Bytes before a frame's header: the mark and the header's length. */
const FRAME_PREFIX = 8;

const align4 = (n: number) => (n + 3) & ~3;

function frame(message: { [key: string]: unknown }, data: Float32Array, alloc: (size: number) => Uint8Array): Uint8Array {
  const { data: _, ...rest } = message;
  const header = packr.pack(rest);
  const start = align4(FRAME_PREFIX + header.length);
  const out = alloc(start + data.byteLength).subarray(0, start + data.byteLength);
  out.set(FRAME, 0);
  new DataView(out.buffer, out.byteOffset, out.byteLength).setUint32(4, header.length, true);
  out.set(header, FRAME_PREFIX);
  out.fill(0, FRAME_PREFIX + header.length, start);
  out.set(new Uint8Array(data.buffer, data.byteOffset, data.byteLength), start);
  return out;
}

const isFramed = (bytes: Uint8Array) => bytes.length >= FRAME_PREFIX && bytes[0] === FRAME[0] && bytes[1] === FRAME[1] && bytes[2] === FRAME[2] && bytes[3] === FRAME[3];

/**
 * A frame's header with its elements as `data`: a view of `bytes` where they start on a 4-byte
 * boundary (valid while `bytes` is: a receiver checks and places a chunk before it returns), a copy
 * otherwise.
 */
function unframe(subject: string, bytes: Uint8Array): unknown {
  const length = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength).getUint32(4, true);
  if (FRAME_PREFIX + length > bytes.length) {
    throw new ProtocolError(subject, `a framed message of ${bytes.length} bytes says its header has ${length} bytes, past its end`);
  }
  let header: unknown;
  try {
    header = packr.unpack(bytes.subarray(FRAME_PREFIX, FRAME_PREFIX + length));
  } catch (cause) {
    throw new ProtocolError(subject, `a framed message's header (${length} bytes) is not msgpack: ${(cause as Error).message}`, { cause });
  }
  if (header === null || typeof header !== 'object' || Array.isArray(header)) {
    throw new ProtocolError(subject, `expected a framed message's header to be a msgpack map, got ${Array.isArray(header) ? 'an array' : typeof header}`);
  }
  if ('data' in header) throw new ProtocolError(subject, "a framed message's header may not hold 'data': its elements follow the header");
  const start = align4(FRAME_PREFIX + length);
  const size = bytes.length - Math.min(start, bytes.length);
  if (size % 4 !== 0) throw new ProtocolError(subject, `a framed message's elements are float32: expected a multiple of 4 bytes after the header, got ${size}`);
  const at = bytes.byteOffset + start;
  if (at % 4 === 0) return { ...header, data: new Float32Array(bytes.buffer, at, size / 4) };
  // (Not `bytes.slice`: on a Node.js Buffer, as messages come, it shares memory instead of copying.)
  const data = new Float32Array(size / 4);
  new Uint8Array(data.buffer).set(bytes.subarray(start));
  return { ...header, data };
}

/**
 * Bytes to a typed message, or a ProtocolError naming the subject and what was wrong.
 * `schema` is the set of messages this subject accepts.
 */
export function decode<S extends z.ZodType>(subject: string, bytes: Uint8Array, schema: S, expectVersion: number | readonly number[] = PROTOCOL_VERSION): z.infer<S> {
  let raw: unknown;
  if (isFramed(bytes)) raw = unframe(subject, bytes);
  else {
    try {
      raw = packr.unpack(bytes);
    } catch (cause) {
      throw new ProtocolError(subject, `not msgpack (${bytes.length} bytes): ${(cause as Error).message}`, { cause });
    }
  }
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) {
    throw new ProtocolError(subject, `expected a msgpack map with 'type' and 'v', got ${typeof raw}`);
  }
  const version = (raw as { v?: unknown }).v;
  const versions: readonly number[] = typeof expectVersion === 'number' ? [expectVersion] : expectVersion;
  if (!versions.includes(version as number)) {
    const named = versions.map((x) => `v=${x}`);
    const expected = named.length > 1 ? `${named.slice(0, -1).join(', ')} or ${named.at(-1)}` : named[0];
    throw new ProtocolError(subject, `expected protocol version ${expected}, got ${JSON.stringify(version) ?? 'none'}`);
  }
  const parsed = schema.safeParse(raw);
  if (!parsed.success) {
    const type = (raw as { type?: unknown }).type;
    // A few problems say what is wrong; a message with hundreds (a NaN in every score) must not
    // make an error of tens of kilobytes in a summary.
    const lines = shortList(formatIssues(parsed.error.issues, raw), 3);
    throw new ProtocolError(subject, `message type ${JSON.stringify(type)}: ${lines.join('; ')}`);
  }
  return parsed.data;
}
