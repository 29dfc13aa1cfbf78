// Parameter bytes across a real nats-server whose max_payload is small, so that tensors must be
// cut into chunks: they arrive bit-exact, and a chunk with a wrong digest or bad bytes is rejected
// before anything is handed over.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectBus, type NatsConnection } from '../mesh/wire/bus.ts';
import { encode } from '../mesh/wire/codec.ts';
import { startNatsServer, type PrivateNatsServer } from '../mesh/wire/nats-server.ts';
import { subjects } from '../mesh/wire/subjects.ts';
import { chunkElements, chunksOf, manifestOf, receiveTensors, sendTensors, type Expected, type NamedTensor } from '../mesh/wire/transfer.ts';

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

/** Subscribes `b` to a transfer and waits until the server has the subscription. */
async function receiving(transfer: string, expected: Expected[]) {
  const got: NamedTensor[] = [];
  const incoming = receiveTensors(b, subj, [{ transfer, expected }], 20_000, (t) => got.push(t));
  await b.flush();
  return { ...incoming, got };
}

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
    const sent = await sendTensors(a, subj, 't1', ts, 1 << 20);
    await recv;
    const got = incoming.got;
    const per = chunkElements(MAX);
    expect(sent.chunks).toBe(Math.ceil(300_000 / per) + 1);
    expect(incoming.chunks()).toBe(sent.chunks);
    expect(incoming.bytes()).toBe((300_000 + 4) * 4);
    incoming.close();
    for (const [i, t] of got.entries()) {
      expect(t.name).toBe(ts[i]!.name);
      expect(Buffer.from(t.data.buffer).equals(Buffer.from(ts[i]!.data.buffer))).toBe(true);
    }
  });

  it('rejects a chunk whose bytes do not match its digest', async () => {
    const ts = tensors();
    const incoming = await receiving('t2', manifestOf(ts));
    const recv = incoming.done;
    const refused = expect(recv).rejects.toThrow(/tensor 'big' at offset 0: chunk digest [0-9a-f]+ does not match/);
    const first = chunksOf('t2', ts, MAX).next().value!;
    const tampered = { ...first, data: first.data.slice() };
    tampered.data[7] = tampered.data[7]! + 1;
    a.publish(subj.chunks('t2'), encode(tampered));
    await refused;
  });

  it('rejects bytes that are not a chunk, naming the subject', async () => {
    const ts = tensors();
    const incoming = await receiving('t3', manifestOf(ts));
    const recv = incoming.done;
    const refused = expect(recv).rejects.toThrow(new RegExp(`bad message on ${subj.chunks('t3').replace(/\./g, '\\.')}`));
    a.publish(subj.chunks('t3'), new Uint8Array([1, 2, 3]));
    await refused;
  });

  it('rejects a tensor that arrives complete but differs from the digest its receiver expects', async () => {
    const ts = tensors();
    const manifest = manifestOf(ts);
    manifest[1] = { ...manifest[1]!, sha256: '0'.repeat(64) };
    const incoming = await receiving('t4', manifest);
    const recv = incoming.done;
    const refused = expect(recv).rejects.toThrow(/tensor 'small' digest [0-9a-f]+ does not match the manifest's 0{64}/);
    await sendTensors(a, subj, 't4', ts, MAX);
    await refused;
  });
});
