// Chunked parameter transfer. A sender cuts each tensor into chunks no larger than the server's
// max payload, each with its offset and a SHA-256; a receiver checks every chunk, then every whole
// tensor against the manifest, and hands the tensors over only when all of them are complete.
import { createHash } from 'node:crypto';
import type { NatsConnection } from '@nats-io/transport-node';
import { encode } from './codec.ts';
import { subscribe } from './bus.ts';
import { PROTOCOL_VERSION, Chunk, type TensorManifest } from './protocol.ts';
import type { Subjects } from './subjects.ts';

export interface NamedTensor {
  name: string;
  shape: number[];
  data: Float32Array;
}

export class TransferError extends Error {
  override name = 'TransferError';
}

export function sha256(data: Float32Array | Uint8Array): string {
  return createHash('sha256').update(new Uint8Array(data.buffer, data.byteOffset, data.byteLength)).digest('hex');
}

/** SHA-256 over a whole model, tensor by tensor in the order given (names and shapes included). */
export function modelDigest(tensors: readonly NamedTensor[]): string {
  const h = createHash('sha256');
  for (const t of tensors) {
    h.update(`${t.name}:${t.shape.join('x')};`);
    h.update(new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength));
  }
  return h.digest('hex');
}

export function manifestOf(tensors: readonly NamedTensor[]): TensorManifest[] {
  return tensors.map((t) => ({ name: t.name, shape: [...t.shape], sha256: sha256(t.data) }));
}

/** Room left in a message for msgpack framing and the chunk's other fields. */
const CHUNK_OVERHEAD = 512;

export function chunkElements(maxPayload: number): number {
  const n = Math.floor((maxPayload - CHUNK_OVERHEAD) / 4);
  if (n < 1) throw new TransferError(`max payload ${maxPayload} leaves no room for a chunk`);
  return n;
}

export function* chunksOf(transfer: string, tensors: readonly NamedTensor[], chunkBytes: number): Generator<Chunk> {
  const per = chunkElements(chunkBytes);
  for (const t of tensors) {
    for (let offset = 0; offset < t.data.length || (offset === 0 && t.data.length === 0); offset += per) {
      const data = t.data.subarray(offset, Math.min(offset + per, t.data.length));
      yield {
        type: 'chunk',
        v: PROTOCOL_VERSION,
        transfer,
        tensor: t.name,
        offset,
        total: t.data.length,
        data,
        sha256: sha256(data),
      };
      if (t.data.length === 0) break;
    }
  }
}

/** Collects the chunks of one transfer and checks them against the manifest. */
export class Assembler {
  private readonly buffers = new Map<string, { spec: TensorManifest; data: Float32Array; filled: number; seen: Set<number> }>();
  private remaining: number;
  bytes = 0;
  chunks = 0;

  constructor(
    readonly transfer: string,
    manifest: readonly TensorManifest[],
  ) {
    for (const spec of manifest) {
      const size = spec.shape.reduce((a, b) => a * b, 1);
      this.buffers.set(spec.name, { spec, data: new Float32Array(size), filled: 0, seen: new Set() });
    }
    this.remaining = [...this.buffers.values()].reduce((n, b) => n + b.data.length, 0);
  }

  /** Takes one chunk; throws a TransferError saying what is wrong with it. */
  accept(chunk: Chunk): void {
    const where = `transfer ${this.transfer}, tensor '${chunk.tensor}' at offset ${chunk.offset}`;
    if (chunk.transfer !== this.transfer) throw new TransferError(`${where}: chunk belongs to transfer ${chunk.transfer}`);
    const buf = this.buffers.get(chunk.tensor);
    if (!buf) throw new TransferError(`${where}: tensor is not in the manifest`);
    if (chunk.total !== buf.data.length) {
      throw new TransferError(`${where}: expected a tensor of ${buf.data.length} elements, chunk says ${chunk.total}`);
    }
    if (chunk.offset + chunk.data.length > buf.data.length) {
      throw new TransferError(`${where}: ${chunk.data.length} elements run past the end (${buf.data.length})`);
    }
    const digest = sha256(chunk.data);
    if (digest !== chunk.sha256) throw new TransferError(`${where}: chunk digest ${digest} does not match ${chunk.sha256}`);
    // A chunk delivered again (a redelivery, a restarted sender) is harmless: its bytes are
    // verified and identical, so it is simply not counted twice.
    if (buf.seen.has(chunk.offset)) return;
    buf.seen.add(chunk.offset);
    buf.data.set(chunk.data, chunk.offset);
    buf.filled += chunk.data.length;
    this.remaining -= chunk.data.length;
    this.bytes += chunk.data.byteLength;
    this.chunks += 1;
  }

  get complete(): boolean {
    return this.remaining <= 0;
  }

  /** The tensors, in manifest order, once each matches its digest. */
  finish(): NamedTensor[] {
    const out: NamedTensor[] = [];
    for (const { spec, data, filled } of this.buffers.values()) {
      if (filled !== data.length) throw new TransferError(`transfer ${this.transfer}: tensor '${spec.name}' has ${filled} of ${data.length} elements`);
      const digest = sha256(data);
      if (digest !== spec.sha256) {
        throw new TransferError(`transfer ${this.transfer}: tensor '${spec.name}' digest ${digest} does not match the manifest's ${spec.sha256}`);
      }
      out.push({ name: spec.name, shape: spec.shape, data });
    }
    return out;
  }
}

/** Publishes every chunk of `tensors` on the transfer's subject; resolves once the server has them. */
export async function sendTensors(
  nc: NatsConnection,
  subj: Subjects,
  transfer: string,
  tensors: readonly NamedTensor[],
  chunkBytes: number,
): Promise<{ bytes: number; chunks: number }> {
  const subject = subj.chunks(transfer);
  let bytes = 0;
  let chunks = 0;
  for (const chunk of chunksOf(transfer, tensors, Math.min(chunkBytes, nc.info?.max_payload ?? chunkBytes))) {
    nc.publish(subject, encode(chunk));
    bytes += chunk.data.byteLength;
    chunks += 1;
    // Let the socket drain now and then instead of buffering a whole model in the client.
    if (chunks % 16 === 0) await nc.flush();
  }
  await nc.flush();
  return { bytes, chunks };
}

/**
 * Subscribes to a transfer, announces readiness, and resolves with the verified tensors.
 * Nothing is handed over until every tensor is complete and matches its digest.
 */
export async function receiveTensors(
  nc: NatsConnection,
  subj: Subjects,
  transfer: string,
  manifest: readonly TensorManifest[],
  device: number,
  timeoutMs: number,
): Promise<{ tensors: NamedTensor[]; bytes: number; chunks: number }> {
  const assembler = new Assembler(transfer, manifest);
  let unsubscribe = () => {};
  const done = new Promise<NamedTensor[]>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new TransferError(`transfer ${transfer}: incomplete after ${timeoutMs} ms (${assembler.chunks} chunks)`)),
      timeoutMs,
    );
    const settle = (fn: () => void) => {
      clearTimeout(timer);
      fn();
    };
    unsubscribe = subscribe(
      nc,
      subj.chunks(transfer),
      Chunk,
      (chunk) => {
        try {
          assembler.accept(chunk);
          if (assembler.complete) {
            const tensors = assembler.finish();
            settle(() => resolve(tensors));
          }
        } catch (err) {
          settle(() => reject(err));
        }
      },
      (err) => settle(() => reject(new TransferError(err.message, { cause: err }))),
    );
    if (assembler.complete) settle(() => resolve(assembler.finish()));
  });
  try {
    await nc.flush();
    nc.publish(subj.ready(transfer), encode({ type: 'ready', v: PROTOCOL_VERSION, transfer, device }));
    const tensors = await done;
    return { tensors, bytes: assembler.bytes, chunks: assembler.chunks };
  } finally {
    unsubscribe();
  }
}
