// Parameter bytes as chunks, and their integrity. A sender cuts each tensor into chunks no larger
// than the server's max payload, each with its offset and a digest; a receiver checks every chunk,
// then every whole tensor, and hands each tensor over only once it is complete. How chunks travel
// on the bus (and are asked for again) is transfer.ts.
//
// Digests are Merkle lists: a tensor is hashed in blocks of BLOCK elements (64 KiB of float32,
// BLAKE3 each); a chunk's digest is the BLAKE3 of its blocks' digests, and a tensor's the BLAKE3
// of all of its blocks' digests. Chunks hold whole blocks, so each side reads every byte once, and
// a tensor's digest does not depend on the chunk size the bus allows. Every digest names its
// algorithm (`blake3:<hex>`, digest.ts), and a receiver checks a chunk in the algorithm it names.
import { PROTOCOL_VERSION, type Chunk, type Party, type TensorManifest } from '../messages/protocol.ts';
import { BUS_DIGEST, ALGORITHM_NAMES, bytesOf, digestAlgorithm, hasher, rawDigest, sameDigest, tagged, type DigestAlgorithm } from './digest.ts';

export * from './digest.ts';

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
  /** Digests of blocks (BLAKE3), on either side. */
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

/** A digest over a whole model, tensor by tensor in the order given (names and shapes included). */
export function modelDigest(tensors: readonly NamedTensor[], algorithm: DigestAlgorithm = BUS_DIGEST): string {
  const h = hasher(algorithm);
  for (const t of tensors) {
    h.update(`${t.name}:${t.shape.join('x')};`);
    h.update(bytesOf(t.data));
  }
  return h.digest();
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
export function stateDigest(s: RankState, algorithm: DigestAlgorithm = BUS_DIGEST): string {
  const h = hasher(algorithm);
  h.update(`weights ${modelDigest(s.tensors, algorithm)};`);
  if (s.optimizer) {
    const moments = new Map(s.optimizer.moments.map((m) => [m.name, m]));
    h.update(`optimizer step ${s.optimizer.step};`);
    for (const t of s.tensors) {
      const m = moments.get(t.name);
      const zeros = m ? undefined : new Float32Array(t.data.length);
      h.update(`${t.name};`);
      h.update(bytesOf(m?.m ?? zeros!));
      h.update(bytesOf(m?.v ?? zeros!));
    }
  } else h.update('no optimizer;');
  for (const e of s.ledger ?? []) h.update(`ledger ${e.iteration} ${e.rows} ${e.sha256} ${e.version ?? '-'};`);
  return h.digest();
}

/**
 * Elements per hashed block: 64 KiB of float32. Both sides of a transfer hash every byte, and a
 * chunk holds whole blocks. BLAKE3 over 64 KiB blocks runs at about 6 GB/s here (one native call
 * a block; over 16 KiB blocks at about 4.5, over 1 MiB at about 7.5), SHA-256 at about 2. Larger
 * blocks would hash a little faster but cut the chunks of a 1 MiB payload shorter (15 blocks of
 * 64 KiB fill 960 KiB, 3 of 256 KiB only 768), and a block is the smallest chunk there is.
 */
export const BLOCK = 16384;

/** The raw digest of each BLOCK-element block of `data` (the last may be shorter). */
export function blockDigests(data: Float32Array, algorithm: DigestAlgorithm = BUS_DIGEST): Buffer[] {
  const bytes = bytesOf(data);
  const out: Buffer[] = [];
  for (let o = 0; o < bytes.length || out.length === 0; o += BLOCK * 4) out.push(rawDigest(bytes.subarray(o, o + BLOCK * 4), algorithm));
  return out;
}

/** The digest of a list of raw block digests. */
export function listDigest(digests: readonly Buffer[], algorithm: DigestAlgorithm = BUS_DIGEST): string {
  return tagged(algorithm, rawDigest(digests.length === 1 ? digests[0]! : Buffer.concat(digests), algorithm));
}

/** A tensor's digest: the digest of its blocks' digests. */
export function tensorDigest(data: Float32Array, algorithm: DigestAlgorithm = BUS_DIGEST): string {
  return listDigest(blockDigests(data, algorithm), algorithm);
}

export function manifestOf(tensors: readonly NamedTensor[]): TensorManifest[] {
  return tensors.map((t) => ({ name: t.name, shape: [...t.shape], digest: tensorDigest(t.data) }));
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
      yield { type: 'chunk', v: PROTOCOL_VERSION, transfer, from, tensor: t.name, offset, total: t.data.length, data, digest: listDigest(blocks.slice(b, b + perChunk)), whole };
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
  const digest = listDigest(blockDigests(data));
  return { type: 'chunk', v: PROTOCOL_VERSION, transfer, from, tensor: t.name, offset: start, total: t.data.length, data, digest, whole: whole ?? tensorDigest(t.data) };
}

/** What a receiver expects of one tensor; a digest, when known in advance, is checked too (in the algorithm it names). */
export interface Expected {
  name: string;
  shape: number[];
  digest?: string;
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
  /** The algorithm its chunks' digests must name: the expected digest's, else this protocol's (BLAKE3). */
  algorithm: DigestAlgorithm;
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
      const algorithm = (spec.digest === undefined ? undefined : digestAlgorithm(spec.digest)) ?? BUS_DIGEST;
      this.buffers.set(spec.name, { spec, size, filled: 0, blocks: [], algorithm });
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
    // Checked in the algorithm the chunk's digest names, which must be its tensor's.
    const algorithm = digestAlgorithm(chunk.digest);
    if (!algorithm) throw bad(`chunk digest ${JSON.stringify(chunk.digest.slice(0, 80))} names no algorithm this receiver knows`);
    if (algorithm !== buf.algorithm) throw bad(`chunk digest is ${ALGORITHM_NAMES[algorithm]}; this tensor's digests are ${ALGORITHM_NAMES[buf.algorithm]}`);
    const blocks = timed(this.times, 'hash', () => blockDigests(chunk.data, algorithm));
    const digest = listDigest(blocks, algorithm);
    if (!sameDigest(digest, chunk.digest)) throw bad(`chunk digest ${digest} does not match ${chunk.digest}`);
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
    for (const { spec, size, data: held, filled, whole, blocks, algorithm } of buffers) {
      // A placed tensor's elements are with the receiver: what comes back is its name and shape.
      const data = held ?? new Float32Array(this.place ? 0 : size);
      if (filled !== size) throw new TransferError(`transfer ${this.transfer}: tensor '${spec.name}' has ${filled} of ${size} elements`);
      // Every block was checked on arrival; the tensor's digest follows from theirs.
      const digest = listDigest(blocks.length ? blocks : blockDigests(data, algorithm), algorithm);
      const want = spec.digest ?? whole;
      if (want === undefined || !sameDigest(digest, want)) {
        const whose = spec.digest ? "the manifest's" : "its sender's";
        throw new TransferError(`transfer ${this.transfer}: tensor '${spec.name}' digest ${digest} does not match ${whose} ${want}`);
      }
      out.push({ name: spec.name, shape: spec.shape, data });
    }
    return out;
  }
}
