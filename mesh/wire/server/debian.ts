// What ferry may install on a fresh machine, and only from the system's own package sources:
// Debian's nats-server (for runs) and chromium (for the browser test).
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { delimiter, join } from 'node:path';

/** The first of `names` found on PATH or in `extraDirs`, or undefined. */
export function findOnPath(names: readonly string[], extraDirs: readonly string[] = ['/usr/sbin', '/usr/bin', '/usr/local/bin']): string | undefined {
  for (const dir of [...(process.env.PATH ?? '').split(delimiter), ...extraDirs]) {
    if (!dir) continue;
    for (const name of names) if (existsSync(join(dir, name))) return join(dir, name);
  }
  return undefined;
}

/**
 * Installs Debian's package `name` when this is a Debian-like machine and we may (root, or
 * password-less sudo; not when FERRY_NO_INSTALL is set): apt-get install, and if that fails, an
 * apt-get update first. Returns whether it tried.
 */
export function installDebianPackage(name: string, log: (line: string) => void = () => {}): boolean {
  const canApt = existsSync('/usr/bin/apt-get') && process.env.FERRY_NO_INSTALL === undefined;
  const asRoot = process.getuid?.() === 0;
  const sudo = !asRoot && spawnSync('sudo', ['-n', 'true']).status === 0;
  if (!canApt || !(asRoot || sudo)) return false;
  const prefix = asRoot ? [] : ['sudo', '-n'];
  const run = (args: string[]) => {
    const [cmd, ...rest] = [...prefix, ...args];
    return spawnSync(cmd!, rest, { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' } });
  };
  log(`${name} not found: installing Debian's ${name} package`);
  if (run(['apt-get', 'install', '-y', '-qq', name]).status !== 0) {
    run(['apt-get', 'update', '-qq']);
    run(['apt-get', 'install', '-y', '-qq', name]);
  }
  return true;
}
