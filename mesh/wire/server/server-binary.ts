// A nats-server that can sync every JetStream write (`sync_interval`, 2.10 and later). Debian
// bookworm packages 2.9.10, which cannot; trixie packages 2.10, whose binary runs on bookworm.
// Where the installed server is older, ferry fetches trixie's package through apt (the system's
// own Debian mirror and keyring, a source list and package lists of its own: the system's apt
// state is not touched), unpacks the binary into a folder of its own and uses it. The system's
// server is never replaced.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';

/** The oldest nats-server that knows `jetstream { sync_interval }`. */
export const SYNC_VERSION = [2, 10] as const;

const versions = new Map<string, string | undefined>();

/** A binary's version ("2.9.10"), asked once per process; undefined when it does not answer. */
export function serverVersion(bin: string): string | undefined {
  if (!versions.has(bin)) {
    const r = spawnSync(bin, ['--version'], { encoding: 'utf8', timeout: 10_000 });
    versions.set(bin, /v?(\d+\.\d+\.\d+)/.exec(`${r.stdout ?? ''}${r.stderr ?? ''}`)?.[1]);
  }
  return versions.get(bin);
}

/** Whether `version` is at least major.minor. */
export function atLeast(version: string | undefined, [major, minor]: readonly [number, number]): boolean {
  if (!version) return false;
  const [a = 0, b = 0] = version.split('.').map(Number);
  return a > major || (a === major && b >= minor);
}

/** Orders "2.9.10" before "2.10.27". */
export function compareVersions(a: string, b: string): number {
  const [x, y] = [a.split('.').map(Number), b.split('.').map(Number)];
  for (let i = 0; i < Math.max(x.length, y.length); i++) if ((x[i] ?? 0) !== (y[i] ?? 0)) return (x[i] ?? 0) - (y[i] ?? 0);
  return 0;
}

/** Where ferry keeps its own nats-server: $FERRY_HOME, else ~/.cache/ferry. */
export function ferryHome(): string {
  return process.env.FERRY_HOME ?? join(process.env.XDG_CACHE_HOME ?? join(homedir(), '.cache'), 'ferry');
}

/** ferry's own nats-server from trixie, if it was unpacked before. */
export function ownServer(): string | undefined {
  const dir = join(ferryHome(), 'nats-server');
  if (!existsSync(dir)) return undefined;
  const newest = readdirSync(dir)
    .filter((v) => /^\d+\.\d+\.\d+$/.test(v) && atLeast(v, SYNC_VERSION) && existsSync(join(dir, v, 'nats-server')))
    .sort(compareVersions)
    .at(-1);
  return newest ? join(dir, newest, 'nats-server') : undefined;
}

/** The Debian mirror the system's sources name (deb822 .sources or one-line sources.list). */
export function debianMirror(): string {
  const files = ['/etc/apt/sources.list', ...(existsSync('/etc/apt/sources.list.d') ? readdirSync('/etc/apt/sources.list.d').map((f) => join('/etc/apt/sources.list.d', f)) : [])];
  for (const f of files) {
    if (!/\.(list|sources)$/.test(f) || !existsSync(f)) continue;
    const text = readFileSync(f, 'utf8');
    const uri = /^URIs:\s*(\S+\/debian)\s*$/m.exec(text)?.[1] ?? /^deb\s+(?:\[[^\]]*\]\s+)?(\S+\/debian)\s+\S+/m.exec(text)?.[1];
    if (uri) return uri;
  }
  return 'http://deb.debian.org/debian';
}

/**
 * Fetches trixie's nats-server package through apt and unpacks its binary into
 * ferryHome()/nats-server/<version>/. One process at a time (a lock directory; the others wait
 * for it). Returns the binary, or why not (no apt, no network to the mirror, no package).
 */
export function fetchTrixieServer(log: (line: string) => void = () => {}): { bin: string } | { why: string } {
  if (!existsSync('/usr/bin/apt-get') || !existsSync('/usr/bin/dpkg-deb')) return { why: 'this machine has no apt-get and dpkg-deb (not Debian-like)' };
  if (process.env.FERRY_NO_INSTALL !== undefined) return { why: 'FERRY_NO_INSTALL is set' };
  const root = join(ferryHome(), 'nats-server');
  mkdirSync(root, { recursive: true });
  // A failure is kept for an hour, so that every server a test suite starts does not try again.
  const failed = join(root, '.failed');
  const last = statSync(failed, { throwIfNoEntry: false });
  if (last && Date.now() - last.mtimeMs < 3_600_000) return { why: `${readFileSync(failed, 'utf8').trim()} (at ${last.mtime.toISOString()}; delete ${failed} to try again now)` };
  const result = fetchLocked(root, log);
  if ('why' in result) writeFileSync(failed, `${result.why}\n`);
  else rmSync(failed, { force: true });
  return result;
}

function fetchLocked(root: string, log: (line: string) => void): { bin: string } | { why: string } {
  const lock = join(root, '.lock');
  const deadline = Date.now() + 180_000;
  for (;;) {
    try {
      mkdirSync(lock);
      break;
    } catch {
      // Another process is fetching it; a lock older than the deadline is a dead one's.
      if (Date.now() - statSync(lock, { throwIfNoEntry: false })!.mtimeMs > 180_000) rmSync(lock, { recursive: true, force: true });
      else if (Date.now() > deadline) return { why: `another process has held ${lock} for three minutes` };
      const done = ownServer();
      if (done) return { bin: done };
      spawnSync('sleep', ['0.5']);
    }
  }
  const work = mkdtempSync(join(root, 'fetch-'));
  try {
    const done = ownServer();
    if (done) return { bin: done };
    log(`the installed nats-server cannot sync every write (it is older than 2.10): fetching Debian trixie's nats-server package through apt, into ${root}`);
    for (const d of ['parts', 'lists/partial', 'cache/archives/partial', 'out']) mkdirSync(join(work, d), { recursive: true });
    writeFileSync(join(work, 'parts', 'trixie.sources'), `Types: deb\nURIs: ${debianMirror()}\nSuites: trixie\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n`);
    // apt's own state stays untouched: a source list, package lists and a cache of ferry's own.
    const options = [
      '-o',
      'Dir::Etc::SourceList=/dev/null',
      '-o',
      `Dir::Etc::SourceParts=${join(work, 'parts')}`,
      '-o',
      `Dir::State::Lists=${join(work, 'lists')}`,
      '-o',
      `Dir::Cache=${join(work, 'cache')}`,
      '-o',
      'APT::Sandbox::User=root',
      '-o',
      'Debug::NoLocking=1',
    ];
    const run = (args: string[], cwd = work) => spawnSync('apt-get', [...args, ...options], { cwd, encoding: 'utf8', timeout: 120_000, env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' } });
    const update = run(['update', '-qq']);
    if (update.status !== 0) return { why: `apt-get update for trixie failed: ${(update.stderr ?? '').trim().split('\n').slice(-2).join(' ')}` };
    const download = run(['download', '-qq', 'nats-server'], join(work, 'out'));
    const deb = readdirSync(join(work, 'out')).find((f) => f.endsWith('.deb'));
    if (download.status !== 0 || !deb) return { why: `apt-get download nats-server (trixie) failed: ${(download.stderr ?? '').trim().split('\n').slice(-2).join(' ')}` };
    const x = spawnSync('dpkg-deb', ['-x', join(work, 'out', deb), join(work, 'x')], { encoding: 'utf8' });
    const bin = join(work, 'x', 'usr', 'sbin', 'nats-server');
    if (x.status !== 0 || !existsSync(bin)) return { why: `${deb} has no usr/sbin/nats-server (${(x.stderr ?? '').trim()})` };
    const version = serverVersion(bin);
    if (!atLeast(version, SYNC_VERSION)) return { why: `trixie's package is nats-server ${version ?? '(no version)'}, older than 2.10` };
    mkdirSync(join(root, version!), { recursive: true });
    renameSync(bin, join(root, version!, 'nats-server'));
    log(`nats-server ${version} unpacked into ${join(root, version!)}`);
    return { bin: join(root, version!, 'nats-server') };
  } finally {
    rmSync(work, { recursive: true, force: true });
    rmSync(lock, { recursive: true, force: true });
  }
}
