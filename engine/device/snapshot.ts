// A shard's state in and out of the run's snapshot buckets (mesh/wire/transfer/shelf.ts): what a device
// writes for the `snapshot` call, and what it reads back and checks for `reload`, before anything
// of the shard changes.
import {
  ObjectError,
  PROTOCOL_VERSION,
  ShardObject,
  decode,
  digestMismatch,
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
import { shardSlices, sliceShape } from '../../mesh/parallel/index.ts';
import { modelInfo, type GptRank } from '../model/index.ts';
import { CallRejected } from './checks.ts';

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

/** Writes the shard's state into `device`'s own bucket as one ShardObject; see the protocol's `snapshot`. */
export async function writeSnapshot(shelf: Shelf, device: number, h: HeldShard, model: string, iteration: number, body: CallOf<'snapshot'>): Promise<ResultOf<'snapshot'>> {
  const checkpoint = stateOf(h);
  const typed = checkpoint.tensors.reduce((n, t) => n + t.data.byteLength, 0) + (checkpoint.optimizer?.moments ?? []).reduce((n, m) => n + m.m.byteLength + m.v.byteLength, 0);
  const bytes = encodeSized({ type: 'shard', v: PROTOCOL_VERSION, model, layout: h.layout, rank: h.rank, iteration, checkpoint }, typed);
  return { bytes: bytes.length, digest: await shelf.put(device, body.object, bytes), state: stateDigest(checkpoint) };
}

/**
 * The state `reload` names, read from the bucket that holds it and checked against the manifest's
 * digest (in the algorithm it names), the model, this rank's slices and the optimizer the call expects; whatever is wrong
 * with the object, it is not the one the manifest names (digest_mismatch: a recovery goes back to
 * the snapshot before). Returns each slice's tensor in this rank's order, and the checkpoint.
 */
export async function readSnapshot(shelf: Shelf, h: HeldShard, model: string, body: CallOf<'reload'>): Promise<{ tensors: Checkpoint['tensors']; checkpoint: Checkpoint; bytes: number }> {
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
  const c = o.checkpoint;
  if ((c.optimizer !== undefined) !== body.optimizer)
    throw new CallRejected('invalid_state', `${at}: expected ${body.optimizer ? 'an' : 'no'} optimizer state, the object has ${c.optimizer ? 'one' : 'none'}`);
  const named = new Map(c.tensors.map((t) => [t.name, t]));
  const missing = mine.filter((sl) => named.get(sl.name)?.data.length !== sliceShape(sl).reduce((a, b) => a * b, 1));
  if (missing.length) throw new CallRejected('digest_mismatch', `${at} lacks, or has another size of, ${missing.map((sl) => sl.name).join(', ')}`);
  return { tensors: mine.map((sl) => named.get(sl.name)!), checkpoint: c, bytes: bytes.length };
}
