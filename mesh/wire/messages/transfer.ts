// The messages of a transfer of parameters between parties (mesh/wire/transfer/): its chunks, the
// sender's end, the receivers' receipts, and the ready and go of a reallocation.
import { z } from 'zod';
import { Digest, f32, nat, pos, v } from './primitives.ts';

/** Who sends or receives a transfer: a device, by index, or the supervisor. */
export const Party = z.union([nat, z.literal('supervisor')]);
export type Party = z.infer<typeof Party>;

export const Chunk = z.strictObject({
  type: z.literal('chunk'),
  v,
  transfer: z.string(),
  /** The transfer's sender; a receiver drops a chunk from anyone else. */
  from: Party,
  tensor: z.string(),
  /** Offset and total length in elements of the tensor this chunk belongs to. */
  offset: nat,
  total: nat,
  data: f32,
  /** The chunk's digest: BLAKE3 of the BLAKE3s of its 64 KiB blocks, naming its algorithm (mesh/wire/transfer/chunks.ts). */
  digest: Digest,
  /** The whole tensor's digest, by the same scheme over all its blocks; checked once it is complete. */
  whole: Digest,
});
export type Chunk = z.infer<typeof Chunk>;

/**
 * The sender has published every chunk of the transfer once, `elements` elements per chunk (a
 * tensor's last chunk may hold fewer). It follows the chunks on their subject, so a receiver that
 * has it and still lacks a chunk knows that chunk was lost or dropped, and asks for it again.
 */
export const Sent = z.strictObject({ type: z.literal('sent'), v, transfer: z.string(), from: Party, chunks: nat, elements: pos });
export type Sent = z.infer<typeof Sent>;

/** What comes on a transfer's chunk subject. */
export const TransferMessage = z.discriminatedUnion('type', [Chunk, Sent]);
export type TransferMessage = z.infer<typeof TransferMessage>;

/**
 * A receiver asks the transfer's sender to publish again the chunk holding element `offset` of
 * `tensor`: it came with a bad digest, bad bytes or from someone else, or never came. `attempt`
 * counts this receiver's requests for that chunk (1 the first time); a receiver asks a bounded
 * number of times, then fails the transfer.
 */
export const Resend = z.strictObject({ type: z.literal('resend'), v, transfer: z.string(), from: Party, tensor: z.string(), offset: nat, attempt: pos });
export type Resend = z.infer<typeof Resend>;

/** A receiver holds every tensor of the transfer, verified: its sender need keep nothing more for it. */
export const Received = z.strictObject({ type: z.literal('received'), v, transfer: z.string(), from: Party });
export type Received = z.infer<typeof Received>;

/** What receivers tell a transfer's sender, on its receipt subject. */
export const Receipt = z.discriminatedUnion('type', [Resend, Received]);
export type Receipt = z.infer<typeof Receipt>;

/** A device of a reallocation is subscribed to everything it will receive, and listens for go. */
export const Ready = z.strictObject({ type: z.literal('ready'), v, realloc: z.string(), device: nat });
export type Ready = z.infer<typeof Ready>;
/** Everyone is ready: send. With `abort`, a device failed: stop waiting and give up. */
export const Go = z.strictObject({ type: z.literal('go'), v, realloc: z.string(), abort: z.boolean().optional() });
