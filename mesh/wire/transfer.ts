// Chunked parameter transfer. A sender cuts each tensor into chunks no larger than the server's
// max payload, each with its offset and a digest; a receiver checks every chunk, then every whole
// tensor, and hands each tensor over only once it is complete.
//
// Digests are Merkle lists: a tensor is hashed in blocks of BLOCK elements (64 KiB of float32,
// SHA-256 each); a chunk's digest is the SHA-256 of its blocks' digests, and a tensor's the
// SHA-256 of all of its blocks' digests. Chunks hold whole blocks, so each side reads every byte
// once, and a tensor's digest does not depend on the chunk size the bus allows.
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

/**
 * Milliseconds an exchange spent on each kind of work, summed over its chunks: what the transfer
 * benchmark reports as where the time goes. Whatever a caller passes is added to.
 */
export interface TransferTimes {
  /** Reading parameters out of the model and cutting the pieces to send. */
  export: number;
  /** SHA-256 of blocks, on either side. */
  hash: number;
  /** msgpack encoding of chunks. */
  encode: number;
  /** Handing chunks to the client and flushing: the bus. */
  publish: number;
  /** msgpack decoding and the schema check of chunks received. */
  decode: number;
  /** Writing received and local pieces into the new weights, and making them the model's. */
  place: number;
}

export const noTimes = (): TransferTimes => ({ export: 0, hash: 0, encode: 0, publish: 0, decode: 0, place: 0 });

/** Runs `f`, adding its milliseconds to `times[key]` when there are times to keep. */
export function timed<T>(times: TransferTimes | undefined, key: keyof TransferTimes, f: () => T): T {
  if (!times) return f();
  const t0 = performance.now();
  try {
    return f();
  } finally {
    times[key] += performance.now() - t0;
  }
}

export class TransferError extends Error {
  override name = 'TransferError';
}

export function sha256(data: Float32Array | Uint8Array): string {
  return createHash('sha256')
    .update(new Uint8Array(data.buffer, data.byteOffset, data.byteLength))
    .digest('hex');
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

/**
 * Elements per hashed block: 64 KiB of float32. Larger blocks hash faster (SHA-256 over 16 KiB
 * blocks runs at about 780 MB/s with node's crypto, over 64 KiB blocks at about 1260 MB/s, the
 * difference being the per-hash call overhead), and both sides of a transfer hash every byte.
 */
export const BLOCK = 16384;

/** SHA-256 of each BLOCK-element block of `data` (the last may be shorter), raw. */
export function blockDigests(data: Float32Array): Buffer[] {
  const bytes = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  const out: Buffer[] = [];
  for (let o = 0; o < bytes.length || out.length === 0; o += BLOCK * 4)
    out.push(
      createHash('sha256')
        .update(bytes.subarray(o, o + BLOCK * 4))
        .digest(),
    );
  return out;
}

/** SHA-256 (hex) of a list of block digests. */
export function listDigest(digests: readonly Buffer[]): string {
  const h = createHash('sha256');
  for (const d of digests) h.update(d);
  return h.digest('hex');
}

/** A tensor's digest: the SHA-256 of its blocks' SHA-256s. */
export function tensorDigest(data: Float32Array): string {
  return listDigest(blockDigests(data));
}

export function manifestOf(tensors: readonly NamedTensor[]): TensorManifest[] {
  return tensors.map((t) => ({ name: t.name, shape: [...t.shape], sha256: tensorDigest(t.data) }));
}

/** Room left in a message for msgpack framing and the chunk's other fields. */
const CHUNK_OVERHEAD = 1024;

/** Elements per chunk: whole blocks that fit the max payload. */
export function chunkElements(maxPayload: number): number {
  const blocks = Math.floor((maxPayload - CHUNK_OVERHEAD) / (4 * BLOCK));
  if (blocks < 1) throw new TransferError(`max payload ${maxPayload} is too small for one block of ${BLOCK * 4} bytes`);
  return blocks * BLOCK;
}

export function* chunksOf(transfer: string, tensors: Iterable<NamedTensor>, chunkBytes: number, times?: TransferTimes): Generator<Chunk> {
  const per = chunkElements(chunkBytes);
  const perChunk = per / BLOCK;
  for (const t of tensors) {
    const blocks = timed(times, 'hash', () => blockDigests(t.data));
    const whole = listDigest(blocks);
    let offset = 0;
    let b = 0;
    do {
      const data = t.data.subarray(offset, Math.min(offset + per, t.data.length));
      yield { type: 'chunk', v: PROTOCOL_VERSION, transfer, tensor: t.name, offset, total: t.data.length, data, sha256: listDigest(blocks.slice(b, b + perChunk)), whole };
      offset += per;
      b += perChunk;
    } while (offset < t.data.length);
  }
}

/** What a receiver expects of one tensor; a digest, when known in advance, is checked too. */
export interface Expected {
  name: string;
  shape: number[];
  sha256?: string;
}

interface Buffered {
  spec: Expected;
  size: number;
  /**
   * Allocated when the first chunk comes, so a receiver holds only the tensors in flight; never,
   * when the assembler places each chunk where it belongs instead.
   */
  data?: Float32Array;
  filled: number;
  seen: Set<number>;
  /** Block digests, by block index, as chunks arrive. */
  blocks: Buffer[];
  whole?: string;
}

/**
 * Where a receiver that places chunks as they come puts one: elements [offset, offset + its
 * length) of tensor `name`, already checked against the chunk's digest.
 */
export type Place = (name: string, offset: number, data: Float32Array) => void;

/**
 * Collects the chunks of one transfer and checks them. With `place`, each checked chunk goes
 * straight to the receiver instead of into a buffer of the whole tensor, and a completed tensor is
 * checked against its digest from its blocks' digests alone.
 */
export class Assembler {
  private readonly buffers = new Map<string, Buffered>();
  /** Tensors not yet complete (an empty tensor counts until its one empty chunk comes). */
  private readonly pending = new Set<string>();
  bytes = 0;
  chunks = 0;

  constructor(
    readonly transfer: string,
    expected: readonly Expected[],
    private readonly place?: Place,
    private readonly times?: TransferTimes,
  ) {
    for (const spec of expected) {
      const size = spec.shape.reduce((a, b) => a * b, 1);
      this.buffers.set(spec.name, { spec, size, filled: 0, seen: new Set(), blocks: [] });
      this.pending.add(spec.name);
    }
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
    if (this.pending.has(chunk.tensor)) return undefined;
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
    if (chunk.total !== buf.size) {
      throw new TransferError(`${where}: expected a tensor of ${buf.size} elements, chunk says ${chunk.total}`);
    }
    if (chunk.offset + chunk.data.length > buf.size) {
      throw new TransferError(`${where}: ${chunk.data.length} elements run past the end (${buf.size})`);
    }
    if (chunk.offset % BLOCK !== 0) throw new TransferError(`${where}: a chunk must start on a block boundary (${BLOCK} elements)`);
    if (chunk.data.length % BLOCK !== 0 && chunk.offset + chunk.data.length !== chunk.total) {
      throw new TransferError(`${where}: only a tensor's last chunk may end between blocks; this one has ${chunk.data.length} elements`);
    }
    const blocks = timed(this.times, 'hash', () => blockDigests(chunk.data));
    const digest = listDigest(blocks);
    if (digest !== chunk.sha256) throw new TransferError(`${where}: chunk digest ${digest} does not match ${chunk.sha256}`);
    if (buf.whole !== undefined && buf.whole !== chunk.whole) {
      throw new TransferError(`${where}: chunk says the tensor's digest is ${chunk.whole}, an earlier chunk said ${buf.whole}`);
    }
    buf.whole = chunk.whole;
    // A chunk delivered again (a redelivery, a restarted sender) is harmless: its bytes are
    // verified and identical, so it is simply not counted twice. Any other overlap is an error.
    const first = chunk.offset / BLOCK;
    const repeat = blocks.every((d, i) => buf.blocks[first + i]?.equals(d));
    if (buf.seen.has(chunk.offset) && repeat) return;
    if (blocks.some((_, i) => buf.blocks[first + i] !== undefined)) {
      throw new TransferError(`${where}: overlaps blocks that an earlier chunk already filled`);
    }
    buf.seen.add(chunk.offset);
    if (this.place) timed(this.times, 'place', () => this.place!(chunk.tensor, chunk.offset, chunk.data));
    else {
      buf.data ??= new Float32Array(buf.size);
      buf.data.set(chunk.data, chunk.offset);
    }
    blocks.forEach((d, i) => (buf.blocks[first + i] = d));
    buf.filled += chunk.data.length;
    if (buf.filled === buf.size) this.pending.delete(chunk.tensor);
    this.bytes += chunk.data.byteLength;
    this.chunks += 1;
  }

  get complete(): boolean {
    return this.pending.size === 0;
  }

  /** The tensors, in the order expected, once each matches its digest. */
  finish(): NamedTensor[] {
    return this.verify([...this.buffers.values()]);
  }

  private verify(buffers: Buffered[]): NamedTensor[] {
    const out: NamedTensor[] = [];
    for (const { spec, size, data: held, filled, whole, blocks } of buffers) {
      // A placed tensor's elements are with the receiver: what comes back is its name and shape.
      const data = held ?? new Float32Array(this.place ? 0 : size);
      if (filled !== size) throw new TransferError(`transfer ${this.transfer}: tensor '${spec.name}' has ${filled} of ${size} elements`);
      // Every block was checked on arrival; the tensor's digest follows from theirs.
      const digest = listDigest(blocks.length ? blocks : blockDigests(data));
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

/** Chunks a sender publishes between two flushes. */
export const FLUSH_EVERY = 8;

/**
 * Flow control for a stream of publishes: after every FLUSH_EVERY of them, wait until the server
 * has the window before the last, then flush this one. The client never buffers more than two
 * windows, and the sender builds the next window (reads, hashes, encodes) while the bus carries
 * the last one, instead of stopping until each is through.
 */
export function pacer(nc: Bus, every = FLUSH_EVERY) {
  let n = 0;
  let pending: Promise<void> | undefined;
  return {
    /** Call after each publish. */
    async published(): Promise<void> {
      if (++n % every !== 0) return;
      await pending;
      pending = nc.flush();
      // Awaited at the next window or at the end; a failure meanwhile must not count as unhandled.
      pending.catch(() => {});
    },
    /** Resolves once the server has every publish. */
    async end(): Promise<void> {
      await pending;
      await nc.flush();
    },
  };
}

/** Publishes every chunk of `tensors` on the transfer's subject; resolves once the server has them. */
export async function sendTensors(nc: Bus, subj: Subjects, transfer: string, tensors: Iterable<NamedTensor>, chunkBytes: number, times?: TransferTimes): Promise<{ bytes: number; chunks: number }> {
  const subject = subj.chunks(transfer);
  let bytes = 0;
  let chunks = 0;
  const pace = pacer(nc);
  const wait = async (p: Promise<void>) => {
    const t0 = performance.now();
    await p;
    if (times) times.publish += performance.now() - t0;
  };
  for (const chunk of chunksOf(transfer, tensors, Math.min(chunkBytes, nc.info?.max_payload ?? chunkBytes), times)) {
    const message = timed(times, 'encode', () => encode(chunk));
    timed(times, 'publish', () => nc.publish(subject, message));
    bytes += chunk.data.byteLength;
    chunks += 1;
    await wait(pace.published());
  }
  await wait(pace.end());
  return { bytes, chunks };
}

export interface Incoming {
  /** Resolves once every expected tensor has arrived, verified, or rejects with what went wrong. */
  done: Promise<void>;
  /** Starts the timeout: call it when the senders have been told to send. */
  arm(): void;
  bytes(): number;
  chunks(): number;
  close(): void;
}

/**
 * Subscribes to the chunks of several transfers at once and hands each tensor to `onTensor` as
 * soon as it is complete and matches its digest, or, with a `Place` function instead, each chunk
 * as soon as it is checked (the tensor's digest is still checked once it is complete). `done`
 * settles when all have arrived, or at the first error. Call `close` when done.
 */
export function receiveTensors(
  nc: Bus,
  subj: Subjects,
  transfers: ReadonlyArray<{ transfer: string; expected: readonly Expected[] }>,
  timeoutMs: number,
  deliver: ((t: NamedTensor) => void) | { place: Place },
  times?: TransferTimes,
): Incoming {
  const place = typeof deliver === 'function' ? undefined : deliver.place;
  const onTensor = typeof deliver === 'function' ? deliver : () => {};
  const assemblers = transfers.map((t) => new Assembler(t.transfer, t.expected, place, times));
  const stops: Array<() => void> = [];
  let timer: NodeJS.Timeout | undefined;
  let arm = () => {};
  const done = new Promise<void>((resolve, reject) => {
    arm = () => {
      timer ??= setTimeout(() => {
        const got = assemblers.reduce((n, a) => n + a.chunks, 0);
        reject(new TransferError(`transfers ${transfers.map((t) => t.transfer).join(', ')}: incomplete ${timeoutMs} ms after they began (${got} chunks)`));
      }, timeoutMs);
    };
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
          { onDecoded: times && ((ms) => (times.decode += ms)) },
        ),
      );
    }
    check();
  });
  // Whoever awaits `done` sees a failure; an early one must not count as unhandled meanwhile.
  done.catch(() => {});
  return {
    done,
    arm: () => arm(),
    bytes: () => assemblers.reduce((n, a) => n + a.bytes, 0),
    chunks: () => assemblers.reduce((n, a) => n + a.chunks, 0),
    close: () => {
      clearTimeout(timer);
      stops.forEach((stop) => stop());
    },
  };
}
