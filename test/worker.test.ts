// A real worker process on a real nats-server, driven by the test as its supervisor: it answers
// what it can, refuses what its state does not allow with a typed error, rejects bad bytes with
// the subject named, and keeps serving throughout.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectBus, request, subscribe, type NatsConnection } from '../mesh/wire/bus/bus.ts';
import { encode } from '../mesh/wire/messages/codec.ts';
import { startNatsServer, type PrivateNatsServer } from '../mesh/wire/server/nats-server.ts';
import { Heartbeat, Hello, PROTOCOL_VERSION, Reply, type CallBody } from '../mesh/wire/messages/protocol.ts';
import { subjects } from '../mesh/wire/bus/subjects.ts';
import { spawnTs, type Spawned } from './helpers.ts';

const RUN = 'workertest';
const subj = subjects(RUN);
let server: PrivateNatsServer;
let nc: NatsConnection;
let worker: Spawned;
let seq = 0;

const spec = { kind: 'policy' as const, vocab: 11, context: 9, layers: 1, width: 16, heads: 2 };

function call(body: CallBody, model = 'actor', id = `c${seq++}`, timeoutMs = 20_000) {
  return request(nc, subj.call(0), { type: 'call', v: PROTOCOL_VERSION, id, model, iteration: 0, body }, Reply, timeoutMs);
}

async function raw(bytes: Uint8Array) {
  const msg = await nc.request(subj.call(0), bytes, { timeout: 20_000 });
  return Reply.parse((await import('../mesh/wire/messages/codec.ts')).decode('reply', msg.data, Reply));
}

beforeAll(async () => {
  server = await startNatsServer();
  nc = await connectBus(server.url, 'test-supervisor');
  const beat = new Promise<void>((resolve) => {
    subscribe(
      nc,
      subj.heartbeats,
      Heartbeat,
      () => resolve(),
      () => {},
    );
  });
  // A worker that knows its device says hello on that device's join subject; one that does not, on the generic one.
  for (const subject of [subj.join, subj.joins])
    subscribe(
      nc,
      subject,
      Hello,
      (hello, msg) => {
        msg.respond(encode({ type: 'welcome', v: PROTOCOL_VERSION, device: hello.device ?? 0, run: RUN }));
      },
      () => {},
    );
  await nc.flush();
  worker = spawnTs('actors/worker.ts', ['--run', RUN, '--nats', server.url, '--device', '0', '--backend', 'cpu']);
  await beat;
}, 60_000);

afterAll(async () => {
  worker?.child.kill('SIGKILL');
  await nc?.close();
  await server?.stop();
});

describe('a worker process', () => {
  it('refuses a call on a model it does not hold, with not_loaded', async () => {
    const reply = await call({ fn: 'manifest' }, 'critic');
    expect(reply).toMatchObject({ type: 'error', code: 'not_loaded' });
    expect(reply.type === 'error' && reply.message).toMatch(/holds no shard of 'critic'/);
  });

  it('rejects garbage bytes, naming the subject, tells the run on its heartbeat, and keeps serving', async () => {
    // A worker may not publish run events (mesh/wire/bus/auth.ts): its supervisor says it for it.
    const warned = new Promise<Heartbeat>((resolve) => {
      const stop = subscribe(
        nc,
        subj.heartbeat(0),
        Heartbeat,
        (b) => {
          if (b.warning === undefined) return;
          stop();
          resolve(b);
        },
        () => {},
      );
    });
    await nc.flush();
    const reply = await raw(new Uint8Array([0xc1, 0xff, 0x00, 0x13]));
    expect(await warned).toMatchObject({ type: 'heartbeat', device: 0, state: 'serving', warning: expect.stringContaining(`rejected bad message on ${subj.call(0)}`) });
    expect(reply).toMatchObject({ type: 'error', code: 'malformed', subject: subj.call(0) });
    expect((reply as { message: string }).message).toMatch(/not msgpack|expected a msgpack map/);
    expect((await call({ fn: 'manifest' }, 'nobody')).type).toBe('error');
  });

  it('rejects a wrong protocol version and a wrong schema, saying where', async () => {
    const other = PROTOCOL_VERSION + 1;
    const wrong = await raw(encode({ type: 'call', v: other, id: 'x', model: 'actor', iteration: 0, body: { fn: 'manifest' } }));
    expect(wrong).toMatchObject({ type: 'error', code: 'malformed' });
    expect((wrong as { message: string }).message).toContain(`expected protocol version v=${PROTOCOL_VERSION}, got ${other}`);
    const listTokens = await raw(
      encode({ type: 'call', v: PROTOCOL_VERSION, id: 'y', model: 'actor', iteration: 0, body: { fn: 'inference', tokens: [1, 2, 3], batch: 1, promptLen: 1, responseLen: 2 } }),
    );
    expect((listTokens as { message: string }).message).toMatch(/body\.tokens: expected a Int32Array|body\.tokens/);
  });

  it('loads a model, and answers a repeated call id with the same reply without running it again', async () => {
    const load: CallBody = { fn: 'load', role: 'actor', spec, layout: { devices: [0], dp: 1, tp: 1, pp: 1 }, rank: 0, seed: 1, optim: { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, clipNorm: 1 } };
    const first = await call(load, 'actor', 'load-1');
    expect(first.type).toBe('result');
    const again = await call(load, 'actor', 'load-1');
    expect(again).toEqual(first);
  });

  it('refuses a layout that does not fit the model whole, and the loaded model is untouched', async () => {
    const before = await call({ fn: 'manifest' });
    const reply = await call({ fn: 'load', role: 'actor', spec, layout: { devices: [0, 1, 2, 3], dp: 1, tp: 4, pp: 1 }, rank: 0, seed: 2 });
    expect(reply).toMatchObject({ type: 'error', code: 'unsupported' });
    expect(reply.type === 'error' && reply.message).toMatch(/tp=4 does not divide the 2 attention heads/);
    expect(before.type).toBe('result');
    const digest = before.type === 'result' ? before.body.digest : undefined;
    expect(await call({ fn: 'manifest' })).toMatchObject({ type: 'result', body: { digest } });
  });

  it('answers busy while a long call runs, then finishes it', { timeout: 150_000 }, async () => {
    const tokens = new Int32Array(64 * 9).map((_, i) => i % 10);
    // Long enough to be caught running; on a loaded machine it may take a while, which is not what this tests.
    const long = call({ fn: 'sft', tokens, batch: 64, promptLen: 5, responseLen: 4, steps: 40, minibatch: 64, lr: 1e-3, seed: 1 }, 'actor', `c${seq++}`, 120_000);
    await new Promise((r) => setTimeout(r, 200));
    const busy = await call({ fn: 'manifest' });
    expect(busy).toMatchObject({ type: 'error', code: 'busy' });
    expect((await long).type).toBe('result');
  });

  it('stops on shutdown and exits 0', async () => {
    expect((await call({ fn: 'shutdown' }, '*')).type).toBe('result');
    expect(await worker.exited).toBe(0);
  });
});
