// Shared pieces of the integration tests: real nats-servers, real processes, small scenarios.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { connect as netConnect } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { findOnPath, installDebianPackage } from '../mesh/wire/server/debian.ts';
import { runSpec } from '../engine/runtime/run/run.ts';
import { loadScenario, ScenarioError } from '../engine/runtime/scenario/scenario.ts';

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');

export function tempDir(prefix = 'ferry-test-'): string {
  return mkdtempSync(join(tmpdir(), prefix));
}

/** A small scenario that runs in seconds: few iterations, a short warm-up. */
export function smallScenario(dir: string, extra = '', name = 'small'): string {
  const file = join(dir, `${name}.yaml`);
  writeFileSync(
    file,
    `name: ${name}
seed: 3
backend: wasm
warmup: { steps: 3, demos: 64, batch: 16 }
rl: { iterations: 3, batch: 16 }
${extra}
`,
  );
  return file;
}

/**
 * The message a small scenario (smallScenario's, with `extra`, its rl line replaced by `rl`) is
 * refused with before any work starts; throws where it is not refused, or not as a scenario error.
 */
export function scenarioRefusal(dir: string, extra: string, rl: string, name: string): string {
  const file = smallScenario(dir, extra, name);
  writeFileSync(file, readFileSync(file, 'utf8').replace('rl: { iterations: 3, batch: 16 }', rl));
  try {
    runSpec(loadScenario(file));
  } catch (e) {
    if (!(e instanceof ScenarioError)) throw e;
    return e.message;
  }
  throw new Error(`${name} was not refused`);
}

export interface Spawned {
  child: ChildProcess;
  output: () => string;
  exited: Promise<number | null>;
  waitFor: (pattern: RegExp, timeoutMs?: number) => Promise<RegExpMatchArray>;
}

/** Runs a TypeScript entry point of ferry as a real process (node --import tsx). */
export function spawnTs(script: string, args: string[], env: NodeJS.ProcessEnv = {}, options: { group?: boolean; cwd?: string } = {}): Spawned {
  // `group`: its own process group, as a command typed at a terminal has (Ctrl-C signals the group).
  // `cwd`: where it runs (a worker resolves a run's relative file paths there, as in its own checkout).
  // tsx by its resolved URL: a process started elsewhere would not find ferry's node_modules.
  const child = spawn(process.execPath, ['--import', import.meta.resolve('tsx'), join(ROOT, script), ...args], {
    cwd: options.cwd ?? ROOT,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: options.group ?? false,
  });
  let out = '';
  const listeners = new Set<() => void>();
  const onData = (b: Buffer) => {
    out += b.toString();
    listeners.forEach((l) => l());
  };
  child.stdout!.on('data', onData);
  child.stderr!.on('data', onData);
  const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
  return {
    child,
    output: () => out,
    exited,
    waitFor: (pattern, timeoutMs = 60_000) =>
      new Promise((resolveMatch, reject) => {
        const check = () => {
          const m = out.match(pattern);
          if (m) {
            listeners.delete(check);
            clearTimeout(timer);
            resolveMatch(m);
          }
        };
        const timer = setTimeout(() => {
          listeners.delete(check);
          reject(new Error(`timed out waiting for ${pattern}; output so far:\n${out}`));
        }, timeoutMs);
        listeners.add(check);
        check();
      }),
  };
}

/** Whether something accepts TCP connections on a loopback port. */
export function portOpen(port: number): Promise<boolean> {
  return new Promise((r) => {
    const s = netConnect({ host: '127.0.0.1', port }, () => {
      s.destroy();
      r(true);
    });
    s.on('error', () => r(false));
  });
}

/**
 * Debian's chromium, for the browser tests (playwright-core drives it; nothing is downloaded from
 * elsewhere): $FERRY_CHROMIUM, else PATH, else installed from the system's packages when ferry may.
 */
export function ensureChromium(): string {
  const find = () => (process.env.FERRY_CHROMIUM ? (existsSync(process.env.FERRY_CHROMIUM) ? process.env.FERRY_CHROMIUM : undefined) : findOnPath(['chromium', 'chromium-browser']));
  const found = find() ?? (installDebianPackage('chromium') ? find() : undefined);
  if (!found) throw new Error("no chromium found: install Debian's chromium package (apt-get install chromium) or set FERRY_CHROMIUM");
  return found;
}

/**
 * A python3 that has nats-py and msgpack (examples/env/guess.py needs them and nothing else):
 * Debian's, with its python3-msgpack and python3-pip installed when missing, and nats-py from PyPI
 * into the user's site (pip --user) when it cannot import it; a pyenv shim first on PATH may lack them.
 */
export function ensurePython(): string {
  const python = existsSync('/usr/bin/python3') ? '/usr/bin/python3' : (findOnPath(['python3']) ?? 'python3');
  const can = (module: string) => spawnSync(python, ['-c', `import ${module}`], { stdio: 'ignore' }).status === 0;
  if (!can('msgpack')) installDebianPackage('python3-msgpack');
  if (!can('nats')) {
    if (!can('pip')) installDebianPackage('python3-pip');
    spawnSync(python, ['-m', 'pip', 'install', '--quiet', '--user', '--break-system-packages', '--root-user-action=ignore', NATS_PY], { stdio: 'inherit' });
  }
  for (const [module, how] of [
    ['msgpack', "Debian's python3-msgpack (apt-get install python3-msgpack)"],
    ['nats', `nats-py (${python} -m pip install --user ${NATS_PY})`],
  ] as const) {
    if (!can(module)) throw new Error(`${python} cannot import ${module}: install ${how}`);
  }
  return python;
}

/** The nats-py that .ci/run and ensurePython install (the example environment's NATS client). */
export const NATS_PY = 'nats-py>=2.6,<3';

/**
 * `npm run chaos -- ARGS --json` as a process: its exit code, its output, and the JSON report it
 * printed last (the test fails, showing the output, when there is none).
 */
export async function chaosCli(args: string[]): Promise<{ code: number | null; output: string; report: ChaosJson }> {
  const p = spawnTs('engine/cli/chaos.ts', [...args, '--json']);
  const code = await p.exited;
  const output = p.output();
  const line = output
    .trim()
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .pop();
  if (line === undefined) throw new Error(`npm run chaos printed no JSON report:\n${output}`);
  return { code, output, report: JSON.parse(line) as ChaosJson };
}

// biome-ignore lint/suspicious/noExplicitAny: the report's fields are read by each test as it needs
type ChaosJson = Record<string, any>;
