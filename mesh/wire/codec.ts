// msgpack on the wire; schemas at the boundary. Typed arrays travel as msgpack extensions
// (msgpackr `moreTypes`), so parameter bytes are never spelled out as lists of numbers.
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

export function encode(message: { type: string; v: number; [key: string]: unknown }): Uint8Array {
  return packr.pack(message);
}

/**
 * Bytes to a typed message, or a ProtocolError naming the subject and what was wrong.
 * `schema` is the set of messages this subject accepts.
 */
export function decode<S extends z.ZodType>(subject: string, bytes: Uint8Array, schema: S, expectVersion: number = PROTOCOL_VERSION): z.infer<S> {
  let raw: unknown;
  try {
    raw = packr.unpack(bytes);
  } catch (cause) {
    throw new ProtocolError(subject, `not msgpack (${bytes.length} bytes): ${(cause as Error).message}`, { cause });
  }
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) {
    throw new ProtocolError(subject, `expected a msgpack map with 'type' and 'v', got ${typeof raw}`);
  }
  const version = (raw as { v?: unknown }).v;
  if (version !== expectVersion) {
    throw new ProtocolError(subject, `expected protocol version v=${expectVersion}, got ${JSON.stringify(version) ?? 'none'}`);
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
