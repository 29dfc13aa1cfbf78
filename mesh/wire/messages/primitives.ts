// The pieces every schema of ferry's bus is built from: the protocol version each message
// carries, typed arrays (msgpack extensions), and natural numbers.
import { z } from 'zod';

export const PROTOCOL_VERSION = 9;
export const v = z.literal(PROTOCOL_VERSION);

export const typed = <T>(ctor: new (...a: never[]) => T, name: string) => z.custom<T>((x) => x instanceof ctor, { message: `expected a ${name}` });
export const f32 = typed<Float32Array>(Float32Array, 'Float32Array');
export const i32 = typed<Int32Array>(Int32Array, 'Int32Array');
export const u32 = typed<Uint32Array>(Uint32Array, 'Uint32Array');
export const nat = z.number().int().nonnegative();
export const pos = z.number().int().positive();

/**
 * A digest of bytes on the bus (mesh/wire/transfer/digest.ts): `blake3:<64 hex>`, naming its
 * algorithm; 64 hex digits alone are SHA-256, as protocol version 6 and earlier wrote them.
 */
export const Digest = z.string();
