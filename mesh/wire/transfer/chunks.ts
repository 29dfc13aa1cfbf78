// Parameter bytes as chunks, and their integrity. A sender cuts each tensor into chunks no larger
// than the server's max payload, each with its offset and a digest; a receiver checks every chunk,
// then every whole tensor, and hands each tensor over only once it is complete. How chunks travel
// on the bus (and are asked for again) is transfer.ts.
//
// Digests are Merkle lists: a tensor is hashed in blocks of BLOCK elements (64 KiB of float32,
// SHA-256 each); a chunk's digest is the SHA-256 of its blocks' digests, and a tensor's the
// SHA-256 of all of its blocks' digests. Chunks hold whole blocks, so each side reads every byte
// once, and a tensor's digest does not depend on the chunk size the bus allows.
import { createHash } from 'node:crypto';
import { PROTOCOL_VERSION, type Chunk, type Party, type TensorManifest } from '../messages/protocol.ts';

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

/**
 * One chunk is wrong (bad digest, another transfer's, another sender's, a place that is not one of
 * the transfer's): the receiver drops it and asks for that chunk again; the transfer goes on.
 */
export class BadChunkError extends TransferError {
  override name = 'BadChunkError';
}

/** A party as messages name it: `device 3`, `the supervisor`. */
export function partyName(p: Party): string {
  return p === 'supervisor' ? 'the supervisor' : `device ${p}`;
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

/** A rank's whole state, as a checkpoint holds it and a device holds it: weights, optimizer and ledger. */
export interface RankState {
  tensors: readonly NamedTensor[];
  optimizer?: { step: number; moments: ReadonlyArray<{ name: string; m: Float32Array; v: Float32Array }> };
  ledger?: ReadonlyArray<{ iteration: number; rows: number; sha256: string; version?: number }>;
}

/**
 * One digest of a rank's state: its weights (as modelDigest), its optimizer's step and both
 * moments of every weight (zeros for one never stepped, as a checkpoint holds it), and its ledger.
 * A device's shard and a checkpoint of it hash alike, so a kept shard is proven to equal a
 * snapshot's rank without sending either.
 */
export function stateDigest(s: RankState): string {
  const h = createHash('sha256');
  const bytes = (a: Float32Array) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
  h.update(`weights ${modelDigest(s.tensors)};`);
  if (s.optimizer) {
    const moments = new Map(s.optimizer.moments.map((m) => [m.name, m]));
    h.update(`optimizer step ${s.optimizer.step};`);
    for (const t of s.tensors) {
      const m = moments.get(t.name);
      const zeros = m ? undefined : new Float32Array(t.data.length);
      h.update(`${t.name};`);
      h.update(bytes(m?.m ?? zeros!));
      h.update(bytes(m?.v ?? zeros!));
    }
  } else h.update('no optimizer;');
  for (const e of s.ledger ?? []) h.update(`ledger ${e.iteration} ${e.rows} ${e.sha256} ${e.version ?? '-'};`);
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

/** `from`: the sender the chunks name (the supervisor unless said). */
export function* chunksOf(transfer: string, tensors: Iterable<NamedTensor>, chunkBytes: number, { from = 'supervisor', times }: { from?: Party; times?: TransferTimes } = {}): Generator<Chunk> {
  const per = chunkElements(chunkBytes);
  const perChunk = per / BLOCK;
  for (const t of tensors) {
    const blocks = timed(times, 'hash', () => blockDigests(t.data));
    const whole = listDigest(blocks);
    let offset = 0;
    let b = 0;
    do {
      const data = t.data.subarray(offset, Math.min(offset + per, t.data.length));
      yield { type: 'chunk', v: PROTOCOL_VERSION, transfer, from, tensor: t.name, offset, total: t.data.length, data, sha256: listDigest(blocks.slice(b, b + perChunk)), whole };
      offset += per;
      b += perChunk;
    } while (offset < t.data.length);
  }
}

/**
 * The chunk of `t` that holds element `offset`, cut as chunksOf cuts it (`per` elements a chunk):
 * what a sender publishes again when a receiver asks. The same bytes and digests as the first
 * time; undefined for an offset outside the tensor. `whole`: the tensor's digest, when known.
 */
export function chunkAt(transfer: string, from: Party, t: NamedTensor, offset: number, per: number, whole?: string): Chunk | undefined {
  if (offset >= Math.max(t.data.length, 1)) return undefined;
  const start = offset - (offset % per);
  const data = t.data.subarray(start, Math.min(start + per, t.data.length));
  const sha256 = listDigest(blockDigests(data));
  return { type: 'chunk', v: PROTOCOL_VERSION, transfer, from, tensor: t.name, offset: start, total: t.data.length, data, sha256, whole: whole ?? tensorDigest(t.data) };
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
  /** Block digests, by block index, as chunks arrive. */
  blocks: Buffer[];
  whole?: string;
}

/**
 * Where a receiver that places chunks as they come puts one: elements [offset, offset + its
 * length) of tensor `name`, already checked against the chunk's digest.
 */
export type Place = (name: string, offset: number, data: Float32Array) => void;

export interface AssemblerOptions {
  /** The transfer's one sender: a chunk that names another is refused. Any sender, when absent. */
  from?: Party;
  /** Puts each checked chunk where it belongs instead of into a buffer of the whole tensor. */
  place?: Place;
  times?: TransferTimes;
}

/**
 * Collects the chunks of one transfer and checks them. With `place`, each checked chunk goes
 * straight to the receiver instead of into a buffer of the whole tensor, and a completed tensor is
 * checked against its digest from its blocks' digests alone.
 */
export class Assembler {
  private readonly buffers = new Map<string, Buffered>();
  /** Tensors not yet complete (an empty tensor counts until its one empty chunk comes). */
  private readonly pending = new Set<string>();
  private readonly from?: Party;
  private readonly place?: Place;
  private readonly times?: TransferTimes;
  bytes = 0;
  chunks = 0;

  constructor(
    readonly transfer: string,
    expected: readonly Expected[],
    options: AssemblerOptions = {},
  ) {
    ({ from: this.from, place: this.place, times: this.times } = options);
    for (const spec of expected) {
      const size = spec.shape.reduce((a, b) => a * b, 1);
      this.buffers.set(spec.name, { spec, size, filled: 0, blocks: [] });
      this.pending.add(spec.name);
    }
  }

  /** Tensors already handed over by `take`. */
  private readonly done = new Set<string>();

  /**
   * Takes one chunk; throws a BadChunkError saying what is wrong with it, or a TransferError when
   * the tensor it completes does not match its digest. Returns the tensor it completes, verified,
   * and forgets it (so a receiver can place it at once instead of holding every piece until the
   * end); otherwise undefined.
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

  /** Takes one chunk; throws a BadChunkError saying what is wrong with it. */
  accept(chunk: Chunk): void {
    const where = `transfer ${this.transfer}, tensor '${chunk.tensor}' at offset ${chunk.offset}`;
    const bad = (problem: string) => new BadChunkError(`${where}: ${problem}`);
    if (chunk.transfer !== this.transfer) throw bad(`chunk belongs to transfer ${chunk.transfer}`);
    if (this.from !== undefined && chunk.from !== this.from) throw bad(`chunk says it comes from ${partyName(chunk.from)}; this transfer's sender is ${partyName(this.from)}`);
    const buf = this.buffers.get(chunk.tensor);
    if (!buf) throw bad('tensor is not one this receiver expects');
    if (chunk.total !== buf.size) throw bad(`expected a tensor of ${buf.size} elements, chunk says ${chunk.total}`);
    if (chunk.offset + chunk.data.length > buf.size) throw bad(`${chunk.data.length} elements run past the end (${buf.size})`);
    if (chunk.offset % BLOCK !== 0) throw bad(`a chunk must start on a block boundary (${BLOCK} elements)`);
    if (chunk.data.length % BLOCK !== 0 && chunk.offset + chunk.data.length !== chunk.total) {
      throw bad(`only a tensor's last chunk may end between blocks; this one has ${chunk.data.length} elements`);
    }
    const blocks = timed(this.times, 'hash', () => blockDigests(chunk.data));
    const digest = listDigest(blocks);
    if (digest !== chunk.sha256) throw bad(`chunk digest ${digest} does not match ${chunk.sha256}`);
    if (buf.whole !== undefined && buf.whole !== chunk.whole) throw bad(`chunk says the tensor's digest is ${chunk.whole}, an earlier chunk said ${buf.whole}`);
    // A block that came before (a chunk sent again racing its first copy, a redelivery) must
    // have the same digest, and is not placed or counted twice; a different one is refused.
    const first = chunk.offset / BLOCK;
    const fresh = blocks.map((d, i) => {
      const held = buf.blocks[first + i];
      if (held && !held.equals(d)) throw bad(`block ${first + i} differs from the one an earlier chunk filled`);
      return held === undefined;
    });
    buf.whole = chunk.whole;
    if (!fresh.includes(true)) return;
    // Runs of new blocks, placed as they are: [from, to) in blocks of this chunk.
    for (let i = 0; i < fresh.length; ) {
      if (!fresh[i]) {
        i += 1;
        continue;
      }
      let j = i;
      while (j < fresh.length && fresh[j]) j += 1;
      const data = chunk.data.subarray(i * BLOCK, j * BLOCK);
      const offset = chunk.offset + i * BLOCK;
      if (this.place) timed(this.times, 'place', () => this.place!(chunk.tensor, offset, data));
      else {
        buf.data ??= new Float32Array(buf.size);
        buf.data.set(data, offset);
      }
      buf.filled += data.length;
      this.bytes += data.byteLength;
      i = j;
    }
    blocks.forEach((d, i) => (buf.blocks[first + i] = d));
    if (buf.filled === buf.size) this.pending.delete(chunk.tensor);
    this.chunks += 1;
  }

  /**
   * Whether the chunk holding element `offset` of `tensor` is one this receiver still lacks: a
   * tensor it expects and has not completed, a place inside it on a block boundary, not yet filled.
   */
  lacks(tensor: string, offset: number): boolean {
    const buf = this.buffers.get(tensor);
    if (!buf || this.done.has(tensor) || !this.pending.has(tensor)) return false;
    if (offset % BLOCK !== 0 || offset >= Math.max(buf.size, 1)) return false;
    return buf.blocks[offset / BLOCK] === undefined;
  }

  /** Where each chunk still lacking begins, for chunks of `per` elements (a whole number of blocks). */
  missing(per: number): Array<{ tensor: string; offset: number }> {
    const step = Math.max(BLOCK, per - (per % BLOCK));
    const out: Array<{ tensor: string; offset: number }> = [];
    for (const tensor of this.pending) {
      const buf = this.buffers.get(tensor)!;
      for (let offset = 0; offset < Math.max(buf.size, 1); offset += step) {
        const blocks = Math.ceil(Math.min(step, buf.size - offset) / BLOCK) || 1;
        for (let b = 0; b < blocks; b++) {
          if (buf.blocks[offset / BLOCK + b] === undefined) {
            out.push({ tensor, offset });
            break;
          }
        }
      }
    }
    return out;
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
