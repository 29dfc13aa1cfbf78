// A private nats-server for one run or one test: loopback only, a free port, JetStream with its
// store in a temporary directory, stopped (and its store removed) when the run ends. It is a
// nats-server that can sync every write (2.10 or later; server-binary.ts), where one can be had.
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect } from '@nats-io/transport-node';
import { StorageType, jetstreamManager } from '@nats-io/jetstream';
import { findOnPath, installDebianPackage } from './debian.ts';
import { SYNC_VERSION, atLeast, fetchTrixieServer, ownServer, serverVersion } from './server-binary.ts';

/** Set by the launcher for the supervisor: how the private server's JetStream syncs writes. */
export const BUS_SYNC_ENV = 'FERRY_BUS_SYNC';

export class NatsServerError extends Error {
  override name = 'NatsServerError';
}

const INSTALL_HINT = "install Debian's package (apt-get install nats-server), set FERRY_NATS_SERVER to a nats-server " + 'binary, or set NATS_URL to a server that is already running';

/** The nats-server binary: $FERRY_NATS_SERVER, then PATH, then Debian's /usr/sbin. */
export function findNatsServer(): string | undefined {
  const fromEnv = process.env.FERRY_NATS_SERVER;
  if (fromEnv) return existsSync(fromEnv) ? fromEnv : undefined;
  return findOnPath(['nats-server']);
}

/**
 * Finds nats-server, installing Debian's package when this is a Debian-like machine and we may
 * (root, or password-less sudo). Never downloads anything but from the system's package sources.
 */
export function ensureNatsServer(log: (line: string) => void = () => {}): string {
  const found = findNatsServer();
  if (found) return found;
  if (process.env.FERRY_NATS_SERVER) {
    throw new NatsServerError(`FERRY_NATS_SERVER=${process.env.FERRY_NATS_SERVER} does not exist; ${INSTALL_HINT}`);
  }
  if (installDebianPackage('nats-server', log)) {
    const installed = findNatsServer();
    if (installed) return installed;
  }
  throw new NatsServerError(`no nats-server binary found on PATH or in /usr/sbin; ${INSTALL_HINT}`);
}

/**
 * The nats-server to run: the installed one where it can sync every write (2.10 or later), else
 * ferry's own from Debian trixie (server-binary.ts: fetched through apt once, kept in a folder of
 * its own), else the installed one all the same, saying why. $FERRY_NATS_SERVER is used as it is.
 */
export function syncCapableServer(log: (line: string) => void = () => {}): string {
  const installed = ensureNatsServer(log);
  if (process.env.FERRY_NATS_SERVER || atLeast(serverVersion(installed), SYNC_VERSION)) return installed;
  const own = ownServer();
  if (own) return own;
  // Tried once per process (and, failing, not again for an hour: server-binary.ts keeps why).
  fetched ??= fetchTrixieServer(log);
  if ('bin' in fetched) return fetched.bin;
  if (!warned) log(`using nats-server ${serverVersion(installed) ?? '(unknown version)'}, which cannot sync every write: ${fetched.why}`);
  warned = true;
  return installed;
}
let warned = false;
let fetched: ReturnType<typeof fetchTrixieServer> | undefined;

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const addr = srv.address();
      srv.close(() => (typeof addr === 'object' && addr ? resolve(addr.port) : reject(new Error('no port'))));
    });
  });
}

export interface NatsServerOptions {
  /** Extra command-line arguments. */
  args?: string[];
  /** nats-server configuration text (e.g. `max_payload: 65536`), written to a file it reads. */
  config?: string;
  /** Milliseconds to wait for "Server is ready". */
  readyTimeoutMs?: number;
  log?: (line: string) => void;
  /**
   * JetStream's `sync_interval`: 'always' (every write is on disk before it is acknowledged), or a
   * duration ('2m', the server's default). Needs nats-server 2.10; an older one runs without it,
   * and says so in `sync`.
   */
  sync?: string;
}

export interface PrivateNatsServer {
  url: string;
  port: number;
  storeDir: string;
  /** The server's version ("2.10.27"). */
  version: string;
  /** How JetStream syncs its writes: 'always', an interval, or why it cannot be set. */
  sync: string;
  process: ChildProcess;
  /**
   * Kills the server outright (SIGKILL, as a crash would) and starts it again on the same port
   * with the same store: what a client sees of a server restart.
   */
  restart(options?: { downMs?: number }): Promise<void>;
  /** Kills the server outright and leaves it down (its store stays until stop). */
  kill(): Promise<void>;
  stop(): Promise<void>;
}

/** The server's sync setting as `jetstream {}` takes it, and as a run reports it. */
function syncOf(bin: string, options: NatsServerOptions): { version: string; sync: string; setting?: string } {
  const version = serverVersion(bin) ?? 'unknown';
  if (options.sync === undefined) return { version, sync: 'the server default (2m)' };
  if (!atLeast(version, SYNC_VERSION)) return { version, sync: `not set: nats-server ${version} has no sync_interval (2.10 has)` };
  return { version, sync: options.sync, setting: `sync_interval: ${options.sync}` };
}

export async function startNatsServer(options: NatsServerOptions = {}): Promise<PrivateNatsServer> {
  const bin = syncCapableServer(options.log);
  const { version, sync, setting } = syncOf(bin, options);
  // A port can be taken between freePort() and the server's bind; try a few.
  let lastError: unknown;
  for (let attempt = 0; attempt < 5; attempt++) {
    const dir = mkdtempSync(join(tmpdir(), 'ferry-nats-'));
    const port = await freePort();
    // With a sync setting, JetStream is configured in the file (its block takes it), else by flags.
    const js = setting ? [] : ['-js', '-sd', join(dir, 'store')];
    const config = setting ? [options.config ?? '', `jetstream { store_dir: "${join(dir, 'store')}", ${setting} }`].join('\n') : options.config;
    const launch = () => spawnServer(bin, dir, ['-a', '127.0.0.1', '-p', String(port), ...js, ...(options.args ?? [])], { ...options, ...(config !== undefined ? { config } : {}) });
    try {
      return handle(`nats://127.0.0.1:${port}`, port, join(dir, 'store'), dir, await launch(), launch, { version, sync });
    } catch (err) {
      rmSync(dir, { recursive: true, force: true });
      lastError = err;
    }
  }
  throw lastError;
}

/**
 * Three (or `size`) servers clustered on loopback, with clustered JetStream: a stream with three
 * replicas survives the loss of any one server. Each server has its own client port. Returned once
 * the cluster places a stream on all of its servers; a cluster that does not within
 * CLUSTER_READY_MS (a port taken between choosing and binding it, with other tests beside) is
 * stopped and started again on other ports, up to three times.
 */
export async function startNatsCluster(size = 3, options: NatsServerOptions = {}): Promise<PrivateNatsServer[]> {
  let last = '';
  for (let attempt = 0; attempt < 3; attempt++) {
    const servers = await spawnCluster(size, options);
    const problem = await clusterProblem(servers[0]!.url, size, CLUSTER_READY_MS);
    if (problem === undefined) return servers;
    last = problem;
    await Promise.all(servers.map((s) => s.stop()));
  }
  throw new NatsServerError(`a cluster of ${size} nats-servers did not place a stream on all of them, three times; last: ${last}`);
}

/** How long a new cluster may take to place a stream on all of its servers. */
const CLUSTER_READY_MS = 20_000;

/** Why the cluster at `url` cannot place a stream of `size` replicas within `timeoutMs`, or undefined once it can. */
async function clusterProblem(url: string, size: number, timeoutMs: number): Promise<string | undefined> {
  const until = Date.now() + timeoutMs;
  let problem = 'no answer';
  const nc = await connect({ servers: url, timeout: timeoutMs });
  try {
    const name = `FERRY_READY_${process.pid}_${Date.now()}`;
    while (Date.now() < until) {
      try {
        // JetStream answers only once the cluster has a leader: asked again until it does.
        const jsm = await jetstreamManager(nc, { timeout: 2_000 });
        await jsm.streams.add({ name, subjects: [`ferry.ready.${name}`], num_replicas: size, storage: StorageType.Memory });
        await jsm.streams.delete(name);
        return undefined;
      } catch (e) {
        problem = (e as Error).message;
        await new Promise((r) => setTimeout(r, 250));
      }
    }
    return problem;
  } finally {
    await nc.close();
  }
}

async function spawnCluster(size: number, options: NatsServerOptions): Promise<PrivateNatsServer[]> {
  const bin = syncCapableServer(options.log);
  const { version, sync, setting } = syncOf(bin, options);
  const ports = [];
  for (let i = 0; i < size; i++) ports.push({ client: await freePort(), cluster: await freePort() });
  const name = `ferry-${process.pid}-${Date.now()}`;
  const routes = ports.map((p) => `nats-route://127.0.0.1:${p.cluster}`).join(', ');
  const servers = await Promise.all(
    ports.map(async (p, i) => {
      const dir = mkdtempSync(join(tmpdir(), 'ferry-nats-'));
      const store = join(dir, 'store');
      const config = [
        `server_name: ${name}-s${i}`,
        'host: 127.0.0.1',
        `port: ${p.client}`,
        `jetstream { store_dir: "${store}"${setting ? `, ${setting}` : ''} }`,
        `cluster { name: ${name}, listen: 127.0.0.1:${p.cluster}, routes: [${routes}] }`,
        options.config ?? '',
      ].join('\n');
      const launch = () => spawnServer(bin, dir, options.args ?? [], { ...options, config });
      return handle(`nats://127.0.0.1:${p.client}`, p.client, store, dir, await launch(), launch, { version, sync });
    }),
  );
  return servers;
}

function spawnServer(bin: string, dir: string, args: string[], options: NatsServerOptions): Promise<ChildProcess> {
  const config = options.config === undefined ? [] : ['-c', join(dir, 'nats.conf')];
  if (options.config !== undefined) writeFileSync(join(dir, 'nats.conf'), `${options.config}\n`);
  // Its own process group, so that a terminal's Ctrl-C does not stop it before the run has ended.
  const child = spawn(bin, [...config, ...args], { stdio: ['ignore', 'ignore', 'pipe'], detached: true });
  let stderr = '';
  return new Promise<ChildProcess>((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new NatsServerError(`nats-server did not get ready in ${options.readyTimeoutMs ?? 10000} ms:\n${stderr}`));
    }, options.readyTimeoutMs ?? 10000);
    const onData = (b: Buffer) => {
      stderr += b.toString();
      if (stderr.includes('Server is ready')) {
        clearTimeout(timer);
        child.stderr!.off('data', onData);
        child.stderr!.resume();
        resolve(child);
      }
    };
    child.stderr!.on('data', onData);
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new NatsServerError(`nats-server exited with code ${code} before it was ready:\n${stderr.trim()}`));
    });
  });
}

const gone = (child: ChildProcess) => (child.exitCode !== null || child.signalCode !== null ? Promise.resolve() : new Promise<void>((r) => child.once('exit', () => r())));

function handle(url: string, port: number, storeDir: string, dir: string, first: ChildProcess, launch: () => Promise<ChildProcess>, bus: { version: string; sync: string }): PrivateNatsServer {
  let stopping: Promise<void> | undefined;
  const server: PrivateNatsServer = {
    url,
    port,
    storeDir,
    ...bus,
    process: first,
    async kill() {
      server.process.kill('SIGKILL');
      await gone(server.process);
    },
    async restart(opts = {}) {
      await server.kill();
      if (opts.downMs) await new Promise((r) => setTimeout(r, opts.downMs));
      server.process = await launch();
    },
    stop() {
      stopping ??= (async () => {
        const child = server.process;
        if (child.exitCode === null && child.signalCode === null) {
          child.kill('SIGTERM');
          const killer = setTimeout(() => child.kill('SIGKILL'), 5000);
          await gone(child);
          clearTimeout(killer);
        }
        rmSync(dir, { recursive: true, force: true });
      })();
      return stopping;
    },
  };
  return server;
}
