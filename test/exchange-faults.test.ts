// Exchanges between real worker processes on a real nats-server survive bad chunks. During a
// checkpoint (a worker sends to the supervisor), a reallocation (one worker sends to another) and
// a restore (the supervisor sends to a worker), a third party publishes on the transfer's chunk
// subject, before the first real chunk: a chunk with a wrong digest, random bytes, a chunk that
// claims another sender and one of another exchange. Each exchange still completes with the
// clean bytes (digests compared), and the receiver asked the sender for the chunks those named.
// A sender that never sends a chunk again fails the exchange after the bounded requests, with an
// error naming the chunk, the sender and the tries.
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { planRealloc, shardSlices, sliceKey, sliceShape, type Layout } from '../mesh/parallel/index.ts';
import { connectBus, subscribe, type Bus, type NatsConnection } from '../mesh/wire/bus/bus.ts';
import { encode } from '../mesh/wire/messages/codec.ts';
import { startNatsServer, type PrivateNatsServer } from '../mesh/wire/server/nats-server.ts';
import { Heartbeat, Hello, PROTOCOL_VERSION, Ready, Receipt, type Checkpoint, type Party } from '../mesh/wire/messages/protocol.ts';
import { RESEND } from '../mesh/wire/transfer/resend.ts';
import { subjects } from '../mesh/wire/bus/subjects.ts';
import { BLOCK, blockDigests, chunkElements, chunksOf, listDigest, partyName, tensorDigest } from '../mesh/wire/transfer/transfer.ts';
import { modelInfo, type GptSpec } from '../engine/model/params.ts';
import { BusDispatcher } from '../engine/runtime/dispatch/bus-dispatcher.ts';
import { exchangeId, fetchCheckpoint, pushCheckpoint, runRealloc } from '../engine/runtime/dispatch/dispatch.ts';
import { spawnTs, type Spawned } from './helpers.ts';

const RUN = 'xfaults';
const subj = subjects(RUN);
/** Two 64 KiB blocks a chunk: the larger tensors travel as several chunks. */
const MAX = 2 * 64 * 1024 + 1024;
const spec: GptSpec = { kind: 'policy', vocab: 64, context: 16, layers: 1, width: 128, heads: 4 };
const info = modelInfo(spec);
const on = (device: number): Layout => ({ devices: [device], dp: 1, tp: 1, pp: 1 });
const shapes = shardSlices(info, on(0), 0).map((s) => ({ name: s.name, shape: sliceShape(s) }));

let server: PrivateNatsServer;
let nc: NatsConnection;
let d: BusDispatcher;
const workers: Spawned[] = [];
/** The source model's manifest on device 0: the clean digests every exchange must end with. */
let clean: Map<string, string>;
let cleanDigest: string;
const receipts: Receipt[] = [];

/**
 * The supervisor's bus, with a third party beside it: before the first go or chunk of an
 * exchange (whichever this side publishes first) the messages `forge` makes for it are published
 * on the same connection, so the server has them before any real chunk.
 */
let forge: ((subject: string) => Array<{ subject: string; data: Uint8Array }>) | undefined;
function withForger(bus: NatsConnection): Bus {
  return {
    publish: (subject, data) => {
      if (forge && (subject.endsWith('.go') || subject.includes('.chunk.'))) {
        for (const m of forge(subject)) bus.publish(m.subject, m.data);
        forge = undefined;
      }
      bus.publish(subject, data);
    },
    subscribe: (s, o) => bus.subscribe(s, o),
    request: (s, data, o) => bus.request(s, data, o),
    flush: () => bus.flush(),
    get info() {
      return bus.info;
    },
  };
}

/**
 * What a third party publishes on a transfer whose sender is `from`: a chunk of the largest tensor
 * at its last block with a wrong digest, random bytes, a chunk of the second largest that claims
 * another sender (its own digest right), and a chunk of another exchange. Returns the messages and
 * the places (`tensor@offset`) the receiver should ask for again.
 */
function forgeries(transfer: string, from: Party, tensors: Array<{ name: string; size: number }>) {
  const [big, second] = [...tensors].sort((a, b) => b.size - a.size) as [{ name: string; size: number }, { name: string; size: number }];
  expect(big.size).toBeGreaterThan(BLOCK);
  const chunk = (name: string, size: number, offset: number, claims: Party, digest?: string, id = transfer) => {
    const data = new Float32Array(Math.min(size - offset, chunkElements(MAX)));
    return encode({
      type: 'chunk',
      v: PROTOCOL_VERSION,
      transfer: id,
      from: claims,
      tensor: name,
      offset,
      total: size,
      data,
      digest: digest ?? listDigest(blockDigests(data)),
      whole: `blake3:${'0'.repeat(64)}`,
    });
  };
  const tail = Math.floor((big.size - 1) / BLOCK) * BLOCK;
  const other: Party = from === 'supervisor' ? 0 : 'supervisor';
  // Each on the subject of the party it claims, as a server without credentials lets anyone.
  const subject = subj.chunks(transfer, from);
  return {
    messages: [
      { subject, data: chunk(big.name, big.size, tail, from, `blake3:${'f'.repeat(64)}`) },
      { subject, data: randomBytes(4096) },
      { subject: subj.chunks(transfer, other), data: chunk(second.name, second.size, 0, other) },
      { subject, data: chunk(big.name, big.size, 0, from, undefined, 'another-exchange') },
    ],
    askedFor: [`${big.name}@${tail}`, `${second.name}@0`, `${big.name}@0`].sort(),
  };
}

async function manifest(device: number, model: string): Promise<{ digest: string; tensors: Map<string, string> }> {
  const m = await d.call(device, model, 0, { fn: 'manifest' });
  return { digest: m.digest, tensors: new Map(m.manifest.map((t) => [t.name, t.digest])) };
}

const load = (device: number, model: string, seed?: number) => d.call(device, model, 0, { fn: 'load', role: 'actor', spec, layout: on(device), rank: 0, ...(seed === undefined ? {} : { seed }) });

/** Resend requests seen from `from` on `transfer`, as `tensor@offset`, sorted. */
const askedBy = (from: Party, transfer: (t: string) => boolean) => receipts.flatMap((r) => (r.type === 'resend' && r.from === from && transfer(r.transfer) ? [`${r.tensor}@${r.offset}`] : [])).sort();

beforeAll(async () => {
  server = await startNatsServer({ config: `max_payload: ${MAX}` });
  nc = await connectBus(server.url, 'test-supervisor');
  const beats = new Set<number>();
  const beating = new Promise<void>((resolve) => {
    subscribe(
      nc,
      subj.heartbeats,
      Heartbeat,
      (b) => {
        beats.add(b.device);
        if (beats.size === 2) resolve();
      },
      () => {},
    );
  });
  // A worker that knows its device says hello on that device's join subject.
  for (const subject of [subj.join, subj.joins])
    subscribe(
      nc,
      subject,
      Hello,
      (hello, msg) => msg.respond(encode({ type: 'welcome', v: PROTOCOL_VERSION, device: hello.device ?? 0, run: RUN })),
      () => {},
    );
  subscribe(
    nc,
    subj.allReceipts,
    Receipt,
    (r) => receipts.push(r),
    () => {},
  );
  await nc.flush();
  for (const device of [0, 1]) workers.push(spawnTs('actors/worker.ts', ['--run', RUN, '--nats', server.url, '--device', String(device), '--backend', 'cpu']));
  await beating;
  d = new BusDispatcher(nc, subj, RUN, 60_000);
  await load(0, 'src', 5);
  const m = await manifest(0, 'src');
  clean = m.tensors;
  cleanDigest = m.digest;
}, 90_000);

afterAll(async () => {
  for (const w of workers) w.child.kill('SIGKILL');
  await nc?.close();
  await server?.stop();
});

describe('an exchange with forged messages on its transfer subject', () => {
  let checkpoint: Checkpoint;

  it('a checkpoint from a worker completes with the clean bytes, and the supervisor asked the worker again', async () => {
    const bus = withForger(nc);
    const sizes = shapes.map((s) => ({ name: `w:${s.name}`, size: s.shape.reduce((a, b) => a * b, 1) }));
    let transfer = '';
    let want: string[] = [];
    forge = (subject) => {
      transfer = subject.split('.')[3]!; // ferry.<run>.realloc.<id>.go
      const f = forgeries(transfer, 0, sizes);
      want = f.askedFor;
      return f.messages;
    };
    checkpoint = await fetchCheckpoint(bus, subj, (dev, m, i, b) => d.call(dev, m, i, b), 0, 'src', 0, shapes, false, MAX);
    expect(transfer).toMatch(/^ckpt-0-src-/);
    for (const t of checkpoint.tensors) expect(tensorDigest(t.data), t.name).toBe(clean.get(t.name));
    expect(askedBy('supervisor', (t) => t === transfer)).toEqual(want);
  });

  it('a reallocation from one worker to another completes with the clean bytes, and the receiver asked the sender again', async () => {
    await load(1, 'dst');
    const plan = planRealloc(info, on(0), on(1), () => 0);
    expect(plan.transfers.map((g) => [g.src, g.dsts])).toEqual([[0, [1]]]);
    const group = plan.transfers[0]!;
    const id = exchangeId('move');
    const transfer = `${id}-${group.index}`;
    const f = forgeries(
      transfer,
      0,
      group.pieces.map((p) => ({ name: sliceKey(p), size: sliceShape(p).reduce((a, b) => a * b, 1) })),
    );
    forge = () => f.messages;
    const out = await runRealloc(
      withForger(nc),
      subj,
      (dev, m, i, b) => d.call(dev, m, i, b),
      { id, iteration: 0, from: { model: 'src', layout: on(0) }, to: { model: 'dst', layout: on(1) }, plan },
      MAX,
    );
    expect(out.received_bytes).toBe(plan.minimumBytes);
    expect((await manifest(1, 'dst')).digest).toBe(cleanDigest);
    expect(askedBy(1, (t) => t === transfer)).toEqual(f.askedFor);
    // The receiving worker said what it dropped, once a message, naming the subject.
    const log = workers[1]!.output();
    const anySender = subj.transferChunks(transfer).replace('*', '');
    expect(log).toContain(`device 1 dropped a message on ${subj.chunks(transfer, 0)}: `);
    expect(log.split('\n').filter((l) => l.includes(`dropped a message on ${anySender}`))).toHaveLength(4);
  });

  it('a restore into a worker completes with the clean bytes, and the worker asked the supervisor again', async () => {
    await load(1, 'restored', 9);
    expect((await manifest(1, 'restored')).digest).not.toBe(cleanDigest);
    let transfer = '';
    let want: string[] = [];
    forge = (subject) => {
      transfer = subject.split('.')[3]!; // ferry.<run>.xfer.<id>.chunk.supervisor: the supervisor sends first
      const f = forgeries(
        transfer,
        'supervisor',
        shapes.map((s) => ({ name: `w:${s.name}`, size: s.shape.reduce((a, b) => a * b, 1) })),
      );
      want = f.askedFor;
      return f.messages;
    };
    await pushCheckpoint(withForger(nc), subj, (dev, m, i, b) => d.call(dev, m, i, b), 1, 'restored', 0, checkpoint, MAX);
    expect(transfer).toMatch(/^rstr-1-restored-/);
    expect((await manifest(1, 'restored')).digest).toBe(cleanDigest);
    expect(askedBy(1, (t) => t === transfer)).toEqual(want);
  });
});

describe('a sender that never sends a chunk again', () => {
  it('fails the restore after the bounded requests, naming the chunk, the sender and the tries, and changes nothing', async () => {
    await load(1, 'kept', 11);
    const before = (await manifest(1, 'kept')).digest;
    const id = exchangeId('never');
    const ready = new Promise<void>((resolve) =>
      subscribe(
        nc,
        subj.ready(id),
        Ready,
        () => resolve(),
        () => {},
      ),
    );
    await nc.flush();
    const refused = d.call(1, 'kept', 0, { fn: 'restore', realloc: id, transfer: id, step: 0, optimizer: false, ledger: [] });
    refused.catch(() => {});
    await ready;
    // Every chunk once, one of them with a flipped bit, then `sent` and go; requests go unanswered.
    const tensors = shapes.map((s) => ({ name: `w:${s.name}`, shape: s.shape, data: new Float32Array(s.shape.reduce((a, b) => a * b, 1)).fill(0.5) }));
    const chunks = [...chunksOf(id, tensors, MAX, { from: 'supervisor' })];
    const bad = chunks.findIndex((c) => c.offset > 0);
    chunks[bad] = { ...chunks[bad]!, data: chunks[bad]!.data.map((x, i) => (i === 3 ? x + 1 : x)) };
    for (const c of chunks) nc.publish(subj.chunks(id, 'supervisor'), encode(c));
    nc.publish(subj.chunks(id, 'supervisor'), encode({ type: 'sent', v: PROTOCOL_VERSION, transfer: id, from: 'supervisor', chunks: chunks.length, elements: chunkElements(MAX) }));
    nc.publish(subj.go(id), encode({ type: 'go', v: PROTOCOL_VERSION, realloc: id }));
    const { tensor, offset } = chunks[bad]!;
    await expect(refused).rejects.toThrow(
      `transfer ${id}: the chunk of tensor '${tensor}' at offset ${offset} from ${partyName('supervisor')} did not come intact after ${RESEND.tries} requests to send it again (the last problem: transfer ${id}, tensor '${tensor}' at offset ${offset}: chunk digest`,
    );
    expect(receipts.filter((r) => r.type === 'resend' && r.transfer === id).map((r) => r.type === 'resend' && r.attempt)).toEqual([1, 2, 3, 4]);
    expect((await manifest(1, 'kept')).digest).toBe(before);
  }, 30_000);
});
