// A shard's state to and from the supervisor: a checkpoint streamed to it on go, and a restore —
// the rank put back whole, or the shard held here moved onto another layout in place — from
// tensors the supervisor streams, or carries in the call where they fit one message.
import { assemble, pieceName, relaidSlices, shardSlices, sliceShape } from '../../mesh/parallel/index.ts';
import {
  BUS_DIGEST,
  digestAlgorithm,
  modelDigest,
  offerTensors,
  receiveTensors,
  sameDigest,
  shortList,
  tensorDigest,
  type CallOf,
  type Expected,
  type NamedTensor,
  type ResultOf,
} from '../../mesh/wire/index.ts';
import { GptRank, modelInfo, trains } from '../model/index.ts';
import { CallRejected } from './checks.ts';
import type { Hosted, ModelShard } from './device.ts';
import { awaitGo, type DeviceLink } from './exchange.ts';
import { stateOf, type HeldShard } from './snapshot.ts';

/** Puts `next` where `h` is hosted; false where `h` was dropped meanwhile. */
export type Replace = (h: Hosted, next: Hosted) => boolean;

/** Streams the shard's weights (and optimizer moments) on go; see the protocol's `checkpoint`. */
export async function sendCheckpoint(at: DeviceLink, h: Hosted, body: CallOf<'checkpoint'>): Promise<ResultOf<'checkpoint'>> {
  const timeout = at.options.transferTimeoutMs ?? 300_000;
  const state = stateOf(h as HeldShard);
  const out: NamedTensor[] = [
    ...state.tensors.map((t) => ({ ...t, name: `w:${t.name}` })),
    ...(state.optimizer?.moments ?? []).flatMap((m, i) => {
      const shape = state.tensors[i]!.shape;
      return [
        { name: `m:${m.name}`, shape, data: m.m },
        { name: `v:${m.name}`, shape, data: m.v },
      ];
    }),
  ];
  // Kept until the supervisor says it holds them all, to answer its requests to send a chunk again.
  const byName = new Map(out.map((t) => [t.name, t]));
  const outgoing = offerTensors(at.bus, at.subj, { transfer: body.transfer, from: at.index, to: ['supervisor'], tensors: () => out, tensor: (name) => byName.get(name) }, body.chunkBytes, {
    timeoutMs: timeout,
    warn: at.options.warn,
  });
  const signal = awaitGo(at, body.realloc, timeout);
  try {
    await signal.ready();
    await signal.go;
    const sent = await outgoing.send();
    await Promise.race([outgoing.received, signal.aborted]);
    return { step: state.optimizer?.step ?? 0, optimizer: state.optimizer !== undefined, bytes: sent.bytes, ledger: state.ledger ?? [] };
  } finally {
    signal.close();
    outgoing.close();
  }
}

/** Receives a streamed checkpoint and puts it back whole, or changes nothing. */
export async function restoreShard(at: DeviceLink, h: Hosted, body: CallOf<'restore'>, replace: Replace): Promise<ResultOf<'restore'>> {
  if (body.onto) return restoreOnto(at, h, body, body.onto, replace);
  const s = h.shard as ModelShard;
  const slices = shardSlices(modelInfo(s.spec), h.layout, h.rank);
  const expected = slices.flatMap((sl) => {
    const shape = sliceShape(sl);
    return [`w:${sl.name}`, ...(body.optimizer ? [`m:${sl.name}`, `v:${sl.name}`] : [])].map((name) => ({ name, shape }));
  });
  return fromSupervisor(at, body, expected, (got) => {
    s.weights.importTensors(slices.map((sl) => ({ ...got.get(`w:${sl.name}`)!, name: sl.name })));
    if (body.optimizer) {
      s.weights.loadOptimizerState({ step: body.step, moments: slices.map((sl) => ({ name: sl.name, m: got.get(`m:${sl.name}`)!.data, v: got.get(`v:${sl.name}`)!.data })) });
    }
    h.ledger = [...body.ledger];
    return restored(s, body);
  });
}

/** A restore's tensors, in the call or streamed by the supervisor on go; `apply` runs once every one has come. */
async function fromSupervisor<T>(at: DeviceLink, body: CallOf<'restore'>, expected: Expected[], apply: (got: Map<string, NamedTensor>) => T): Promise<T> {
  if (body.inline) return apply(inlineTensors(body.transfer, expected, body.inline));
  const got = new Map<string, NamedTensor>();
  const timeout = at.options.transferTimeoutMs ?? 300_000;
  const incoming = receiveTensors(at.bus, at.subj, [{ transfer: body.transfer, expected, from: 'supervisor' }], timeout, (t) => got.set(t.name, t), {
    me: at.index,
    warn: at.options.warn,
  });
  const signal = awaitGo(at, body.realloc, timeout);
  try {
    await signal.ready();
    incoming.arm();
    await Promise.race([incoming.done, signal.aborted]);
    return apply(got);
  } finally {
    signal.close();
    incoming.close();
  }
}

/**
 * Moves the shard held here onto `onto` (another layout, or the same one afresh): each new slice
 * is built from the elements it held and the pieces it lacks, which are all that is sent; the
 * optimizer's moments the same way, its step and the ledger from the call. Changes nothing
 * unless every piece arrives.
 */
async function restoreOnto(at: DeviceLink, h: Hosted, body: CallOf<'restore'>, onto: NonNullable<CallOf<'restore'>['onto']>, replace: Replace): Promise<ResultOf<'restore'>> {
  const old = h.shard;
  if (!(old instanceof GptRank)) throw new CallRejected('unsupported', `'${h.role}' holds no parameters to move`);
  if (h.serving) throw new CallRejected('unsupported', `'${h.role}' serves as a reward actor: it is restored whole`);
  if (onto.layout.devices[onto.rank] !== at.index)
    throw new CallRejected('invalid_state', `rank ${onto.rank} of layout [${onto.layout.devices}] is device ${onto.layout.devices[onto.rank]}, not this device ${at.index}`);
  const stale = new Set(onto.stale ?? []);
  const pieces = relaidSlices(modelInfo(old.spec), { layout: h.layout, rank: h.rank }, onto, (name) => stale.has(name));
  // What does not train (a frozen base beside adapters) has zero moments, as a snapshot holds it: none are sent.
  const moments = (name: string) => body.optimizer && trains(old.spec, name);
  const expected = pieces.flatMap((sl) =>
    sl.missing.flatMap((p) => [`w:${pieceName(p)}`, ...(moments(sl.slice.name) ? [`m:${pieceName(p)}`, `v:${pieceName(p)}`] : [])].map((name) => ({ name, shape: sliceShape(p) }))),
  );
  return fromSupervisor(at, body, expected, (got) => {
    const sent = (prefix: string) => (name: string) => got.get(`${prefix}:${name}`)!.data;
    const next = old.sibling(onto.layout, onto.rank);
    try {
      next.weights.importTensors(pieces.map((sl) => ({ name: sl.slice.name, shape: sliceShape(sl.slice), data: assemble(sl, (name) => old.weights.exportTensor(name), sent('w')) })));
      if (body.optimizer) {
        const state = old.weights.optimizerState();
        const held = new Map((state?.moments ?? []).map((m) => [m.name, m]));
        const moment = (k: 'm' | 'v') => (name: string) => held.get(name)?.[k] ?? new Float32Array(old.weights.exportTensor(name).length);
        const zeros = (sl: (typeof pieces)[number]) => new Float32Array(sliceShape(sl.slice).reduce((a, b) => a * b, 1));
        next.weights.loadOptimizerState({
          step: body.step,
          moments: pieces.map((sl) =>
            moments(sl.slice.name) ? { name: sl.slice.name, m: assemble(sl, moment('m'), sent('m')), v: assemble(sl, moment('v'), sent('v')) } : { name: sl.slice.name, m: zeros(sl), v: zeros(sl) },
          ),
        });
      }
    } catch (e) {
      next.dispose();
      throw e;
    }
    if (!replace(h, { role: h.role, layout: onto.layout, rank: onto.rank, shard: next, ledger: [...body.ledger] })) {
      next.dispose();
      throw new CallRejected('interrupted', `'${h.role}' was dropped from device ${at.index} while it was being moved`);
    }
    old.dispose();
    return restored(next, body);
  });
}

/** A restore's answer: where the call asks, the digest of the weights the shard holds now (as `manifest`'s). */
const restored = (s: ModelShard, body: CallOf<'restore'>): ResultOf<'restore'> => (body.digest ? { digest: modelDigest(s.weights.exportTensors()) } : {});

/**
 * A restore's tensors carried in its call, checked as chunks are: each one expected, once, of its
 * size, its digest its data's; every one there. Refused otherwise (`digest_mismatch` for a digest,
 * `malformed` for the rest), naming the tensor; nothing is applied.
 */
function inlineTensors(call: string, expected: readonly Expected[], inline: NonNullable<CallOf<'restore'>['inline']>): Map<string, NamedTensor> {
  const want = new Map(expected.map((e) => [e.name, e]));
  const got = new Map<string, NamedTensor>();
  for (const t of inline) {
    const e = want.get(t.name);
    if (!e) throw new CallRejected('malformed', `restore ${call}: '${t.name}' is not a tensor this restore expects`);
    if (got.has(t.name)) throw new CallRejected('malformed', `restore ${call}: '${t.name}' comes twice`);
    const size = e.shape.reduce((a, b) => a * b, 1);
    if (t.data.length !== size || t.shape.join('x') !== e.shape.join('x')) {
      throw new CallRejected('malformed', `restore ${call}: '${t.name}' is [${t.shape}] with ${t.data.length} elements; expected [${e.shape}], ${size}`);
    }
    // In the algorithm the call's digest names, as a chunk's is checked.
    const digest = tensorDigest(t.data, digestAlgorithm(t.digest) ?? BUS_DIGEST);
    if (!sameDigest(digest, t.digest)) throw new CallRejected('digest_mismatch', `restore ${call}: '${t.name}' digest ${digest} does not match the call's ${t.digest}`);
    got.set(t.name, { name: t.name, shape: e.shape, data: t.data });
  }
  const missing = expected.filter((e) => !got.has(e.name)).map((e) => `'${e.name}'`);
  if (missing.length) throw new CallRejected('malformed', `restore ${call}: the call lacks ${shortList(missing, 3).join(', ')} of the ${expected.length} tensors it restores`);
  return got;
}
