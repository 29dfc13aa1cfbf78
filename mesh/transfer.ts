// Chunked parameter transfer. A sender cuts each tensor into chunks no larger than the server's
// max payload, each with its offset and a SHA-256; a receiver checks every chunk, then every whole
// tensor against the manifest, and hands the tensors over only when all of them are complete.
import { createHash } from 'node:crypto';
import { encode } from './codec.ts';
import { subscribe, type Bus } from './bus.ts';
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

export function* chunksOf(transfer: string, tensors: Iterable<NamedTensor>, chunkBytes: number): Generator<Chunk> {
  const per = chunkElements(chunkBytes);
  for (const t of tensors) {
    const whole = sha256(t.data);
    let offset = 0;
    do {
      const data = t.data.subarray(offset, Math.min(offset + per, t.data.length));
      yield { type: 'chunk', v: PROTOCOL_VERSION, transfer, tensor: t.name, offset, total: t.data.length, data, sha256: sha256(data), whole };
      offset += per;
    } while (offset < t.data.length);
  }
}

/** What a receiver expects of one tensor; a digest, when known in advance, is checked too. */
export interface Expected {
  name: string;
  shape: number[];
  sha256?: string;
}

/** Collects the chunks of one transfer and checks them. */
export class Assembler {
  private readonly buffers = new Map<string, { spec: Expected; data: Float32Array; filled: number; seen: Set<number>; whole?: string }>();
  private remaining: number;
  bytes = 0;
  chunks = 0;

  constructor(
    readonly transfer: string,
    expected: readonly Expected[],
  ) {
    for (const spec of expected) {
      const size = spec.shape.reduce((a, b) => a * b, 1);
      this.buffers.set(spec.name, { spec, data: new Float32Array(size), filled: 0, seen: new Set() });
    }
    this.remaining = [...this.buffers.values()].reduce((n, b) => n + b.data.length, 0);
  }

  /** Tensors already handed over by `take`. */
  private readonly done = new Set<string>();

  /**
   * Takes one chunk; throws a TransferError saying what is wrong with it. Returns the tensor it
   * completes, verified against its digest, and forgets it (so a receiver can place it at once
   * instead of holding every piece until the end); otherwise undefined.
   */
  take(chunk: Chunk): NamedTensor | undefined {
    if (this.done.has(chunk.tensor)) return undefined; // a repeat of a finished tensor
    this.accept(chunk);
    const buf = this.buffers.get(chunk.tensor)!;
    if (buf.filled !== buf.data.length) return undefined;
    const [t] = this.verify([buf]);
    this.buffers.delete(chunk.tensor);
    this.done.add(chunk.tensor);
    return t;
  }

  /** Takes one chunk; throws a TransferError saying what is wrong with it. */
  accept(chunk: Chunk): void {
    const where = `transfer ${this.transfer}, tensor '${chunk.tensor}' at offset ${chunk.offset}`;
    if (chunk.transfer !== this.transfer) throw new TransferError(`${where}: chunk belongs to transfer ${chunk.transfer}`);
    const buf = this.buffers.get(chunk.tensor);
    if (!buf) throw new TransferError(`${where}: tensor is not one this receiver expects`);
    if (chunk.total !== buf.data.length) {
      throw new TransferError(`${where}: expected a tensor of ${buf.data.length} elements, chunk says ${chunk.total}`);
    }
    if (chunk.offset + chunk.data.length > buf.data.length) {
      throw new TransferError(`${where}: ${chunk.data.length} elements run past the end (${buf.data.length})`);
    }
    const digest = sha256(chunk.data);
    if (digest !== chunk.sha256) throw new TransferError(`${where}: chunk digest ${digest} does not match ${chunk.sha256}`);
    if (buf.whole !== undefined && buf.whole !== chunk.whole) {
      throw new TransferError(`${where}: chunk says the tensor's digest is ${chunk.whole}, an earlier chunk said ${buf.whole}`);
    }
    buf.whole = chunk.whole;
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

  /** The tensors, in the order expected, once each matches its digest. */
  finish(): NamedTensor[] {
    return this.verify([...this.buffers.values()]);
  }

  private verify(buffers: Array<{ spec: Expected; data: Float32Array; filled: number; whole?: string }>): NamedTensor[] {
    const out: NamedTensor[] = [];
    for (const { spec, data, filled, whole } of buffers) {
      if (filled !== data.length) throw new TransferError(`transfer ${this.transfer}: tensor '${spec.name}' has ${filled} of ${data.length} elements`);
      const digest = sha256(data);
      const want = spec.sha256 ?? whole;
      if (digest !== want) {
        const whose = spec.sha256 ? "the manifest's" : "its sender's";
        throw new TransferError(`transfer ${this.transfer}: tensor '${spec.name}' digest ${digest} does not match ${whose} ${want}`);
      }
      out.push({ name: spec.name, shape: spec.shape, data });
    }
    return out;
  }
}

/** Publishes every chunk of `tensors` on the transfer's subject; resolves once the server has them. */
export async function sendTensors(
  nc: Bus,
  subj: Subjects,
  transfer: string,
  tensors: Iterable<NamedTensor>,
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

export interface Incoming {
  /** Resolves once every expected tensor has arrived, verified, or rejects with what went wrong. */
  done: Promise<void>;
  bytes(): number;
  chunks(): number;
  close(): void;
}

/**
 * Subscribes to the chunks of several transfers at once and hands each tensor to `onTensor` as
 * soon as it is complete and matches its digest. `done` settles when all have arrived, or at the
 * first error. Call `close` when done.
 */
export function receiveTensors(
  nc: Bus,
  subj: Subjects,
  transfers: ReadonlyArray<{ transfer: string; expected: readonly Expected[] }>,
  timeoutMs: number,
  onTensor: (t: NamedTensor) => void,
): Incoming {
  const assemblers = transfers.map((t) => new Assembler(t.transfer, t.expected));
  const stops: Array<() => void> = [];
  let timer: NodeJS.Timeout | undefined;
  const done = new Promise<void>((resolve, reject) => {
    timer = setTimeout(() => {
      const got = assemblers.reduce((n, a) => n + a.chunks, 0);
      reject(new TransferError(`transfers ${transfers.map((t) => t.transfer).join(', ')}: incomplete after ${timeoutMs} ms (${got} chunks)`));
    }, timeoutMs);
    const check = () => {
      if (assemblers.every((a) => a.complete)) {
        clearTimeout(timer);
        resolve();
      }
    };
    for (const a of assemblers) {
      stops.push(
        subscribe(
          nc,
          subj.chunks(a.transfer),
          Chunk,
          (chunk) => {
            try {
              const t = a.take(chunk);
              if (t) onTensor(t);
            } catch (err) {
              clearTimeout(timer);
              reject(err);
              return;
            }
            check();
          },
          (err) => {
            clearTimeout(timer);
            reject(new TransferError(err.message, { cause: err }));
          },
        ),
      );
    }
    check();
  });
  // Whoever awaits `done` sees a failure; an early one must not count as unhandled meanwhile.
  done.catch(() => {});
  return {
    done,
    bytes: () => assemblers.reduce((n, a) => n + a.bytes, 0),
    chunks: () => assemblers.reduce((n, a) => n + a.chunks, 0),
    close: () => {
      clearTimeout(timer);
      stops.forEach((stop) => stop());
    },
  };
}
