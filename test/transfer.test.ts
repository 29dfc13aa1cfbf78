// Parameter bytes across a real nats-server whose max_payload is small, so that tensors must be
// cut into chunks: they arrive bit-exact; a chunk with a wrong digest or bad bytes is dropped and
// asked for again, and the transfer still completes bit-exact; a tensor whose bytes differ from the
// manifest is refused.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectBus, type NatsConnection } from '../mesh/wire/bus/bus.ts';
import { encode } from '../mesh/wire/messages/codec.ts';
import { startNatsServer, type PrivateNatsServer } from '../mesh/wire/server/nats-server.ts';
import { subjects } from '../mesh/wire/bus/subjects.ts';
import { Receipt } from '../mesh/wire/messages/protocol.ts';
import { subscribe } from '../mesh/wire/bus/bus.ts';
import { chunkElements, chunksOf, manifestOf, offerTensors, receiveTensors, type Expected, type NamedTensor } from '../mesh/wire/transfer/transfer.ts';

// Room for 3 whole 64 KiB blocks of parameters and part of a fourth: (256 KiB − 1024) / 64 KiB
// = 3.98 → 3 blocks = 49152 elements per chunk, so the 300000-element tensor travels as 7 chunks.
const MAX = 256 * 1024;
let server: PrivateNatsServer;
let a: NatsConnection;
let b: NatsConnection;
const subj = subjects('xfer');

function tensors(): NamedTensor[] {
  const big = new Float32Array(300_000).map((_, i) => Math.sin(i) * 1e3);
  const small = new Float32Array([1, -0, Number.MIN_VALUE, 3.4e38]);
  return [
    { name: 'big', shape: [600, 500], data: big },
    { name: 'small', shape: [4], data: small },
  ];
}

/** Subscribes `b` to a transfer from `a` (device 0) and waits until the server has the subscription. */
async function receiving(transfer: string, expected: Expected[], lines: string[] = []) {
  const got: NamedTensor[] = [];
  const incoming = receiveTensors(b, subj, [{ transfer, expected, from: 0 }], 20_000, (t) => got.push(t), { me: 1, warn: (l) => lines.push(l) });
  await b.flush();
  incoming.arm();
  return { ...incoming, got };
}

/** `a` offers the tensors to `b` (device 1), answering its requests to send a chunk again. */
async function offering(transfer: string, ts: NamedTensor[], chunkBytes = 1 << 20) {
  const out = offerTensors(a, subj, { transfer, from: 0, to: [1], tensors: () => ts, tensor: (name) => ts.find((t) => t.name === name) }, chunkBytes, { timeoutMs: 20_000, warn: () => {} });
  await a.flush();
  return out;
}

const same = (x: Float32Array, y: Float32Array) => Buffer.from(x.buffer, x.byteOffset, x.byteLength).equals(Buffer.from(y.buffer, y.byteOffset, y.byteLength));

beforeAll(async () => {
  server = await startNatsServer({ config: `max_payload: ${MAX}` });
  a = await connectBus(server.url, 'sender');
  b = await connectBus(server.url, 'receiver');
});

afterAll(async () => {
  await a?.close();
  await b?.close();
  await server?.stop();
});

describe('chunked transfers over NATS', () => {
  it('cuts tensors to the server max payload and delivers them bit-exact', async () => {
    expect(a.info!.max_payload).toBe(MAX);
    const ts = tensors();
    const incoming = await receiving('t1', manifestOf(ts));
    const recv = incoming.done;
    const out = await offering('t1', ts);
    const sent = await out.send();
    await recv;
    await out.received;
    out.close();
    const got = incoming.got;
    const per = chunkElements(MAX);
    expect(sent.chunks).toBe(Math.ceil(300_000 / per) + 1);
    expect(incoming.chunks()).toBe(sent.chunks);
    expect(incoming.bytes()).toBe((300_000 + 4) * 4);
    incoming.close();
    for (const [i, t] of got.entries()) {
      expect(t.name).toBe(ts[i]!.name);
      expect(same(t.data, ts[i]!.data)).toBe(true);
    }
  });

  it('drops a chunk whose bytes do not match its digest, asks for it again, and completes bit-exact', async () => {
    const ts = tensors();
    const asked: Receipt[] = [];
    const stop = subscribe(
      b,
      subj.transferReceipts('t2'),
      Receipt,
      (r) => asked.push(r),
      () => {},
    );
    const lines: string[] = [];
    const incoming = await receiving('t2', manifestOf(ts), lines);
    const first = chunksOf('t2', ts, MAX, { from: 0 }).next().value!;
    const tampered = { ...first, data: first.data.slice() };
    tampered.data[7] = tampered.data[7]! + 1;
    a.publish(subj.chunks('t2', 0), encode(tampered));
    const out = await offering('t2', ts, MAX);
    await out.send();
    await incoming.done;
    await out.received;
    ts.forEach((t, i) => expect(same(incoming.got[i]!.data, t.data)).toBe(true));
    expect(incoming.bytes()).toBe((300_000 + 4) * 4);
    expect(asked.filter((r) => r.type === 'resend')).toMatchObject([{ from: 1, tensor: 'big', offset: 0, attempt: 1 }]);
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(
      /^device 1 dropped a message on ferry\.xfer\.xfer\.t2\.chunk\.0: transfer t2, tensor 'big' at offset 0: chunk digest blake3:[0-9a-f]{64} does not match blake3:[0-9a-f]{64}; asking device 0 to send that chunk again$/,
    );
    stop();
    out.close();
  });

  it('drops bytes that are not a chunk, naming the subject, and completes', async () => {
    const ts = tensors();
    const lines: string[] = [];
    const incoming = await receiving('t3', manifestOf(ts), lines);
    a.publish(subj.chunks('t3', 0), new Uint8Array([1, 2, 3]));
    const out = await offering('t3', ts, MAX);
    await out.send();
    await incoming.done;
    ts.forEach((t, i) => expect(same(incoming.got[i]!.data, t.data)).toBe(true));
    expect(incoming.dropped()).toBe(1);
    expect(lines).toEqual([expect.stringContaining(`device 1 dropped a message on ${subj.chunks('t3', 0)}: `)]);
    out.close();
  });

  it('rejects a tensor that arrives complete but differs from the digest its receiver expects', async () => {
    const ts = tensors();
    const manifest = manifestOf(ts);
    manifest[1] = { ...manifest[1]!, digest: `blake3:${'0'.repeat(64)}` };
    const incoming = await receiving('t4', manifest);
    const recv = incoming.done;
    const refused = expect(recv).rejects.toThrow(/tensor 'small' digest blake3:[0-9a-f]{64} does not match the manifest's blake3:0{64}/);
    const out = await offering('t4', ts, MAX);
    await out.send();
    await refused;
    out.close();
  });
});
