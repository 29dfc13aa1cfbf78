// Asking for chunks again. First the bookkeeping alone, over a hand-driven clock; then whole
// transfers on the in-memory bus, with chunks mangled in flight, lost, or forged by a third party:
// the receiver drops each bad one, asks its sender again, and ends bit-exact; a sender that never
// answers fails the transfer after the bounded requests, naming the chunk, the sender and the tries.
import { describe, expect, it } from 'vitest';
import { subscribe, type Bus } from '../bus/bus.ts';
import { encode } from '../messages/codec.ts';
import { MemoryBus } from '../bus/memory-bus.ts';
import { Chunk, PROTOCOL_VERSION, Receipt, TransferMessage } from '../messages/protocol.ts';
import { decode } from '../messages/codec.ts';
import { Resends } from './resend.ts';
import { subjects } from '../bus/subjects.ts';
import { chunkElements, chunksOf, offerTensors, receiveTensors, tensorDigest, type NamedTensor, type Offer } from './transfer.ts';

describe('Resends', () => {
  const policy = { afterMs: 100, tries: 3 };
  const lacking = (...keys: string[]) => {
    const set = new Set(keys);
    return (tensor: string, offset: number) => set.has(`${tensor}@${offset}`);
  };

  it('sends a new request at once, asks again only after the quiet time, and gives up after the last try', () => {
    const r = new Resends(policy);
    r.want('w', 0, 'bad digest');
    const lacks = lacking('w@0');
    expect(r.due(0, lacks).send.map((x) => [x.tensor, x.offset, x.tries])).toEqual([['w', 0, 1]]);
    expect(r.due(99, lacks).send).toEqual([]);
    expect(r.due(100, lacks).send.map((x) => x.tries)).toEqual([2]);
    expect(r.due(200, lacks).send.map((x) => x.tries)).toEqual([3]);
    const end = r.due(300, lacks);
    expect(end.send).toEqual([]);
    expect(end.exhausted).toMatchObject({ tensor: 'w', offset: 0, tries: 3, problem: 'bad digest' });
  });

  it('counts only quiet time: while the transfer moves, a request waits', () => {
    const r = new Resends(policy);
    r.want('w', 0, 'bad digest');
    const lacks = lacking('w@0');
    r.due(0, lacks);
    r.progress(90);
    expect(r.due(150, lacks).send).toEqual([]);
    expect(r.due(190, lacks).send.map((x) => x.tries)).toEqual([2]);
  });

  it('forgets a request whose chunk came, and a repeated want keeps one request with the latest problem', () => {
    const r = new Resends(policy);
    r.want('w', 0, 'first');
    r.want('w', 0, 'second');
    r.want('w', 16384, 'other');
    expect(r.size).toBe(2);
    r.due(0, lacking('w@0', 'w@16384'));
    expect(r.due(1000, lacking('w@16384')).send.map((x) => x.offset)).toEqual([16384]);
    expect(r.size).toBe(1);
    r.want('w', 16384, 'third');
    r.due(2000, lacking('w@16384'));
    expect(r.due(3000, lacking('w@16384')).exhausted?.problem).toBe('third');
  });
});

/** Deterministic, non-trivial float data. */
function tensor(name: string, size: number, salt = 0): NamedTensor {
  const data = new Float32Array(size);
  for (let i = 0; i < size; i++) data[i] = Math.sin(i * 1.37 + salt) * 100 + i / 7;
  return { name, shape: [size], data };
}

const bits = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString('hex');
/** One 64 KiB block of float32 per chunk. */
const ONE_BLOCK = 64 * 1024 + 1024;
const subj = subjects('resend');
/** For the tests of a sender that never answers; the others wait longer, so a slow machine is no failure. */
const fast = { afterMs: 40, tries: 3 };
const patient = { afterMs: 2000, tries: 3 };

/**
 * A bus whose first publish of each chunk goes through `mangle`, which may change or drop it (by
 * `tensor@offset`); what is published again passes untouched.
 */
function faulty(bus: Bus, mangle: (data: Uint8Array, at: string) => Uint8Array | undefined): Bus {
  const seen = new Set<string>();
  return {
    publish: (subject, data) => {
      if (!subject.includes('.chunk.') || !data) return bus.publish(subject, data);
      const m = decode(subject, data, TransferMessage);
      const at = m.type === 'chunk' ? `${m.tensor}@${m.offset}` : 'sent';
      const out = seen.has(at) ? data : mangle(data, at);
      seen.add(at);
      if (out) bus.publish(subject, out);
    },
    subscribe: (s, o) => bus.subscribe(s, o),
    request: (s, d, o) => bus.request(s, d, o),
    flush: () => bus.flush(),
    info: bus.info,
  };
}

function offer(transfer: string, tensors: NamedTensor[], to: Offer['to'], from: Offer['from'] = 2): Offer {
  const byName = new Map(tensors.map((t) => [t.name, t]));
  return { transfer, from, to, tensors: () => tensors, tensor: (name) => byName.get(name) };
}

/** Every receipt on the bus, for the test to see what was asked. */
function receipts(bus: Bus) {
  const seen: Receipt[] = [];
  subscribe(
    bus,
    subj.allReceipts,
    Receipt,
    (r) => seen.push(r),
    () => {},
  );
  return seen;
}

describe('a transfer on the in-memory bus', () => {
  const tensors = [tensor('a', 3 * 16384 + 5), tensor('b', 16384, 1), tensor('c', 0, 2)];
  const total = tensors.reduce((n, t) => n + t.data.byteLength, 0);

  async function receive(bus: Bus, transfer: string, me: number, from: number, warn?: (line: string) => void, resend = patient) {
    const got = new Map<string, Float32Array>();
    const incoming = receiveTensors(bus, subj, [{ transfer, expected: tensors.map(({ name, shape }) => ({ name, shape })), from }], 10_000, (t) => got.set(t.name, t.data), {
      me,
      resend,
      warn: warn ?? (() => {}),
    });
    await bus.flush();
    incoming.arm();
    return { incoming, got };
  }

  const exact = (got: Map<string, Float32Array>) => {
    for (const t of tensors) expect(bits(got.get(t.name)!), t.name).toBe(bits(t.data));
  };

  it('drops a chunk mangled in flight, or lost, asks for it again, and ends bit-exact', async () => {
    const bus = new MemoryBus();
    const seen = receipts(bus);
    const lines: string[] = [];
    const { incoming, got } = await receive(bus, 'x1', 1, 2, (l) => lines.push(l));
    // In flight, a@0 gets a bit flipped, a@16384 turns into random bytes, a@32768 is lost.
    const sending = faulty(bus, (data, at) => {
      if (at === 'a@16384') return new Uint8Array(200).map((_, i) => (i * 37 + 1) & 0xff);
      if (at === 'a@32768') return undefined;
      if (at === 'a@0') {
        const copy = data.slice();
        copy[copy.length - 300]! ^= 1; // inside the float32 payload, before the digests
        return copy;
      }
      return data;
    });
    const out = offerTensors(sending, subj, offer('x1', tensors, [1]), ONE_BLOCK, { timeoutMs: 10_000, warn: () => {} });
    expect((await out.send()).chunks).toBe(6); // a: 4, b: 1, c (empty): 1
    await incoming.done;
    await out.received;
    exact(got);
    expect(incoming.bytes()).toBe(total); // every element placed once, resends included
    expect(incoming.dropped()).toBe(2); // the random bytes and the flipped bit; the lost chunk never came
    const asked = seen.flatMap((r) => (r.type === 'resend' ? [`${r.tensor}@${r.offset}`] : []));
    // The flipped chunk at once; the random bytes' and the lost chunk once `sent` came.
    expect(asked.sort()).toEqual(['a@0', 'a@16384', 'a@32768']);
    expect(out.resent()).toBe(3);
    expect(seen.filter((r) => r.type === 'received')).toEqual([{ type: 'received', v: PROTOCOL_VERSION, transfer: 'x1', from: 1 }]);
    const prefix = `device 1 dropped a message on ${subj.chunks('x1', 2)}: `;
    expect(lines.filter((l) => l.startsWith(prefix) && /not msgpack|expected a msgpack map/.test(l))).toHaveLength(1);
    expect(lines.filter((l) => l.startsWith(prefix) && /chunk digest blake3:[0-9a-f]+ does not match .*; asking device 2 to send that chunk again$/.test(l))).toHaveLength(1);
    incoming.close();
    out.close();
  });

  it('drops forged chunks (wrong digest, wrong sender, another transfer, not msgpack), asks again, and places each element once', async () => {
    const bus = new MemoryBus();
    const seen = receipts(bus);
    const lines: string[] = [];
    const { incoming, got } = await receive(bus, 'x2', 1, 2, (l) => lines.push(l));
    const real = [...chunksOf('x2', tensors, ONE_BLOCK, { from: 2 })];
    const forged: Chunk[] = [
      { ...real[0]!, data: real[0]!.data.map((x) => x + 1) }, // a@0: bytes that do not match the digest
      { ...real[1]!, from: 7 }, // a@16384: right bytes, claims device 7
      { ...real[2]!, from: 'supervisor' }, // a@32768: claims the supervisor
      { ...real[4]!, transfer: 'x9' }, // b@0: another transfer's
    ];
    // A third party publishes before the sender does, each chunk on the subject of the party it
    // claims (as a server without credentials lets anyone).
    for (const c of forged) bus.publish(subj.chunks('x2', c.from), encode(c));
    bus.publish(subj.chunks('x2', 2), new Uint8Array([0xc1, 0x00, 0xff]));
    await bus.flush();
    expect(incoming.dropped()).toBe(5);
    const out = offerTensors(bus, subj, offer('x2', tensors, [1]), ONE_BLOCK, { timeoutMs: 10_000, warn: () => {} });
    await out.send();
    await incoming.done;
    await out.received;
    exact(got);
    expect(incoming.bytes()).toBe(total);
    const asked = seen.flatMap((r) => (r.type === 'resend' ? [`${r.tensor}@${r.offset}`] : []));
    expect(asked.sort()).toEqual(['a@0', 'a@16384', 'a@32768', 'b@0']);
    // Each bad message is one line, naming the subject and what was wrong.
    expect(lines).toHaveLength(5);
    expect(lines.every((l) => l.includes(subj.transferChunks('x2').replace('*', '')))).toBe(true);
    expect(lines.join('\n')).toMatch(/chunk digest blake3:[0-9a-f]+ does not match blake3:[0-9a-f]+/);
    expect(lines.join('\n')).toContain("chunk says it comes from device 7; this transfer's sender is device 2");
    expect(lines.join('\n')).toContain("chunk says it comes from the supervisor; this transfer's sender is device 2");
    expect(lines.join('\n')).toContain('chunk belongs to transfer x9');
    expect(lines.join('\n')).toContain('not msgpack');
    incoming.close();
    out.close();
  });

  it("drops a chunk or a `sent` on another party's subject than the one it names, and the sender ignores such a receipt", async () => {
    // On a closed bus the server lets a device publish on its own subjects only, so a message that
    // names its sender on someone else's subject is forged, however right its bytes.
    const bus = new MemoryBus();
    const seen = receipts(bus);
    const lines: string[] = [];
    const { incoming, got } = await receive(bus, 'x8', 1, 2, (l) => lines.push(l));
    const real = [...chunksOf('x8', tensors, ONE_BLOCK, { from: 2 })];
    const forgedData = real[4]!.data.map((x) => x + 1);
    const [forged] = [...chunksOf('x8', [{ name: 'b', shape: [16384], data: forgedData }], ONE_BLOCK, { from: 2 })];
    bus.publish(subj.chunks('x8', 7), encode(forged!));
    bus.publish(subj.chunks('x8', 7), encode({ type: 'sent', v: PROTOCOL_VERSION, transfer: 'x8', from: 2, chunks: 1, elements: chunkElements(ONE_BLOCK) }));
    await bus.flush();
    expect(incoming.dropped()).toBe(2);
    expect(lines.join('\n')).toContain(`dropped a message on ${subj.chunks('x8', 7)}: a 'chunk' that says it comes from device 2, on another party's subject`);
    const out = offerTensors(bus, subj, offer('x8', tensors, [1]), ONE_BLOCK, { timeoutMs: 10_000, warn: (l) => lines.push(l) });
    // A `received` for receiver 1, on device 9's subject: not heard as device 1's.
    bus.publish(subj.receipts('x8', 9), encode({ type: 'received', v: PROTOCOL_VERSION, transfer: 'x8', from: 1 }));
    await bus.flush();
    expect(lines.join('\n')).toContain(`ignored a 'received' on ${subj.receipts('x8', 9)}: it says it comes from device 1, on another party's subject`);
    await out.send();
    await incoming.done;
    await out.received;
    exact(got);
    expect(seen.filter((r) => r.type === 'received')).toHaveLength(2); // the forged one, and device 1's own
    incoming.close();
    out.close();
  });

  it('answers several receivers asking at once for one chunk with one publish', async () => {
    const bus = new MemoryBus();
    const r1 = await receive(bus, 'x3', 1, 2);
    const r2 = await receive(bus, 'x3', 3, 2);
    const [c0] = [...chunksOf('x3', tensors, ONE_BLOCK, { from: 2 })];
    const out = offerTensors(bus, subj, offer('x3', tensors, [1, 3]), ONE_BLOCK, { timeoutMs: 10_000, warn: () => {} });
    bus.publish(subj.chunks('x3', 2), encode({ ...c0!, digest: `blake3:${'0'.repeat(64)}` }));
    await bus.flush();
    await out.send();
    await Promise.all([r1.incoming.done, r2.incoming.done, out.received]);
    exact(r1.got);
    exact(r2.got);
    expect(r1.incoming.requests() + r2.incoming.requests()).toBe(2);
    expect(out.resent()).toBe(1);
  });

  it('waits for every receiver to say received, and hears neither requests nor receipts from anyone else', async () => {
    const bus = new MemoryBus();
    const lines: string[] = [];
    const out = offerTensors(bus, subj, offer('x4', [tensor('w', 10)], [1, 3]), ONE_BLOCK, { timeoutMs: 10_000, warn: (l) => lines.push(l) });
    await bus.flush();
    let settled = false;
    out.received.then(() => (settled = true));
    await out.send();
    const said = (from: number) => bus.publish(subj.receipts('x4', from), encode({ type: 'received', v: PROTOCOL_VERSION, transfer: 'x4', from }));
    said(1);
    said(9); // not a receiver
    bus.publish(subj.receipts('x4', 9), encode({ type: 'resend', v: PROTOCOL_VERSION, transfer: 'x4', from: 9, tensor: 'w', offset: 0, attempt: 1 }));
    await bus.flush();
    expect(settled).toBe(false);
    expect(out.resent()).toBe(0);
    expect(lines.filter((l) => l.includes('device 9: not a receiver of transfer x4'))).toHaveLength(2);
    said(3);
    await out.received;
    out.close();
  });

  it('fails the transfer after the bounded requests when the sender never sends a chunk again, naming it, the sender and the tries', async () => {
    const bus = new MemoryBus();
    const seen = receipts(bus);
    const { incoming } = await receive(bus, 'x5', 1, 2, undefined, fast);
    // A sender that publishes once, one chunk with a flipped bit, and never answers.
    const chunks = [...chunksOf('x5', tensors, ONE_BLOCK, { from: 2 })];
    chunks[1] = { ...chunks[1]!, data: chunks[1]!.data.map((x, i) => (i === 9 ? x + 1 : x)) };
    for (const c of chunks) bus.publish(subj.chunks('x5', 2), encode(c));
    bus.publish(subj.chunks('x5', 2), encode({ type: 'sent', v: PROTOCOL_VERSION, transfer: 'x5', from: 2, chunks: chunks.length, elements: chunkElements(ONE_BLOCK) }));
    await expect(incoming.done).rejects.toThrow(
      /^transfer x5: the chunk of tensor 'a' at offset 16384 from device 2 did not come intact after 3 requests to send it again \(the last problem: transfer x5, tensor 'a' at offset 16384: chunk digest blake3:[0-9a-f]+ does not match blake3:[0-9a-f]+\)$/,
    );
    expect(seen.filter((r) => r.type === 'resend').map((r) => r.type === 'resend' && r.attempt)).toEqual([1, 2, 3]);
    incoming.close();
  });

  it("asks for what never came once the sender's `sent` says it sent everything, and drops a `sent` from anyone else", async () => {
    const bus = new MemoryBus();
    const seen = receipts(bus);
    const lines: string[] = [];
    const { incoming } = await receive(bus, 'x6', 1, 2, (l) => lines.push(l), fast);
    const chunks = [...chunksOf('x6', tensors, ONE_BLOCK, { from: 2 })].filter((c) => c.tensor !== 'b');
    for (const c of chunks) bus.publish(subj.chunks('x6', 2), encode(c));
    const sent = { type: 'sent', v: PROTOCOL_VERSION, transfer: 'x6', chunks: chunks.length + 1, elements: chunkElements(ONE_BLOCK) };
    bus.publish(subj.chunks('x6', 5), encode({ ...sent, from: 5 }));
    await bus.flush();
    expect(seen).toEqual([]);
    expect(lines.join('\n')).toContain("'sent' for transfer x6 from device 5; this is transfer x6 from device 2");
    bus.publish(subj.chunks('x6', 2), encode({ ...sent, from: 2 }));
    await bus.flush();
    expect(seen[0]).toEqual({ type: 'resend', v: PROTOCOL_VERSION, transfer: 'x6', from: 1, tensor: 'b', offset: 0, attempt: 1 });
    await expect(incoming.done).rejects.toThrow(/tensor 'b' at offset 0 from device 2 did not come intact after 3 requests .*it never came, though device 2 says it sent all 6 chunks/);
    incoming.close();
  });

  it('a resent chunk carries the same bytes and digests as the first publish', async () => {
    const bus = new MemoryBus();
    const t = tensor('w', 5 * 16384 + 3);
    const first = [...chunksOf('x7', [t], ONE_BLOCK, { from: 2 })];
    const again: Chunk[] = [];
    const out = offerTensors(bus, subj, offer('x7', [t], [1]), ONE_BLOCK, { warn: () => {} });
    await out.send();
    subscribe(
      bus,
      subj.transferChunks('x7'),
      Chunk,
      (c) => again.push(c),
      () => {},
    );
    await bus.flush();
    for (const offset of [0, 16384 * 2 + 17, 5 * 16384 + 2]) {
      bus.publish(subj.receipts('x7', 1), encode({ type: 'resend', v: PROTOCOL_VERSION, transfer: 'x7', from: 1, tensor: 'w', offset, attempt: 1 }));
      await bus.flush();
    }
    expect(again.map((c) => c.offset)).toEqual([0, 32768, 81920]);
    for (const c of again) {
      const f = first.find((x) => x.offset === c.offset)!;
      expect({ ...c, data: bits(c.data) }).toEqual({ ...f, data: bits(f.data) });
      expect(c.whole).toBe(tensorDigest(t.data));
    }
    out.close();
  });
});
