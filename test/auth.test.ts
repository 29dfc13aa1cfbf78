// A closed bus: the server enforces each role's subjects, and each device's. A worker cannot write
// results, the run's state or events, say go, or beat, hear or answer for another device; the
// supervisor cannot say done or exit, nor answer chaos requests; the launcher cannot say anything
// but done, exit and its logs; a reward actor's credential serves reward requests and nothing
// else; a client without credentials is refused; a parameter chunk with a wrong digest is rejected
// even when sent by a role allowed to send chunks. And a whole run works on a closed bus, with
// nothing refused to any of its processes.
import { existsSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { createUser } from '@nats-io/nkeys';
import { join } from 'node:path';
import { errors, type NatsConnection } from '@nats-io/transport-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RewardClient } from '../engine/runtime/run/reward-client.ts';
import { serveReward } from '../actors/reward-actor.ts';
import { launch } from '../engine/cli/launch.ts';
import { loadScenario } from '../engine/runtime/scenario/scenario.ts';
import { authConfig, deviceOfUser, EVENTS_BY_ROLE, makeCredentials, type RunCredentials as Credentials } from '../mesh/wire/bus/auth.ts';
import { BusError, connectBus, credentialsOf, request, type Msg } from '../mesh/wire/bus/bus.ts';
import { NatsShelf } from '../mesh/wire/transfer/shelf.ts';
import { jetstream } from '@nats-io/jetstream';
import { Objm } from '@nats-io/obj';
import { encode } from '../mesh/wire/messages/codec.ts';
import { publishEvent, subscribeEvents } from '../mesh/wire/bus/events.ts';
import { startNatsServer, type PrivateNatsServer } from '../mesh/wire/server/nats-server.ts';
import { ChaosSpare, PROTOCOL_VERSION, RunEvent } from '../mesh/wire/messages/protocol.ts';
import { subjects } from '../mesh/wire/bus/subjects.ts';
import { chunksOf, receiveTensors } from '../mesh/wire/transfer/transfer.ts';
import { smallScenario, tempDir } from './helpers.ts';

const RUN = 'closed1';
const subj = subjects(RUN);

/** The permission violations the server reports to this connection, as they come. */
function violations(nc: NatsConnection): string[] {
  const seen: string[] = [];
  void (async () => {
    for await (const s of nc.status()) if (s.type === 'error') seen.push(String((s as { error?: Error }).error?.message ?? s));
  })();
  return seen;
}

/** A client with one credential, and what the server refused it: `publish <subject>` or `subscription <subject>`. */
async function client(url: string, name: string, credential: { user: string; pass: string }) {
  const nc = await connectBus(url, name, credential);
  const refused: string[] = [];
  void (async () => {
    for await (const s of nc.status()) if (s.type === 'error' && s.error instanceof errors.PermissionViolationError) refused.push(`${s.error.operation} ${s.error.subject}`);
  })();
  /** Does `act`, and says what the server refused for it (nothing: an empty list). */
  const tries = async (act: () => void): Promise<string[]> => {
    const before = refused.length;
    act();
    // A refusal comes back before the answer to a ping sent after it: the server keeps a
    // connection's order. The status iterator hears it a turn of the event loop later.
    await nc.flush();
    await new Promise((r) => setTimeout(r, 10));
    return refused.slice(before);
  };
  const publishes = (subject: string) => tries(() => nc.publish(subject, encode({ type: 'forged', v: PROTOCOL_VERSION })));
  const subscribes = (subject: string) => tries(() => nc.subscribe(subject, { callback: () => {} }));
  return { nc, tries, publishes, subscribes, refused };
}

const until = async (what: () => boolean, ms = 5000) => {
  const end = Date.now() + ms;
  while (!what() && Date.now() < end) await new Promise((r) => setTimeout(r, 50));
};

describe('a closed bus', () => {
  let server: PrivateNatsServer;
  let creds: Credentials;

  beforeAll(async () => {
    creds = makeCredentials(RUN, [0, 1]);
    server = await startNatsServer({ config: authConfig(RUN, creds) });
  });
  afterAll(() => server.stop());

  it('has a publisher for every kind of run event, and a worker credential names its device', () => {
    const kinds = RunEvent.options.map((o) => o.shape.type.value).sort();
    expect([...new Set([...EVENTS_BY_ROLE.launcher, ...EVENTS_BY_ROLE.supervisor])].sort()).toEqual(kinds);
    expect(creds.workers[1]!.user).toBe(`worker1-${RUN}`);
    expect([deviceOfUser(RUN, creds.workers[1]!.user), deviceOfUser('other', creds.workers[1]!.user), deviceOfUser(RUN, creds.supervisor.user)]).toEqual([1, undefined, undefined]);
  });

  it('refuses a client with no credentials, or with a wrong password', async () => {
    await expect(connectBus(server.url, 'stranger', { user: undefined, pass: undefined })).rejects.toThrow(BusError);
    await expect(connectBus(server.url, 'stranger')).rejects.toThrow(/Authorization Violation|authorization/i);
    await expect(connectBus(server.url, 'guesser', { user: creds.workers[0]!.user, pass: 'guess' })).rejects.toThrow(/Authorization Violation|authorization/i);
  });

  it('lets a reward credential serve reward requests, and refuses it a parameter chunk, a call, a run event and a run subscription', async () => {
    const rewardNc = await connectBus(server.url, 'reward-actor', creds.reward);
    const refused = violations(rewardNc);
    const supNc = await connectBus(server.url, 'supervisor', creds.supervisor);
    try {
      const actor = await serveReward({ nats: rewardNc, name: 'closed', score: (items) => items.map((it) => it.response.length) });
      const client = new RewardClient(supNc, 'closed', { timeoutMs: 2000, retries: 0, waitMs: 5000 });
      const item = { id: 'x', prompt: [1], response: [1, 2, 3], prompt_text: '1', response_text: '123' };
      expect(await client.score(RUN, 0, [item])).toEqual([3]);
      client.close();
      await actor.stop();
      expect(refused).toEqual([]);

      // A parameter chunk, a call to a device, and a run event: each refused by the server.
      const [chunk] = [...chunksOf('t1', [{ name: 'w', shape: [4], data: Float32Array.from([1, 2, 3, 4]) }], 1 << 20)];
      rewardNc.publish(subj.chunks('t1', 'supervisor'), encode(chunk!));
      await until(() => refused.length >= 1);
      rewardNc.publish(subj.call(0), encode({ type: 'call', v: PROTOCOL_VERSION, id: 'c', model: 'actor', iteration: 0, body: { fn: 'shutdown' } }));
      await until(() => refused.length >= 2);
      rewardNc.publish(subj.event('done'), encode({ type: 'done', v: PROTOCOL_VERSION, status: 'failed', message: 'forged' }));
      await until(() => refused.length >= 3);
      rewardNc.subscribe(subj.transferChunks('t1'), { callback: () => {} });
      await until(() => refused.length >= 4);
      expect(refused).toHaveLength(4);
      expect(refused[0]).toMatch(new RegExp(`publish.*${subj.chunks('t1', 'supervisor').replaceAll('.', '\\.')}`, 'i'));
      expect(refused[1]).toMatch(new RegExp(`publish.*${subj.call(0).replaceAll('.', '\\.')}`, 'i'));
      expect(refused[2]).toMatch(new RegExp(`publish.*${subj.event('done').replaceAll('.', '\\.')}`, 'i'));
      expect(refused[3]).toMatch(/subscription/i);
    } finally {
      await rewardNc.close().catch(() => {});
      await supNc.close().catch(() => {});
    }
  });

  it("lets a worker beat, answer its own device's calls once, and send chunks and collectives; refuses it results, the run's state, events, go and another device's subjects", async () => {
    const w = await client(server.url, 'worker-0', creds.workers[0]!);
    const sup = await client(server.url, 'supervisor', creds.supervisor);
    try {
      // What its part of the protocol needs.
      for (const subject of [subj.heartbeat(0), subj.turns(0), subj.joinAs(0), subj.ready('r1'), subj.chunks('w1', 0), subj.receipts('w1', 0), subj.collective(1, 0), subj.chaos])
        expect(await w.publishes(subject)).toEqual([]);
      for (const subject of [subj.events, subj.supervisorBeat, subj.go('r1'), subj.transferChunks('w1'), subj.transferReceipts('w1'), subj.collectivesTo(0)])
        expect(await w.subscribes(subject)).toEqual([]);
      // A call to its device it hears and answers, once: a reply is a response, not a publish.
      const heard = new Promise<Msg>((resolve) => w.nc.subscribe(subj.call(0), { callback: (_e, msg) => resolve(msg) }));
      await w.nc.flush();
      const reply = sup.nc.request(subj.call(0), encode({ type: 'call', v: PROTOCOL_VERSION, id: 'c1', model: 'actor', iteration: 0, body: { fn: 'manifest' } }), { timeout: 5000 });
      const call = await heard;
      const answer = encode({ type: 'error', v: PROTOCOL_VERSION, id: 'c1', code: 'not_loaded', message: 'nothing here' });
      expect(await w.tries(() => call.respond(answer))).toEqual([]);
      expect((await reply).data).toEqual(answer);
      expect(await w.tries(() => call.respond(answer))).toEqual([`publish ${call.reply}`]);

      // Results, the KV bucket, snapshots, JetStream's API, every event, go, another device's
      // beat and calls, and the supervisor's inbox (a forged reply): each refused by the server.
      const forbidden = [
        subj.results(0, 'rollout'),
        `$KV.ferry-${RUN}.progress`,
        `$O.ferry-${RUN}-snapshots.C.x`,
        `$JS.API.STREAM.PURGE.FERRY-${RUN}`,
        ...(['done', 'exit', 'lost', 'log', 'phase', 'recovered'] as const).map((t) => subj.event(t)),
        subj.go('r1'),
        subj.heartbeat(1),
        subj.call(1),
        // A hello as another device (while it is recovered, say), or as any device.
        subj.joinAs(1),
        subj.join,
        // Another device's answers from an environment (a forged record a recovery would read).
        subj.turns(1),
        // Chunks, receipts and collectives as another device or as the supervisor.
        subj.chunks('w1', 1),
        subj.chunks('w1', 'supervisor'),
        subj.receipts('w1', 'supervisor'),
        subj.collective(1, 2),
        subj.supervisorBeat,
        `_INBOX.supervisor-${RUN}.forged`,
      ];
      for (const subject of forbidden) expect(await w.publishes(subject)).toEqual([`publish ${subject}`]);
      // Nor may it hear another device's calls (and so answer them), hellos (and welcome workers),
      // chaos requests, or anybody's replies.
      for (const subject of [subj.call(1), subj.collectivesTo(1), subj.join, subj.joins, subj.chaos, '_INBOX.>', `_INBOX.supervisor-${RUN}.>`, subj.allResults, subj.allTurns]) {
        expect(await w.subscribes(subject)).toEqual([`subscription ${subject}`]);
      }
      expect(sup.refused).toEqual([]);
    } finally {
      await w.nc.close();
      await sup.nc.close();
    }
  });

  it("lets a worker write its own device's snapshot bucket and no other, and read any; the supervisor reads and prunes every device's", async () => {
    const w = await client(server.url, 'worker-0', creds.workers[0]!);
    const sup = await client(server.url, 'supervisor', creds.supervisor);
    try {
      const mine = new NatsShelf(w.nc, RUN, { timeoutMs: 2000 });
      const all = new NatsShelf(sup.nc, RUN, { timeoutMs: 2000 });
      const bytes = Uint8Array.from({ length: 300_000 }, (_, i) => i % 251);
      // The supervisor makes every device's bucket; a worker may not make one (its stream's subjects could be anyone's).
      await expect(mine.create(0)).rejects.toThrow();
      await until(() => w.refused.length > 0);
      expect(w.refused).toEqual([`publish $JS.API.STREAM.CREATE.OBJ_ferry-${RUN}-d0`]);
      w.refused.length = 0;
      await all.create(0);
      await all.create(1);
      const sha = await mine.put(0, 's0-e0.actor.r0', bytes);
      // Written again (a snapshot taken again after a recovery): the old object's chunks are purged.
      expect(await mine.put(0, 's0-e0.actor.r0', bytes)).toBe(sha);
      expect(w.refused).toEqual([]);
      // Another device's bucket: refused by the server before anything is created or written.
      await expect(mine.put(1, 's0-e0.actor.r1', bytes)).rejects.toThrow();
      await until(() => w.refused.length > 0);
      expect(w.refused[0]).toMatch(new RegExp(`^publish \\$O\\.ferry-${RUN}-d1\\.C\\.\\w+$`));
      // Nor may it write the manifests' bucket, or purge another device's stream, or write its objects directly.
      for (const subject of [
        `$O.ferry-${RUN}-snapshots.M.x`,
        `$JS.API.STREAM.PURGE.OBJ_ferry-${RUN}-d1`,
        `$O.ferry-${RUN}-d1.C.x`,
        `$JS.API.STREAM.DELETE.OBJ_ferry-${RUN}-d0`,
        `$JS.API.STREAM.CREATE.OBJ_ferry-${RUN}-d0`,
        `$JS.API.STREAM.UPDATE.OBJ_ferry-${RUN}-d0`,
      ]) {
        expect(await w.publishes(subject)).toEqual([`publish ${subject}`]);
      }
      // Another device's bucket it may read (a rank reloaded from a replica's object).
      await all.put(1, 's0-e0.actor.r1', bytes.subarray(7));
      expect(await mine.get(1, 's0-e0.actor.r1')).toEqual(bytes.subarray(7));
      const before = w.refused.length;
      expect(await mine.get(0, 's0-e0.actor.r0')).toEqual(bytes);
      expect(w.refused.length).toBe(before);
      // The supervisor reads it, byte for byte (so does the object store's own reader: the layout is its), and deletes it.
      expect(await all.get(0, 's0-e0.actor.r0')).toEqual(bytes);
      expect(await (await new Objm(jetstream(sup.nc)).open(`ferry-${RUN}-d0`)).getBlob('s0-e0.actor.r0')).toEqual(bytes);
      await all.delete(1, 's0-e0.actor.r1');
      expect(await all.get(1, 's0-e0.actor.r1')).toBeUndefined();
      await all.delete(0, 's0-e0.actor.r0');
      expect(await all.get(0, 's0-e0.actor.r0')).toBeUndefined();
      expect(sup.refused).toEqual([]);
    } finally {
      await w.nc.close();
      await sup.nc.close();
    }
  });

  it('lets the supervisor call, say go, write the run state and its events; refuses it done, exit, chaos answers and what only a device sends or hears', async () => {
    const sup = await client(server.url, 'supervisor', creds.supervisor);
    try {
      const allowed = [
        subj.call(0),
        subj.go('r1'),
        subj.chunks('s1', 'supervisor'),
        subj.receipts('s1', 'supervisor'),
        subj.results(0, 'rollout'),
        `$KV.ferry-${RUN}.progress`,
        subj.supervisorBeat,
        ...(['phase', 'progress', 'log', 'recovered', 'lost'] as const).map((t) => subj.event(t)),
      ];
      for (const subject of allowed) expect(await sup.publishes(subject)).toEqual([]);
      for (const subject of [subj.event('done'), subj.event('exit'), subj.heartbeat(0), subj.ready('r1'), subj.chunks('s1', 0), subj.receipts('s1', 0), subj.collective(0, 1), subj.join]) {
        expect(await sup.publishes(subject)).toEqual([`publish ${subject}`]);
      }
      for (const subject of [subj.chaos, subj.call(0), subj.collectivesTo(0), '_INBOX.>']) expect(await sup.subscribes(subject)).toEqual([`subscription ${subject}`]);
    } finally {
      await sup.nc.close();
    }
  });

  it('lets the launcher say done, exit and its logs, and answer chaos requests; refuses it everything else', async () => {
    const launcher = await client(server.url, 'launcher', creds.launcher);
    const w = await client(server.url, 'worker-1', creds.workers[1]!);
    try {
      for (const subject of [subj.event('done'), subj.event('exit'), subj.event('log')]) expect(await launcher.publishes(subject)).toEqual([]);
      const forbidden = [
        ...(['lost', 'phase', 'progress', 'recovered'] as const).map((t) => subj.event(t)),
        subj.go('r1'),
        subj.call(0),
        subj.results(0, 'rollout'),
        `$KV.ferry-${RUN}.progress`,
        `$JS.API.STREAM.PURGE.FERRY-${RUN}`,
        subj.heartbeat(0),
        subj.chunks('l1', 'supervisor'),
      ];
      for (const subject of forbidden) expect(await launcher.publishes(subject)).toEqual([`publish ${subject}`]);
      for (const subject of [subj.call(0), subj.join, subj.transferChunks('l1'), '_INBOX.>']) expect(await launcher.subscribes(subject)).toEqual([`subscription ${subject}`]);

      // A worker at a chaos point asks; the launcher alone hears it, and answers.
      launcher.nc.subscribe(subj.chaos, { callback: (_e, msg) => void msg.respond(encode({ type: 'spare', v: PROTOCOL_VERSION, target: 'k1' })) });
      await launcher.nc.flush();
      const spared = await request(w.nc, subj.chaos, { type: 'chaos', v: PROTOCOL_VERSION, target: 'k1', pid: 1, where: 'here' }, ChaosSpare, 5000);
      expect(spared).toEqual({ type: 'spare', v: PROTOCOL_VERSION, target: 'k1' });
      expect(w.refused).toEqual([]);
    } finally {
      await launcher.nc.close();
      await w.nc.close();
    }
  });

  it("takes an event only from its own type's subject: the supervisor's log cannot carry a done", async () => {
    const sup = await connectBus(server.url, 'supervisor', creds.supervisor);
    const launcher = await connectBus(server.url, 'launcher', creds.launcher);
    const w = await connectBus(server.url, 'worker-0', creds.workers[0]!);
    try {
      const heard: string[] = [];
      const stop = subscribeEvents(
        w,
        subj,
        (e) => heard.push(e.type),
        (err) => heard.push(`malformed: ${err.problem}`),
      );
      await w.flush();
      sup.publish(subj.event('log'), encode({ type: 'done', v: PROTOCOL_VERSION, status: 'failed', message: 'forged' }));
      await sup.flush();
      publishEvent(launcher, subj, { type: 'done', status: 'succeeded', message: '3 iterations' });
      await until(() => heard.length >= 2);
      stop();
      expect(heard).toEqual([`malformed: a 'done' event travels on ${subj.event('done')}, not here`, 'done']);
    } finally {
      await Promise.all([sup.close(), launcher.close(), w.close()]);
    }
  });

  it('rejects a parameter chunk with a wrong digest, even from a role that may send chunks', async () => {
    const sender = await connectBus(server.url, 'worker-a', creds.workers[0]!);
    const receiver = await connectBus(server.url, 'worker-b', creds.workers[1]!);
    try {
      const incoming = receiveTensors(receiver, subj, [{ transfer: 't2', expected: [{ name: 'w', shape: [4] }] }], 10_000, () => {});
      await receiver.flush();
      incoming.arm();
      const [chunk] = [...chunksOf('t2', [{ name: 'w', shape: [4], data: Float32Array.from([1, 2, 3, 4]) }], 1 << 20, { from: 0 })];
      const forged = { ...chunk!, data: Float32Array.from([1, 2, 3, 5]) };
      sender.publish(subj.chunks('t2', 0), encode(forged));
      await expect(incoming.done).rejects.toThrow(/digest/i);
      incoming.close();
    } finally {
      await sender.close();
      await receiver.close();
    }
  });
});

describe('a run on a closed bus, by default', () => {
  const quiet = { phase() {}, iteration() {}, stop() {} };

  it('runs with per-role credentials and leaves them in the run directory', async () => {
    const dir = tempDir();
    const out = join(dir, 'run');
    const said: string[] = [];
    const r = await launch({ scenario: loadScenario(smallScenario(dir)), run: `auth${Date.now()}`, out, progress: quiet, say: (l) => said.push(l) });
    expect(r.summary?.error).toBeUndefined();
    expect(r.code).toBe(0);
    const written = JSON.parse(readFileSync(join(out, 'credentials.json'), 'utf8')) as Credentials;
    expect(Object.keys(written).sort()).toEqual(['environment', 'launcher', 'reward', 'supervisor', 'workers']);
    // One worker credential per device of the plan.
    expect(Object.keys(written.workers)).toEqual(['0', '1', '2', '3']);
    expect(written.reward.pass.length).toBeGreaterThan(16);
    expect(statSync(join(out, 'credentials.json')).mode & 0o777).toBe(0o600);
    expect(said.join('\n')).toMatch(/the bus is closed: credentials per role in/);
    // Least privilege, but enough: nothing any of its processes did was refused.
    const logs = join(out, 'logs');
    const refusals = [...said, ...readdirSync(logs).flatMap((f) => readFileSync(join(logs, f), 'utf8').split('\n'))].filter((l) => /the server refused|Permissions Violation/i.test(l));
    expect(refusals).toEqual([]);
    // Each worker was started as its own device.
    for (const d of [0, 1, 2, 3]) expect(readFileSync(join(logs, `worker-${d}.log`), 'utf8')).toMatch(new RegExp(`as device ${d}\\b`));
  }, 120_000);

  it('with --open, writes no credentials and says so on the screen', async () => {
    const dir = tempDir();
    const out = join(dir, 'run');
    const said: string[] = [];
    const r = await launch({ scenario: loadScenario(smallScenario(dir)), run: `open${Date.now()}`, out, open: true, progress: quiet, say: (l) => said.push(l) });
    expect(r.code).toBe(0);
    expect(existsSync(join(out, 'credentials.json'))).toBe(false);
    expect(said.join('\n')).toMatch(/the bus is OPEN \(--open\): anyone who can reach the server can publish and subscribe on this run/);
  }, 120_000);

  it('on a server it is given that takes anyone, warns once', async () => {
    const dir = tempDir();
    const open = await startNatsServer();
    try {
      const said: string[] = [];
      const r = await launch({ scenario: loadScenario(smallScenario(dir)), run: `given${Date.now()}`, out: join(dir, 'run'), natsUrl: open.url, progress: quiet, say: (l) => said.push(l) });
      expect(r.code).toBe(0);
      expect(said.filter((l) => /accepted a connection without credentials/.test(l))).toHaveLength(1);
    } finally {
      await open.stop();
    }
  }, 120_000);
});

describe("credentials for a server of one's own: a token, an NKey, a creds file, from the environment", () => {
  it('connects with a token, and is refused without it', async () => {
    const server = await startNatsServer({ config: 'authorization { token: "s3cr3t-token-9" }' });
    try {
      const nc = await connectBus(server.url, 'with-token', { token: 's3cr3t-token-9' });
      await nc.close();
      await expect(connectBus(server.url, 'no-token', { user: 'x', pass: 'y' })).rejects.toThrow(/Authorization Violation|authorization/i);
      // From the environment, as the workers and the supervisor read it.
      expect(credentialsOf({}, { FERRY_NATS_TOKEN: 't' })).toMatchObject({ token: 't' });
    } finally {
      await server.stop();
    }
  });

  it('connects with an NKey seed file, and is refused with another key', async () => {
    const user = createUser();
    const other = createUser();
    const server = await startNatsServer({ config: `authorization { users: [ { nkey: "${user.getPublicKey()}" } ] }` });
    const dir = tempDir();
    try {
      writeFileSync(join(dir, 'user.nk'), `${new TextDecoder().decode(user.getSeed())}\n`);
      writeFileSync(join(dir, 'other.nk'), new TextDecoder().decode(other.getSeed()));
      const nc = await connectBus(server.url, 'with-nkey', { nkeyFile: join(dir, 'user.nk') });
      await nc.close();
      await expect(connectBus(server.url, 'other-nkey', { nkeyFile: join(dir, 'other.nk') })).rejects.toThrow(/Authorization Violation|authorization/i);
      await expect(connectBus(server.url, 'missing', { credsFile: join(dir, 'none.creds') })).rejects.toThrow(/cannot read the creds file .*none\.creds/);
    } finally {
      await server.stop();
    }
  });

  it('refuses two ways at once, naming both', () => {
    expect(() => credentialsOf({}, { FERRY_NATS_USER: 'u', FERRY_NATS_PASS: 'p', FERRY_NATS_NKEY: '/k' })).toThrow(
      /expected one way to authenticate to NATS, got a user \(FERRY_NATS_USER\) and an NKey \(FERRY_NATS_NKEY\)/,
    );
    // Credentials given in the call replace the environment's whole.
    expect(credentialsOf({ user: 'a', pass: 'b' }, { FERRY_NATS_TOKEN: 't' })).toEqual({ user: 'a', pass: 'b' });
  });
});
