// A shard's state in and out of the run's snapshot buckets (mesh/wire/transfer/shelf.ts): what a device
// writes for the `snapshot` call, and what it reads back and checks for `reload`, before anything
// of the shard changes.
import {
  BaseObject,
  ObjectError,
  PROTOCOL_VERSION,
  ShardObject,
  decode,
  digestMismatch,
  digestOf,
  encodeSized,
  shortDigest,
  stateDigest,
  type Checkpoint,
  type CallOf,
  type LedgerEntry,
  type Layout,
  type ResultOf,
  type Shelf,
} from '../../mesh/wire/index.ts';
import { layoutKey, shardSlices, sliceShape } from '../../mesh/parallel/index.ts';
import { modelDigest } from '../../mesh/wire/index.ts';
import { modelInfo, trains, type GptRank } from '../model/index.ts';
import { CallRejected } from './checks.ts';
import { slicesWhere } from './kept-bases.ts';

/** What of a hosted shard these need: where it is, its parameters and its ledger. */
export interface HeldShard {
  layout: Layout;
  rank: number;
  shard: GptRank;
  ledger: LedgerEntry[];
}

/**
 * The shard's state as a checkpoint holds it: its weight slices, the optimizer's step and both
 * moments of every weight (zeros for one never stepped, as a fresh slot holds them), its ledger.
 */
export function stateOf(h: HeldShard): Checkpoint {
  const tensors = h.shard.weights.exportTensors();
  const state = h.shard.weights.optimizerState();
  const moments = new Map((state?.moments ?? []).map((m) => [m.name, m]));
  const zeros = (n: number) => new Float32Array(n);
  return {
    tensors,
    ...(state
      ? { optimizer: { step: state.step, moments: tensors.map((t) => ({ name: t.name, m: moments.get(t.name)?.m ?? zeros(t.data.length), v: moments.get(t.name)?.v ?? zeros(t.data.length) })) } }
      : {}),
    ledger: [...h.ledger],
  };
}

/** Bytes of a checkpoint's typed arrays: what its encoding is sized for. */
const typedBytes = (c: Pick<Checkpoint, 'tensors' | 'optimizer'>): number =>
  c.tensors.reduce((n, t) => n + t.data.byteLength, 0) + (c.optimizer?.moments ?? []).reduce((n, m) => n + m.m.byteLength + m.v.byteLength, 0);

/**
 * Base objects this device has written or read, by name: their bytes' digest, and the digest of
 * the frozen tensors they hold (modelDigest). A model with adapters writes its frozen base once,
 * and each snapshot after names it; a reload onto a shard that still holds that base (its
 * tensors hash to it) reads the snapshot's trained part alone.
 */
export type KnownBases = Map<string, { digest: string; frozen: string; bytes: number }>;

/**
 * Whether a snapshot holds `name` as part of its base object: what does not train, or all of a
 * shard without an optimizer (a frozen model), as writeSnapshot splits them.
 */
const inBase = (spec: GptRank['spec'], optimizer: boolean, name: string) => !(optimizer && trains(spec, name));

/**
 * Of a model with adapters and an optimizer, the digest of its state's part that does not train
 * (modelDigest of those tensors, in order); undefined for any other. Two shards of one rank with
 * the same base differ only in what trains.
 */
export function baseDigest(spec: GptRank['spec'], optimizer: boolean, tensors: Checkpoint['tensors']): string | undefined {
  return spec.lora && optimizer ? modelDigest(tensors.filter((t) => inBase(spec, optimizer, t.name))) : undefined;
}

/**
 * Writes the shard's state into `device`'s own bucket as one ShardObject; see the protocol's
 * `snapshot`. What does not train — a model with adapters' frozen base, a frozen model (a reference)
 * whole — is an object of its own, named by its digest, so it is written again only when it
 * changes (never, while it does not train), and the snapshot's object holds what trains alone;
 * `state` is the whole state's digest either way.
 */
export async function writeSnapshot(
  shelf: Shelf,
  device: number,
  h: HeldShard,
  model: string,
  iteration: number,
  body: CallOf<'snapshot'>,
  bases: KnownBases = new Map(),
): Promise<ResultOf<'snapshot'>> {
  const checkpoint = stateOf(h);
  const state = stateDigest(checkpoint);
  const trained = (name: string) => !inBase(h.shard.spec, checkpoint.optimizer !== undefined, name);
  if (checkpoint.tensors.every((t) => trained(t.name))) {
    const bytes = encodeSized({ type: 'shard', v: PROTOCOL_VERSION, model, layout: h.layout, rank: h.rank, iteration, checkpoint }, typedBytes(checkpoint));
    return { bytes: bytes.length, digest: await shelf.put(device, body.object, bytes), state };
  }
  const frozen = checkpoint.tensors.filter((t) => !trained(t.name));
  const frozenDigest = modelDigest(frozen);
  // Named by its content and its place: a rank of another layout (after an elastic re-plan) may
  // hold the same base, but its object records the layout it was written on, and an object once
  // named by a snapshot is never written over.
  const name = `base-${digestOf(Buffer.from(`${frozenDigest} ${layoutKey(h.layout)}`))
    .replace(/^[a-z0-9]+:/, '')
    .slice(0, 24)}.${model}.r${h.rank}`;
  let written = 0;
  let digest = bases.get(name)?.digest;
  if (digest === undefined) {
    const bytes = encodeSized({ type: 'base', v: PROTOCOL_VERSION, model, layout: h.layout, rank: h.rank, tensors: frozen }, typedBytes({ tensors: frozen }));
    digest = await shelf.put(device, name, bytes);
    bases.set(name, { digest, frozen: frozenDigest, bytes: bytes.length });
    written = bytes.length;
  }
  const delta: Checkpoint = {
    tensors: checkpoint.tensors.filter((t) => trained(t.name)),
    ...(checkpoint.optimizer ? { optimizer: { step: checkpoint.optimizer.step, moments: checkpoint.optimizer.moments.filter((m) => trained(m.name)) } } : {}),
    ...(checkpoint.ledger ? { ledger: checkpoint.ledger } : {}),
  };
  const bytes = encodeSized({ type: 'shard', v: PROTOCOL_VERSION, model, layout: h.layout, rank: h.rank, iteration, checkpoint: delta, base: { object: name, digest } }, typedBytes(delta));
  return { bytes: written + bytes.length, digest: await shelf.put(device, body.object, bytes), state };
}

/**
 * A snapshot object's whole checkpoint: itself, or what trains from it and what does not (a model
 * with adapters' base, a frozen model whole) from the base object it names, read from the same bucket and checked — its
 * digest, model, layout and rank — with zero moments for the base, as a fresh slot holds them.
 * `fail` makes the error the reader raises.
 */
export async function wholeCheckpoint(get: (object: string) => Promise<Uint8Array | undefined>, o: ShardObject, at: string, fail: (message: string) => Error): Promise<Checkpoint> {
  return o.base ? onBase(o, (await readBase(get, o, o.base, at, fail)).tensors) : o.checkpoint;
}

/** The base object a snapshot object names, read and checked (see wholeCheckpoint); its tensors and its bytes' length. */
async function readBase(
  get: (object: string) => Promise<Uint8Array | undefined>,
  o: ShardObject,
  base: NonNullable<ShardObject['base']>,
  at: string,
  fail: (message: string) => Error,
): Promise<{ tensors: Checkpoint['tensors']; bytes: number }> {
  const where = `${at}: its base ${JSON.stringify(base.object)}`;
  let bytes: Uint8Array | undefined;
  try {
    bytes = await get(base.object);
  } catch (e) {
    if (e instanceof ObjectError) throw fail(`${where}: ${e.message}`);
    throw e;
  }
  if (!bytes) throw fail(`${where} is missing`);
  const actual = digestMismatch(bytes, base.digest);
  if (actual !== undefined) throw fail(`${where} changed since it was written: its digest is ${shortDigest(actual)}, the snapshot says ${shortDigest(base.digest)}`);
  let b: BaseObject;
  try {
    b = decode(where, bytes, BaseObject);
  } catch (e) {
    throw fail((e as Error).message);
  }
  if (b.model !== o.model || b.rank !== o.rank || JSON.stringify(b.layout) !== JSON.stringify(o.layout))
    throw fail(`${where} holds '${b.model}' rank ${b.rank} of layout [${b.layout.devices}], not '${o.model}' rank ${o.rank} of [${o.layout.devices}]`);
  return { tensors: b.tensors, bytes: bytes.length };
}

/** A snapshot object's checkpoint with its base's tensors before what trains, and zero moments for them. */
function onBase(o: ShardObject, base: Checkpoint['tensors']): Checkpoint {
  const c = o.checkpoint;
  const zeros = (n: number) => new Float32Array(n);
  // What trains (the adapters, a trained head) follows the base in the parameters' canonical order
  // (params.ts), so the base, then the rest, is that order.
  return {
    tensors: [...base, ...c.tensors],
    ...(c.optimizer ? { optimizer: { step: c.optimizer.step, moments: [...base.map((t) => ({ name: t.name, m: zeros(t.data.length), v: zeros(t.data.length) })), ...c.optimizer.moments] } } : {}),
    ...(c.ledger ? { ledger: c.ledger } : {}),
  };
}

/**
 * The base `o` names as this shard holds it now, when it is that base: an object this device wrote
 * or read (`bases`) with the same bytes' digest, whose frozen tensors' digest the shard's own
 * frozen slices hash to now. Undefined otherwise (the base is then read from the bucket).
 */
function heldBase(h: HeldShard, o: ShardObject, bases: KnownBases): Checkpoint['tensors'] | undefined {
  const known = o.base && bases.get(o.base.object);
  if (!known || known.digest !== o.base!.digest) return undefined;
  const tensors = slicesWhere(h.shard, (name) => inBase(h.shard.spec, h.shard.weights.trainable, name));
  return tensors.length > 0 && modelDigest(tensors) === known.frozen ? tensors : undefined;
}

/**
 * The state `reload` names, read from the bucket that holds it and checked against the manifest's
 * digest (in the algorithm it names), the model, this rank's slices and the optimizer the call expects; whatever is wrong
 * with the object, it is not the one the manifest names (digest_mismatch: a recovery goes back to
 * the snapshot before). Returns each slice's tensor in this rank's order, and the checkpoint.
 * The base object it names is read only where the shard does not hold that base already
 * (heldBase); `bytes`: what was read, `baseKeptBytes`: the base object's bytes not read.
 */
export async function readSnapshot(
  shelf: Shelf,
  h: HeldShard,
  model: string,
  body: CallOf<'reload'>,
  bases: KnownBases = new Map(),
): Promise<{ tensors: Checkpoint['tensors']; checkpoint: Checkpoint; bytes: number; baseKeptBytes: number }> {
  const { device, object, digest: expected } = body.object;
  const at = `'${model}' object ${JSON.stringify(object)} in device ${device}'s bucket`;
  let bytes: Uint8Array | undefined;
  try {
    bytes = await shelf.get(device, object);
  } catch (e) {
    if (e instanceof ObjectError) throw new CallRejected('digest_mismatch', `${at}: ${e.message}`);
    throw e;
  }
  if (!bytes) throw new CallRejected('digest_mismatch', `${at} is missing`);
  const actual = digestMismatch(bytes, expected);
  if (actual !== undefined) throw new CallRejected('digest_mismatch', `${at} changed since it was written: its digest is ${shortDigest(actual)}, the manifest says ${shortDigest(expected)}`);
  let o: ShardObject;
  try {
    o = decode(at, bytes, ShardObject);
  } catch (e) {
    throw new CallRejected('digest_mismatch', (e as Error).message);
  }
  const info = modelInfo(h.shard.spec);
  const mine = shardSlices(info, h.layout, h.rank);
  if (o.model !== model || JSON.stringify(shardSlices(info, o.layout, o.rank)) !== JSON.stringify(mine)) {
    throw new CallRejected('digest_mismatch', `${at} holds '${o.model}' rank ${o.rank} of layout [${o.layout.devices}], not the slices of rank ${h.rank} of [${h.layout.devices}] here`);
  }
  let read = bytes.length;
  let baseKeptBytes = 0;
  let c = o.checkpoint;
  if (o.base) {
    let base = heldBase(h, o, bases);
    if (base) baseKeptBytes = bases.get(o.base.object)!.bytes;
    else {
      const got = await readBase(
        (name) => shelf.get(device, name),
        o,
        o.base,
        at,
        (m) => new CallRejected('digest_mismatch', m),
      );
      read += got.bytes;
      base = got.tensors;
      bases.set(o.base.object, { digest: o.base.digest, frozen: modelDigest(base), bytes: got.bytes });
    }
    c = onBase(o, base);
  }
  if ((c.optimizer !== undefined) !== body.optimizer)
    throw new CallRejected('invalid_state', `${at}: expected ${body.optimizer ? 'an' : 'no'} optimizer state, the object has ${c.optimizer ? 'one' : 'none'}`);
  const named = new Map(c.tensors.map((t) => [t.name, t]));
  const missing = mine.filter((sl) => named.get(sl.name)?.data.length !== sliceShape(sl).reduce((a, b) => a * b, 1));
  if (missing.length) throw new CallRejected('digest_mismatch', `${at} lacks, or has another size of, ${missing.map((sl) => sl.name).join(', ')}`);
  return { tensors: mine.map((sl) => named.get(sl.name)!), checkpoint: c, bytes: read, baseKeptBytes };
}
