// The environment protocol against a real nats-server: serveEnvironment instances, hand-written
// responders that break the contract in one way each, and instances that leave mid-episode. The
// client must get every observation from an environment, move an episode to another instance by
// replaying its recorded actions, or fail with an error naming the service, the instance and the
// problem.
import { pack, unpack } from 'msgpackr';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectBus, type NatsConnection } from '../mesh/wire/bus/bus.ts';
import { encode } from '../mesh/wire/messages/codec.ts';
import { EnvCallError, EnvClient, type EnvClientOptions } from '../mesh/wire/services/env-client.ts';
import { ENV_PROTOCOL_VERSION, envSubjects, type EnvTask } from '../mesh/wire/services/env-protocol.ts';
import { serveEnvironment, type EnvironmentServer } from '../mesh/wire/services/env-serve.ts';
import { startNatsServer, type PrivateNatsServer } from '../mesh/wire/server/nats-server.ts';

let server: PrivateNatsServer;
let nc: NatsConnection;
beforeAll(async () => {
  server = await startNatsServer();
  nc = await connectBus(server.url, 'env-test-client');
});
afterAll(async () => {
  await nc?.drain().catch(() => {});
  await server?.stop();
});

const TASK: EnvTask = { prompt_text: '', seed: 6 };
const options = (o: Partial<EnvClientOptions> = {}): EnvClientOptions => ({ run: 'run1', timeoutMs: 2000, retries: 2, waitMs: 3000, ...o });

/** A number-guessing environment: the secret is 1 + seed mod 10; every request it sees is kept. */
function guess(name: string, instance: string, seen: string[] = []): Promise<EnvironmentServer> {
  return serveEnvironment<{ secret: number; tries: number }>({
    nats: server.url,
    name,
    instance,
    reset: (task, ep) => {
      seen.push(`reset ${ep.id}`);
      return { state: { secret: 1 + (task.seed % 10), tries: 0 }, observation: 'Guess a number in 1..10.' };
    },
    step: (s, action, t) => {
      seen.push(`${t.replay ? 'replay' : 'step'} ${t.episode} ${t.turn} ${action}`);
      s.tries += 1;
      const n = Number(action);
      if (n === s.secret) return { observation: 'Yes.', reward: 1, done: true, info: { tries: s.tries } };
      return { observation: n < s.secret ? 'Higher.' : 'Lower.', done: false };
    },
  });
}

async function live(client: EnvClient, ids: string[]): Promise<void> {
  for (let i = 0; i < 100 && client.instances().join() !== ids.join(); i++) await new Promise((r) => setTimeout(r, 50));
  expect(client.instances()).toEqual(ids);
}

async function rejection(p: Promise<unknown>): Promise<Error> {
  try {
    await p;
  } catch (e) {
    return e as Error;
  }
  throw new Error('expected a rejection');
}

/** A hand-written instance that answers each request with the bytes `answer` makes of it. */
function raw(name: string, instance: string, answer: (req: Record<string, unknown>) => Uint8Array | undefined) {
  const subj = envSubjects(name);
  const requests: Array<Record<string, unknown>> = [];
  const sub = nc.subscribe(subj.instance(instance), {
    callback: (_e, msg) => {
      const req = unpack(msg.data) as Record<string, unknown>;
      requests.push(req);
      const bytes = answer(req);
      if (bytes) msg.respond(bytes);
    },
  });
  const hello = () => nc.publish(subj.presence, encode({ type: 'env.hello', v: ENV_PROTOCOL_VERSION, name, instance }));
  hello();
  const beat = setInterval(hello, 1000);
  return {
    requests,
    stop() {
      clearInterval(beat);
      sub.unsubscribe();
    },
  };
}

describe('episodes through serveEnvironment', () => {
  it('reset, steps until done, close: observations, rewards and info in order', async () => {
    const seen: string[] = [];
    const env = await guess('guess-a', 'g1', seen);
    const client = new EnvClient(nc, 'guess-a', options());
    try {
      await client.ready();
      expect(await client.reset('e0', TASK, 4)).toEqual({ observation: 'Guess a number in 1..10.', reward: 0, done: false, instance: 'g1' });
      expect(await client.step('e0', '3')).toMatchObject({ observation: 'Higher.', reward: 0, done: false });
      expect(await client.step('e0', '9')).toMatchObject({ observation: 'Lower.', done: false });
      expect(await client.step('e0', '7')).toEqual({ observation: 'Yes.', reward: 1, done: true, info: { tries: 3 }, instance: 'g1' });
      expect(env.open).toBe(1);
      await client.end('e0');
      expect(env.open).toBe(0);
      expect(seen).toEqual(['reset e0', 'step e0 1 3', 'step e0 2 9', 'step e0 3 7']);
    } finally {
      client.close();
      await env.stop();
    }
  });

  it('an instance that leaves mid-episode: the episode moves to another, its actions replayed there, the record kept', async () => {
    const [seen1, seen2]: string[][] = [[], []];
    const a = await guess('guess-b', 'b1', seen1);
    const b = await guess('guess-b', 'b2', seen2);
    const lines: string[] = [];
    const client = new EnvClient(nc, 'guess-b', options({ say: (l) => lines.push(l) }));
    try {
      await live(client, ['b1', 'b2']);
      const first = await client.reset('e1', TASK, 5);
      const [gone, other, otherSeen] = first.instance === 'b1' ? [a, 'b2', seen2] : [b, 'b1', seen1];
      await client.step('e1', '2');
      await gone.stop();
      const next = await client.step('e1', '8');
      expect(next).toMatchObject({ observation: 'Lower.', instance: other });
      expect(otherSeen).toEqual(['reset e1', 'replay e1 1 2', 'step e1 2 8']);
      expect(lines.join('\n')).toMatch(new RegExp(`environment 'guess-b' \\(instance ${first.instance}\\): it is gone`));
    } finally {
      client.close();
      await a.stop();
      await b.stop();
    }
  });
});

describe('replies that break the contract, and no environment at all', () => {
  it('garbage, a wrong id, an unknown episode: each refused naming the instance and what was wrong, and the step goes to a good instance', async () => {
    const bad = raw('guess-c', 'c0', (req) =>
      req.type === 'env.reset' ? pack({ type: 'env.observation', v: 1, id: req.id, instance: 'c0', episode: req.episode, observation: 'go', done: false }) : new Uint8Array([0xc1, 0x00]),
    );
    const lines: string[] = [];
    const client = new EnvClient(nc, 'guess-c', options({ say: (l) => lines.push(l) }));
    let good: EnvironmentServer | undefined;
    try {
      await live(client, ['c0']);
      expect((await client.reset('e2', TASK, 3)).instance).toBe('c0');
      good = await guess('guess-c', 'c1');
      await live(client, ['c0', 'c1']);
      expect(await client.step('e2', '7')).toMatchObject({ observation: 'Yes.', done: true, instance: 'c1' });
      expect(lines.join('\n')).toMatch(/environment 'guess-c' \(instance c0\) sent a malformed reply to env.step: not msgpack/);
    } finally {
      client.close();
      bad.stop();
      await good?.stop();
    }
  });

  it('after the retries the call fails naming the service, each instance and its problem', async () => {
    const wrongId = raw('guess-d', 'd0', (req) => pack({ type: 'env.observation', v: 1, id: 'nope', instance: 'd0', episode: req.episode, observation: '', done: false }));
    const nan = raw('guess-d', 'd1', (req) => pack({ type: 'env.observation', v: 1, id: req.id, instance: 'd1', episode: req.episode, observation: '', reward: Number.NaN, done: false }));
    const client = new EnvClient(nc, 'guess-d', options({ retries: 1 }));
    try {
      await live(client, ['d0', 'd1']);
      const e = await rejection(client.reset('e3', TASK, 3));
      expect(e).toBeInstanceOf(EnvCallError);
      expect(e.message).toMatch(/^environment 'guess-d': 2 attempt\(s\) failed: /);
      expect(e.message).toMatch(/\(instance d0\) answered request nope, expected/);
      expect(e.message).toMatch(/\(instance d1\) sent a malformed reply to env.reset: .*reward: expected number, received NaN/);
    } finally {
      client.close();
      wrongId.stop();
      nan.stop();
    }
  });

  it('an instance that never answers times out, and an unknown episode is an error reply, both retried', async () => {
    const silent = raw('guess-e', 'e0', () => undefined);
    const client = new EnvClient(nc, 'guess-e', options({ timeoutMs: 300, retries: 0 }));
    try {
      await live(client, ['e0']);
      expect((await rejection(client.reset('e4', TASK, 3))).message).toMatch(/\(instance e0\): no reply within 0.3 s \(timeout_seconds\)/);
      expect((await rejection(client.step('never', 'x'))).message).toMatch(/episode never was never reset/);
    } finally {
      client.close();
      silent.stop();
    }
    const env = await guess('guess-f', 'f0');
    const direct = await connectBus(server.url, 'env-test-direct');
    try {
      // An instance asked about an episode it never saw says so, in an env.error.
      const msg = await direct.request(envSubjects('guess-f').instance('f0'), pack({ type: 'env.step', v: 1, id: 'r1', run: 'x', episode: 'zz', turn: 1, action: '5' }), { timeout: 2000 });
      expect(unpack(msg.data)).toMatchObject({ type: 'env.error', v: 1, id: 'r1', instance: 'f0', message: expect.stringMatching(/unknown episode zz/) });
      const v2 = await direct.request(envSubjects('guess-f').instance('f0'), pack({ type: 'env.reset', v: 2, id: 'r2' }), { timeout: 2000 });
      expect(unpack(v2.data)).toMatchObject({ type: 'env.error', message: expect.stringMatching(/expected protocol version v=1, got 2/) });
    } finally {
      await direct.drain();
      await env.stop();
    }
  });

  it('no instance within the wait: a fatal error naming the service and its presence subject', async () => {
    const client = new EnvClient(nc, 'nobody', options({ waitMs: 300 }));
    try {
      const e = await rejection(client.ready());
      expect(e).toMatchObject({ fatal: true, message: expect.stringMatching(/no environment 'nobody' appeared on ferry\.env\.nobody\.hb within 0.3 s/) });
    } finally {
      client.close();
    }
  });

  it('demonstrations: the expert plays on what the policy would see; an environment without one, or one that oversteps the budget, is refused at once', async () => {
    const seen: string[] = [];
    const expert = await serveEnvironment<{ secret: number }>({
      nats: server.url,
      name: 'guess-x',
      instance: 'x0',
      reset: (task) => ({ state: { secret: 1 + (task.seed % 10) }, observation: 'Guess 1..10.' }),
      step: (st, action) => (Number(action) === st.secret ? { observation: 'Yes.', reward: 1, done: true } : { observation: Number(action) < st.secret ? 'Higher.' : 'Lower.', done: false }),
      expert: ({ observation, turns }) => {
        seen.push(`${observation} | ${turns.map((t) => `${t.action}:${t.observation}`).join(' ')}`);
        let [lo, hi] = [1, 10];
        for (const t of turns) {
          if (t.observation === 'Higher.') lo = Number(t.action) + 1;
          if (t.observation === 'Lower.') hi = Number(t.action) - 1;
        }
        return String(Math.floor((lo + hi) / 2));
      },
    });
    const plain = await guess('guess-y', 'y0');
    const client = new EnvClient(nc, 'guess-x', options());
    const none = new EnvClient(nc, 'guess-y', options());
    try {
      await client.ready();
      // Secret 7: 5 (higher), 8 (lower), 6 (higher), 7.
      expect(await client.demonstrate('w0', TASK, 4)).toEqual({
        instance: 'x0',
        episode: 'w0',
        observation: 'Guess 1..10.',
        turns: [
          { action: '5', observation: 'Higher.' },
          { action: '8', observation: 'Lower.' },
          { action: '6', observation: 'Higher.' },
          { action: '7', observation: '' },
        ],
      });
      expect(seen).toEqual(['Guess 1..10. | ', 'Guess 1..10. | 5:Higher.', 'Guess 1..10. | 5:Higher. 8:Lower.', 'Guess 1..10. | 5:Higher. 8:Lower. 6:Higher.']);
      // A budget of 2: the expert stops there.
      expect((await client.demonstrate('w1', TASK, 2)).turns).toHaveLength(2);
      expect(expert.open).toBe(0);
      await none.ready();
      const e = await rejection(none.demonstrate('w2', TASK, 4));
      expect(e).toBeInstanceOf(EnvCallError);
      expect(e.message).toMatch(/environment 'guess-y' \(instance y0\) could not answer env\.demo of episode w2: .*has no expert to demonstrate with/);
    } finally {
      client.close();
      none.close();
      await expert.stop();
      await plain.stop();
    }
  });

  it('a demonstration longer than the turn budget is refused, naming the instance', async () => {
    const long = raw('guess-z', 'z0', (req) =>
      encode({
        type: 'env.demonstration',
        v: ENV_PROTOCOL_VERSION,
        id: req.id,
        instance: 'z0',
        episode: req.episode,
        observation: '',
        turns: [1, 2, 3].map((k) => ({ action: String(k), observation: 'no' })),
      }),
    );
    const client = new EnvClient(nc, 'guess-z', options({ retries: 0 }));
    try {
      await client.ready();
      const e = await rejection(client.demonstrate('w0', TASK, 2));
      expect(e.message).toMatch(/environment 'guess-z' \(instance z0\) demonstrated 3 turns of episode w0; its budget is 2/);
    } finally {
      client.close();
      long.stop();
    }
  });
});
