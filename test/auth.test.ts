// A closed bus: the server enforces each role's subjects. A reward actor's credential serves
// reward requests and nothing else; a client without credentials is refused; a parameter chunk
// with a wrong digest is rejected even when sent by a role allowed to send chunks. And a whole
// run works on a closed bus.
import { existsSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { createUser } from '@nats-io/nkeys';
import { join } from 'node:path';
import type { NatsConnection } from '@nats-io/transport-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RewardClient } from '../engine/runtime/reward-client.ts';
import { serveReward } from '../actors/reward-actor.ts';
import { launch } from '../engine/cli/launch.ts';
import { loadScenario } from '../engine/runtime/scenario.ts';
import { authConfig, makeCredentials, type RunCredentials as Credentials } from '../mesh/wire/auth.ts';
import { BusError, connectBus, credentialsOf } from '../mesh/wire/bus.ts';
import { encode } from '../mesh/wire/codec.ts';
import { startNatsServer, type PrivateNatsServer } from '../mesh/wire/nats-server.ts';
import { PROTOCOL_VERSION } from '../mesh/wire/protocol.ts';
import { subjects } from '../mesh/wire/subjects.ts';
import { chunksOf, receiveTensors } from '../mesh/wire/transfer.ts';
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

const until = async (what: () => boolean, ms = 5000) => {
  const end = Date.now() + ms;
  while (!what() && Date.now() < end) await new Promise((r) => setTimeout(r, 50));
};

describe('a closed bus', () => {
  let server: PrivateNatsServer;
  let creds: Credentials;

  beforeAll(async () => {
    creds = makeCredentials(RUN);
    server = await startNatsServer({ config: authConfig(RUN, creds) });
  });
  afterAll(() => server.stop());

  it('refuses a client with no credentials, or with a wrong password', async () => {
    await expect(connectBus(server.url, 'stranger', { user: undefined, pass: undefined })).rejects.toThrow(BusError);
    await expect(connectBus(server.url, 'stranger')).rejects.toThrow(/Authorization Violation|authorization/i);
    await expect(connectBus(server.url, 'guesser', { user: creds.worker.user, pass: 'guess' })).rejects.toThrow(/Authorization Violation|authorization/i);
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
      rewardNc.publish(subj.chunks('t1'), encode(chunk!));
      await until(() => refused.length >= 1);
      rewardNc.publish(subj.call(0), encode({ type: 'call', v: PROTOCOL_VERSION, id: 'c', model: 'actor', iteration: 0, body: { fn: 'shutdown' } }));
      await until(() => refused.length >= 2);
      rewardNc.publish(subj.events, encode({ type: 'done', v: PROTOCOL_VERSION, status: 'failed', message: 'forged' }));
      await until(() => refused.length >= 3);
      rewardNc.subscribe(subj.chunks('t1'), { callback: () => {} });
      await until(() => refused.length >= 4);
      expect(refused).toHaveLength(4);
      expect(refused[0]).toMatch(new RegExp(`publish.*${subj.chunks('t1').replaceAll('.', '\\.')}`, 'i'));
      expect(refused[1]).toMatch(new RegExp(`publish.*${subj.call(0).replaceAll('.', '\\.')}`, 'i'));
      expect(refused[2]).toMatch(new RegExp(`publish.*${subj.events.replaceAll('.', '\\.')}`, 'i'));
      expect(refused[3]).toMatch(/subscription/i);
    } finally {
      await rewardNc.close().catch(() => {});
      await supNc.close().catch(() => {});
    }
  });

  it('rejects a parameter chunk with a wrong digest, even from a role that may send chunks', async () => {
    const sender = await connectBus(server.url, 'worker-a', creds.worker);
    const receiver = await connectBus(server.url, 'worker-b', creds.worker);
    try {
      const incoming = receiveTensors(receiver, subj, [{ transfer: 't2', expected: [{ name: 'w', shape: [4] }] }], 10_000, () => {});
      await receiver.flush();
      incoming.arm();
      const [chunk] = [...chunksOf('t2', [{ name: 'w', shape: [4], data: Float32Array.from([1, 2, 3, 4]) }], 1 << 20)];
      const forged = { ...chunk!, data: Float32Array.from([1, 2, 3, 5]) };
      sender.publish(subj.chunks('t2'), encode(forged));
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
    expect(Object.keys(written).sort()).toEqual(['launcher', 'reward', 'supervisor', 'worker']);
    expect(written.reward.pass.length).toBeGreaterThan(16);
    expect(statSync(join(out, 'credentials.json')).mode & 0o777).toBe(0o600);
    expect(said.join('\n')).toMatch(/the bus is closed: credentials per role in/);
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
