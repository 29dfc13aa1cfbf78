// The nats-server that syncs every write: versions compared, the mirror read from apt's sources,
// and a private server started with sync_interval: always where one can be had.
import { describe, expect, it } from 'vitest';
import { freePort, startNatsServer } from './nats-server.ts';
import { SYNC_VERSION, atLeast, compareVersions, serverVersion } from './server-binary.ts';

describe('the server that syncs every write', () => {
  it('compares versions as numbers, not text', () => {
    expect(atLeast('2.10.27', SYNC_VERSION)).toBe(true);
    expect(atLeast('2.9.10', SYNC_VERSION)).toBe(false);
    expect(atLeast('3.0.0', SYNC_VERSION)).toBe(true);
    expect(atLeast(undefined, SYNC_VERSION)).toBe(false);
    expect(['2.10.27', '2.9.10', '2.10.3'].sort(compareVersions)).toEqual(['2.9.10', '2.10.3', '2.10.27']);
  });

  it('starts a private server with sync_interval: always, and says so; without the option, the server default', async () => {
    const [m1, m2] = [await freePort(), await freePort()];
    const always = await startNatsServer({ sync: 'always', args: ['-m', String(m1)] });
    const plain = await startNatsServer({ args: ['-m', String(m2)] });
    // What the server itself says of its JetStream (the monitoring endpoint).
    const jsz = async (port: number) => ((await (await fetch(`http://127.0.0.1:${port}/jsz`)).json()) as { config: { sync_always?: boolean } }).config;
    try {
      expect((await jsz(m1)).sync_always).toBe(true);
      expect((await jsz(m2)).sync_always ?? false).toBe(false);
      // ferry's own set-up gets a 2.10 server where the installed one is older (this machine's is 2.9.10).
      expect(atLeast(always.version, SYNC_VERSION), `nats-server ${always.version}: ${always.sync}`).toBe(true);
      expect(always.sync).toBe('always');
      expect(serverVersion(always.process.spawnfile)).toBe(always.version);
      expect(plain.sync).toBe('the server default (2m)');
    } finally {
      await always.stop();
      await plain.stop();
    }
  });
});
