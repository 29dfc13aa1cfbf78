// The reward protocol against a real nats-server: serveReward actors, hand-written responders that
// break the contract in one way each, and the external example actor (examples/reward-actor/
// ascending.mjs) as a real process. The client must get every score from an actor or fail with an
// error that names the reward, the instance and what was wrong.
import { spawn } from 'node:child_process';
import { pack, unpack } from 'msgpackr';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { serveReward, type RewardActor } from '../actors/reward-actor.ts';
import { RewardCallError, RewardClient, type RewardClientOptions } from '../engine/runtime/run/reward-client.ts';
import { connectBus, type NatsConnection } from '../mesh/wire/bus/bus.ts';
import { encode } from '../mesh/wire/messages/codec.ts';
import { startNatsServer, type PrivateNatsServer } from '../mesh/wire/server/nats-server.ts';
import { REWARD_PROTOCOL_VERSION, rewardSubjects, type RewardItem } from '../mesh/wire/services/reward-protocol.ts';
import { ROOT } from './helpers.ts';

function item(id: string, response: number[]): RewardItem {
  return { id, prompt: [7, 8], response, prompt_text: 'p', response_text: response.join(' ') };
}

const ITEMS = [item('i0', [1, 2, 3]), item('i1', []), item('i2', [5, 6, 7, 8, 9]), item('i3', [4])];
const LENGTHS = ITEMS.map((it) => it.response.length);
const byLength = (items: RewardItem[]) => items.map((it) => it.response.length);

/** Waits (polling) until `client` sees exactly `ids` as its live instances. */
async function seen(client: RewardClient, ids: string[]): Promise<void> {
  await vi.waitFor(() => expect(client.instances()).toEqual(ids), { timeout: 5000, interval: 50 });
}

/** The error `promise` rejects with (and that it does reject). */
async function rejection(promise: Promise<unknown>): Promise<Error> {
  try {
    await promise;
  } catch (e) {
    return e as Error;
  }
  throw new Error('expected the promise to reject, but it resolved');
}

interface RawActor {
  /** Requests received, decoded with plain msgpackr. */
  requests: Array<Record<string, unknown>>;
  stop(): void;
}

/**
 * A hand-written responder on `name`'s instance subject `id`: it beats presence every second, as an
 * actor must, and answers each request with the bytes `answer` makes of it.
 */
function rawActor(nc: NatsConnection, name: string, id: string, answer: (req: Record<string, unknown>) => Uint8Array): RawActor {
  const subj = rewardSubjects(name);
  const requests: Array<Record<string, unknown>> = [];
  const sub = nc.subscribe(subj.instance(id), {
    callback: (_e, msg) => {
      const req = unpack(msg.data) as Record<string, unknown>;
      requests.push(req);
      msg.respond(answer(req));
    },
  });
  const hello = () => nc.publish(subj.presence, encode({ type: 'reward.hello', v: REWARD_PROTOCOL_VERSION, name, instance: id }));
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

/** A well-formed reply to `req` with `scores` (one per item, the items' ids), then `patch` applied. */
function reply(req: Record<string, unknown>, instance: string, scores: unknown[], patch: Record<string, unknown> = {}): Uint8Array {
  const items = req.items as RewardItem[];
  return pack({
    type: 'reward.reply',
    v: 1,
    id: req.id,
    instance,
    scores: items.map((it, i) => ({ id: it.id, score: scores[i] })),
    ...patch,
  });
}

// One server for the file; each test serves its own reward name on it.
let server: PrivateNatsServer;
let nc: NatsConnection;
beforeAll(async () => {
  server = await startNatsServer();
  nc = await connectBus(server.url, 'reward-test-client');
});
afterAll(async () => {
  await nc?.drain().catch(() => {});
  await server?.stop();
});

describe('scoring through serveReward, and waiting for an actor', () => {
  it('a serveReward actor scores a batch: one score per item, in the request order', async () => {
    const calls: Array<{ run: string; iteration: number; ids: string[] }> = [];
    const actor = await serveReward({
      nats: server.url,
      name: 'length',
      instance: 'len-1',
      score: (items, request) => {
        calls.push({ ...request, ids: items.map((it) => it.id) });
        return byLength(items);
      },
    });
    const client = new RewardClient(nc, 'length', { timeoutMs: 5000, retries: 0, waitMs: 5000 });
    try {
      expect(await client.score('run1', 0, ITEMS)).toEqual(LENGTHS);
      // Another order, another iteration: the scores follow the items.
      const reversed = [...ITEMS].reverse();
      expect(await client.score('run1', 1, reversed)).toEqual([...LENGTHS].reverse());
      expect(calls).toEqual([
        { run: 'run1', iteration: 0, ids: ['i0', 'i1', 'i2', 'i3'] },
        { run: 'run1', iteration: 1, ids: ['i3', 'i2', 'i1', 'i0'] },
      ]);
      expect(actor.answered).toBe(2);
      expect(client.instances()).toEqual(['len-1']);
    } finally {
      client.close();
      await actor.stop();
    }
  });

  it('no actor at all: it says it is waiting, then gives up after waitMs with an error naming the reward', async () => {
    const said: string[] = [];
    const client = new RewardClient(nc, 'nobody-home', { timeoutMs: 1000, retries: 2, waitMs: 1500, say: (l) => said.push(l) });
    try {
      const err = await rejection(client.score('run1', 0, ITEMS));
      expect(err).toBeInstanceOf(RewardCallError);
      expect(err.message).toMatch(/no reward actor 'nobody-home' appeared/);
      expect(err.message).toContain('within 1.5 s');
      expect(err.message).toContain(rewardSubjects('nobody-home').presence);
      expect(said.some((l) => l.includes("waiting for a reward actor 'nobody-home'"))).toBe(true);
      // It says so once per call, not once per poll.
      expect(said.filter((l) => l.includes('waiting for a reward actor'))).toHaveLength(1);
    } finally {
      client.close();
    }
  });

  it('an actor that starts while the client waits gets the request', async () => {
    const said: string[] = [];
    const client = new RewardClient(nc, 'latecomer', { timeoutMs: 5000, retries: 0, waitMs: 10_000, say: (l) => said.push(l) });
    let actor: RewardActor | undefined;
    try {
      const scoring = client.score('run1', 3, ITEMS);
      const starting = new Promise<RewardActor>((resolve, reject) =>
        setTimeout(() => serveReward({ nats: server.url, name: 'latecomer', instance: 'late-1', score: byLength }).then(resolve, reject), 500),
      );
      actor = await starting;
      expect(await scoring).toEqual(LENGTHS);
      expect(actor.answered).toBe(1);
      expect(said.some((l) => l.includes("waiting for a reward actor 'latecomer'"))).toBe(true);
      expect(said.some((l) => l.includes('instance late-1 is serving'))).toBe(true);
    } finally {
      client.close();
      await actor?.stop();
    }
  });
});

/** An instance that holds each request 3 s (or until it stops), counting the requests it got. */
async function slowInstance(url: string, name: string, instance: string) {
  let release!: () => void;
  const released = new Promise<void>((r) => (release = r));
  let calls = 0;
  const actor = await serveReward({
    nats: url,
    name,
    instance,
    score: async (items) => {
      calls += 1;
      await Promise.race([released, new Promise((r) => setTimeout(r, 3000))]);
      return byLength(items);
    },
  });
  return {
    actor,
    calls: () => calls,
    /** Lets the held requests finish, then stops. */
    async stop() {
      release();
      await vi.waitFor(() => expect(actor.answered).toBe(calls), { timeout: 5000, interval: 50 }).catch(() => {});
      await actor.stop();
    },
  };
}

describe('a slow instance: the request times out there and is retried on another', () => {
  it('every call resolves with scores from the fast instance; the timeouts name the slow one', async () => {
    // The slow instance holds each request 3 s (or until the test releases it at the end).
    const slow = await slowInstance(server.url, 'two', 'a-slow');
    const fast = await serveReward({ nats: server.url, name: 'two', instance: 'b-fast', score: byLength });
    const said: string[] = [];
    const client = new RewardClient(nc, 'two', { timeoutMs: 500, retries: 2, waitMs: 5000, say: (l) => said.push(l) });
    try {
      await seen(client, ['a-slow', 'b-fast']);
      const calls = 4;
      for (let i = 0; i < calls; i++) expect(await client.score('run1', i, ITEMS)).toEqual(LENGTHS);

      // Every call was answered by the fast instance, exactly once each.
      expect(fast.answered).toBe(calls);
      // The first call went to a-slow (first in id order, turn 0), timed out, and went on to b-fast;
      // later calls may or may not land on a-slow, depending on whether it has beaten again since.
      const timeouts = said.filter((l) => /\(instance a-slow\): no reply within 0\.5 s/.test(l));
      expect(timeouts.length).toBeGreaterThanOrEqual(1);
      expect(timeouts.length).toBe(slow.calls());
      expect(timeouts.every((l) => l.endsWith('trying again'))).toBe(true);
      expect(said.filter((l) => l.includes('instance b-fast)'))).toEqual([]);
      // A retry never goes back to the instance that just timed out: one timeout per call at most.
      expect(slow.calls()).toBeLessThanOrEqual(calls);
      // A timeout does not drop the slow instance: it is still present.
      await seen(client, ['a-slow', 'b-fast']);
    } finally {
      client.close();
      await slow.stop();
      await fast.stop();
    }
  });

  it('an instance that timed out is left out of the retry: with three, the retry skips it', async () => {
    const slow = await slowInstance(server.url, 'three', 'a-slow');
    const b = await serveReward({ nats: server.url, name: 'three', instance: 'b-fast', score: byLength });
    const c = await serveReward({ nats: server.url, name: 'three', instance: 'c-fast', score: byLength });
    const client = new RewardClient(nc, 'three', { timeoutMs: 500, retries: 2, waitMs: 5000 });
    try {
      await seen(client, ['a-slow', 'b-fast', 'c-fast']);
      // Turn 0: a-slow, which times out and is left out of this call's retries; turn 1 over
      // [b-fast, c-fast] is c-fast. Had a-slow stayed in the pool, turn 1 would be b-fast.
      expect(await client.score('run1', 0, ITEMS)).toEqual(LENGTHS);
      expect(slow.calls()).toBe(1);
      expect({ b: b.answered, c: c.answered }).toEqual({ b: 0, c: 1 });
      // A timeout does not drop it: it is still present for the next call.
      await seen(client, ['a-slow', 'b-fast', 'c-fast']);
    } finally {
      client.close();
      await Promise.all([slow, b, c].map((a) => a.stop()));
    }
  });

  it('a lone slow instance: the retry goes to it again, at once, even past wait_seconds; then the call fails', async () => {
    const slow = await slowInstance(server.url, 'lone', 'only');
    const said: string[] = [];
    // waitMs shorter than a timeout: waiting is for when no instance is there, not a budget for retries.
    const client = new RewardClient(nc, 'lone', { timeoutMs: 500, retries: 1, waitMs: 200, say: (l) => said.push(l) });
    try {
      await seen(client, ['only']);
      const err = await rejection(client.score('run1', 0, ITEMS));
      expect(err).toBeInstanceOf(RewardCallError);
      expect(err.message).toContain("reward 'lone': 2 attempt(s) failed");
      expect(err.message.match(/reward actor 'lone' \(instance only\): no reply within 0\.5 s/g)).toHaveLength(2);
      expect(slow.calls()).toBe(2);
      // Still present (it beats), and alone: the retry goes straight back to it.
      const events = said.filter((l) => !/: instance \S+ is serving$/.test(l)).map((l) => (/no reply within/.test(l) ? 'timeout' : /waiting for a reward actor/.test(l) ? 'waiting' : l));
      expect(events).toEqual(['timeout', 'timeout']);
    } finally {
      client.close();
      await slow.stop();
    }
  });
});

describe('replies that break the contract are refused, naming the actor, the instance and the fault', () => {
  let actors: NatsConnection;

  beforeAll(async () => {
    actors = await connectBus(server.url, 'reward-test-actors');
  });
  afterAll(async () => {
    await actors?.drain().catch(() => {});
  });

  const ID = 'raw-1';
  const cases: Array<{ what: string; answer: (req: Record<string, unknown>) => Uint8Array; fault: RegExp }> = [
    {
      what: 'too few scores',
      answer: (req) => pack({ type: 'reward.reply', v: 1, id: req.id, instance: ID, scores: [{ id: 'i0', score: 1 }] }),
      fault: /sent 1 scores for 4 items/,
    },
    {
      what: 'too many scores',
      answer: (req) => {
        const items = req.items as RewardItem[];
        return pack({ type: 'reward.reply', v: 1, id: req.id, instance: ID, scores: [...items, items[0]!].map((it) => ({ id: it.id, score: 1 })) });
      },
      fault: /sent 5 scores for 4 items/,
    },
    {
      what: "the items' ids out of place",
      answer: (req) => {
        const items = [...(req.items as RewardItem[])].reverse();
        return pack({ type: 'reward.reply', v: 1, id: req.id, instance: ID, scores: items.map((it) => ({ id: it.id, score: 1 })) });
      },
      fault: /sent score 0 for item 'i3', expected item 'i0'/,
    },
    {
      what: 'unknown item ids',
      answer: (req) => reply(req, ID, [1, 1, 1, 1], { scores: (req.items as RewardItem[]).map((_it, i) => ({ id: `x${i}`, score: 1 })) }),
      fault: /sent score 0 for item 'x0', expected item 'i0'/,
    },
    { what: 'a NaN score', answer: (req) => reply(req, ID, [1, NaN, 1, 1]), fault: /NaN/ },
    { what: 'an Infinity score', answer: (req) => reply(req, ID, [1, 1, Infinity, 1]), fault: /Infinity/ },
    { what: 'a -Infinity score', answer: (req) => reply(req, ID, [-Infinity, 1, 1, 1]), fault: /-Infinity/ },
    { what: 'a score that is a string', answer: (req) => reply(req, ID, [1, '1', 1, 1]), fault: /string/ },
    { what: 'bytes that are not msgpack', answer: () => new TextEncoder().encode('this is not msgpack'), fault: /not msgpack/ },
    { what: 'not a map', answer: () => pack([1, 2, 3]), fault: /expected a msgpack map/ },
    { what: 'another protocol version', answer: (req) => reply(req, ID, [1, 1, 1, 1], { v: 2 }), fault: /expected protocol version v=1, got 2/ },
    {
      what: 'an error reply in another version (its words are kept)',
      answer: () => pack({ type: 'reward.error', v: 2, message: 'I only speak v2' }),
      fault: /expected protocol version v=1, got 2; it said: I only speak v2/,
    },
    { what: 'another type', answer: (req) => reply(req, ID, [1, 1, 1, 1], { type: 'reward.scores' }), fault: /malformed reply/ },
    {
      what: 'the wrong request id',
      answer: (req) => reply(req, ID, [1, 1, 1, 1], { id: 'someone-else' }),
      fault: /answered request someone-else, expected run1\.0\./,
    },
    {
      what: 'a reward.error',
      answer: (req) => pack({ type: 'reward.error', v: 1, id: req.id, instance: ID, message: 'the model is on fire' }),
      fault: /could not score: the model is on fire/,
    },
  ];

  it.each(cases.map((c, i) => ({ ...c, name: `bad-${i}` })))('$what', async ({ name, answer, fault }) => {
    const said: string[] = [];
    const client = new RewardClient(nc, name, { timeoutMs: 2000, retries: 0, waitMs: 5000, say: (l) => said.push(l) });
    await nc.flush();
    const raw = rawActor(actors, name, ID, answer);
    try {
      await seen(client, [ID]);
      const err = await rejection(client.score('run1', 0, ITEMS));
      expect(err).toBeInstanceOf(RewardCallError);
      expect(err.message).toContain(`reward actor '${name}' (instance ${ID})`);
      expect(err.message).toMatch(fault);
      expect(err.message).toContain('1 attempt(s) failed');
      expect(raw.requests).toHaveLength(1);
      expect(said.some((l) => fault.test(l) && l.includes(`(instance ${ID})`))).toBe(true);
    } finally {
      client.close();
      raw.stop();
    }
  });

  it('a malformed reply from one instance and a good one from another: the retry gets the scores', async () => {
    const name = 'half-bad';
    const bad = rawActor(actors, name, 'a-bad', (req) => reply(req, 'a-bad', [1, NaN, 1, 1]));
    const good = rawActor(actors, name, 'b-good', (req) => reply(req, 'b-good', byLength(req.items as RewardItem[])));
    const said: string[] = [];
    const client = new RewardClient(nc, name, { timeoutMs: 2000, retries: 1, waitMs: 5000, say: (l) => said.push(l) });
    try {
      await seen(client, ['a-bad', 'b-good']);
      // Turn 0 goes to a-bad (first in id order); the retry goes to the next instance, b-good.
      expect(await client.score('run1', 0, ITEMS)).toEqual(LENGTHS);
      expect(bad.requests).toHaveLength(1);
      expect(good.requests).toHaveLength(1);
      expect(bad.requests[0]!.id).toBe(good.requests[0]!.id);
      expect(said.some((l) => l.includes("reward actor 'half-bad' (instance a-bad)") && /NaN/.test(l) && l.endsWith('trying again'))).toBe(true);
    } finally {
      client.close();
      bad.stop();
      good.stop();
    }
  });

  it('with only bad instances, every attempt fails and the error lists each one', async () => {
    const name = 'all-bad';
    const one = rawActor(actors, name, 'a-short', (req) => pack({ type: 'reward.reply', v: 1, id: req.id, instance: 'a-short', scores: [{ id: 'i0', score: 1 }] }));
    const two = rawActor(actors, name, 'b-error', (req) => pack({ type: 'reward.error', v: 1, id: req.id, instance: 'b-error', message: 'no GPU' }));
    const client = new RewardClient(nc, name, { timeoutMs: 2000, retries: 1, waitMs: 5000 });
    try {
      await seen(client, ['a-short', 'b-error']);
      const err = await rejection(client.score('run1', 0, ITEMS));
      expect(err).toBeInstanceOf(RewardCallError);
      expect(err.message).toContain("reward 'all-bad': 2 attempt(s) failed");
      expect(err.message).toContain('(instance a-short) sent 1 scores for 4 items');
      expect(err.message).toContain('(instance b-error) could not score: no GPU');
    } finally {
      client.close();
      one.stop();
      two.stop();
    }
  });
});

describe('serveReward refuses requests it cannot read or score, and keeps serving', () => {
  let actor: RewardActor;
  const logged: string[] = [];

  beforeAll(async () => {
    actor = await serveReward({
      nats: server.url,
      name: 'picky',
      instance: 'p-1',
      log: (l) => logged.push(l),
      // The run's name picks a broken answer, to test the actor's own checks.
      score: (items, { run }) => {
        if (run === 'short') return byLength(items).slice(1);
        if (run === 'nan') return items.map((it, i) => (i === 1 ? NaN : it.response.length));
        if (run === 'inf') return items.map(() => Infinity);
        if (run === 'throws') throw new Error('scorer exploded');
        return byLength(items);
      },
    });
  });
  afterAll(async () => {
    await actor?.stop();
  });

  const subject = () => rewardSubjects('picky').instance('p-1');
  const request = (run: string, patch: Record<string, unknown> = {}) => pack({ type: 'reward.request', v: 1, id: `req-${run}`, run, iteration: 0, items: ITEMS, ...patch });

  it('answers a well-formed raw request', async () => {
    const r = unpack((await nc.request(subject(), request('ok'), { timeout: 5000 })).data);
    expect(r).toEqual({ type: 'reward.reply', v: 1, id: 'req-ok', instance: 'p-1', scores: ITEMS.map((it) => ({ id: it.id, score: it.response.length })) });
  });

  it('a request of another version: a reward.error naming the actor and the version', async () => {
    const before = actor.answered;
    const r = unpack((await nc.request(subject(), request('v2', { v: 2 }), { timeout: 5000 })).data);
    expect(r).toMatchObject({ type: 'reward.error', v: 1, instance: 'p-1' });
    expect(r.message).toContain("reward actor 'picky' (p-1) cannot read the request");
    expect(r.message).toContain('expected protocol version v=1, got 2');
    expect(actor.answered).toBe(before);
  });

  it('bytes that are not msgpack: a reward.error naming the actor', async () => {
    const r = unpack((await nc.request(subject(), new TextEncoder().encode('definitely not msgpack'), { timeout: 5000 })).data);
    expect(r).toMatchObject({ type: 'reward.error', v: 1, instance: 'p-1' });
    expect(r.message).toContain("reward actor 'picky' (p-1) cannot read the request");
    expect(r.message).toContain('not msgpack');
  });

  it('a request with an item missing its response: a reward.error saying which field', async () => {
    const items = [ITEMS[0], { id: 'broken', prompt: [1], prompt_text: 'p', response_text: 'r' }];
    const r = unpack((await nc.request(subject(), request('missing', { items }), { timeout: 5000 })).data);
    expect(r).toMatchObject({ type: 'reward.error', v: 1, instance: 'p-1' });
    expect(r.message).toContain("reward actor 'picky' (p-1) cannot read the request");
    expect(r.message).toContain('items[1].response');
  });

  it.each([
    { run: 'short', fault: 'the score function returned 3 scores for 4 items' },
    { run: 'nan', fault: 'the score function returned NaN for item i1; scores must be finite numbers' },
    { run: 'inf', fault: 'the score function returned Infinity for item i0; scores must be finite numbers' },
    { run: 'throws', fault: 'scorer exploded' },
  ])('a score function that fails ($run): a reward.error, and the actor serves the next request', async ({ run, fault }) => {
    const before = actor.answered;
    const r = unpack((await nc.request(subject(), request(run), { timeout: 5000 })).data);
    expect(r).toEqual({ type: 'reward.error', v: 1, id: `req-${run}`, instance: 'p-1', message: `reward actor 'picky' (p-1): ${fault}` });
    expect(actor.answered).toBe(before);
    expect(logged.some((l) => l.includes(`could not score request req-${run}`) && l.includes(fault))).toBe(true);

    // Through the client: the error is forwarded with the actor's name and instance.
    const client = new RewardClient(nc, 'picky', { timeoutMs: 5000, retries: 0, waitMs: 5000 });
    try {
      const err = await rejection(client.score(run, 0, ITEMS));
      expect(err).toBeInstanceOf(RewardCallError);
      expect(err.message).toContain(`reward actor 'picky' (instance p-1) could not score: reward actor 'picky' (p-1): ${fault}`);
      // Still serving.
      expect(await client.score('fine', 1, ITEMS)).toEqual(LENGTHS);
      expect(actor.answered).toBe(before + 1);
    } finally {
      client.close();
    }
  });

  it('a request on the shared queue subject is answered too', async () => {
    const r = unpack((await nc.request(rewardSubjects('picky').request, request('queue'), { timeout: 5000 })).data);
    expect(r).toMatchObject({ type: 'reward.reply', id: 'req-queue', instance: 'p-1' });
  });
});

describe('the external example actor (examples/reward-actor/ascending.mjs) as a real process', () => {
  it('serves "ascending": scores sorted responses 1, reversed 0; stops cleanly on SIGTERM', async () => {
    const child = spawn(process.execPath, ['examples/reward-actor/ascending.mjs', '--nats', server.url, '--name', 'asc-test'], {
      cwd: ROOT,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout!.on('data', (b: Buffer) => (out += b.toString()));
    child.stderr!.on('data', (b: Buffer) => (out += b.toString()));
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((r) => child.once('exit', (code, signal) => r({ code, signal })));
    const options: RewardClientOptions = { timeoutMs: 5000, retries: 0, waitMs: 10_000 };
    const client = new RewardClient(nc, 'asc-test', options);
    try {
      await vi.waitFor(() => expect(client.instances()).toHaveLength(1), { timeout: 10_000, interval: 50 });
      const [instance] = client.instances();
      expect(instance).toMatch(/^[0-9a-f]{8}$/);
      const items = [item('up', [1, 2, 3]), item('down', [3, 2, 1]), item('flat', [1, 1, 2]), item('half', [1, 3, 2]), item('one', [5])];
      expect(await client.score('run1', 0, items)).toEqual([1, 0, 1, 0.5, 1]);
      expect(out).toContain(`asc-test/${instance} scored 5 responses for run1, iteration 0`);

      // It refuses another version with a reward.error that says which version it speaks.
      const r = unpack((await nc.request(rewardSubjects('asc-test').instance(instance!), pack({ type: 'reward.request', v: 2, id: 'x', run: 'r', iteration: 0, items: [] }), { timeout: 5000 })).data);
      expect(r).toMatchObject({ type: 'reward.error', v: 1, id: 'x', instance });
      expect(r.message).toContain('speaks v=1');

      child.kill('SIGTERM');
      expect(await exited).toEqual({ code: 0, signal: null });
      expect(out).toContain('stopped');
    } finally {
      client.close();
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    }
  });
});
