// The environment processes a scenario starts (`environment.command`, `instances` of them): each
// on the run's bus with the environment role's credentials only, told its service name and
// instance id by environment variables, restarted when it dies while the run goes on, and
// stopped (its whole process group) when the run ends, also on Ctrl-C and on failure.
import { spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream } from 'node:fs';
import { join } from 'node:path';
import type { Credential } from '../../mesh/wire/index.ts';
import type { EnvironmentKey } from './key.ts';

export interface EnvironmentProcesses {
  /** The processes now running (one per instance). */
  readonly pids: number[];
  /** Restarts so far. */
  readonly restarts: number;
  /** Kills instance `k` outright (chaos); it is started again. Returns its pid, if it ran. */
  kill(k: number): number | undefined;
  stop(): Promise<void>;
}

/** Environment variables an environment process reads (docs/environment-protocol.md). */
export function environmentEnv(key: EnvironmentKey, url: string, instance: string, credential?: Credential): NodeJS.ProcessEnv {
  return {
    FERRY_NATS_URL: url,
    FERRY_ENV_NAME: key.name,
    FERRY_ENV_INSTANCE: instance,
    ...(credential ? { FERRY_NATS_USER: credential.user, FERRY_NATS_PASS: credential.pass } : {}),
  };
}

export function startEnvironments(key: EnvironmentKey, o: { url: string; credential?: Credential; logs: string; say: (line: string) => void; maxRestarts?: number }): EnvironmentProcesses {
  const command = key.command;
  if (command === undefined) return { pids: [], restarts: 0, kill: () => undefined, stop: async () => {} };
  let stopping = false;
  let restarts = 0;
  const children = new Map<number, ChildProcess>();
  const start = (k: number) => {
    const instance = `${key.name}-${k}`;
    const log = createWriteStream(join(o.logs, `env-${instance}.log`), { flags: 'a' });
    const env = { ...process.env, ...environmentEnv(key, o.url, instance, o.credential) };
    // A process group of its own, so that stopping it stops what it started (a shell's children).
    const child =
      typeof command === 'string'
        ? spawn(command, { shell: true, env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] })
        : spawn(command[0]!, command.slice(1), { env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
    child.stdout?.pipe(log);
    child.stderr?.pipe(log);
    child.on('error', (e) => o.say(`environment '${key.name}' instance ${instance}: could not start ${JSON.stringify(command)}: ${e.message}`));
    child.on('exit', (code, signal) => {
      children.delete(k);
      if (stopping) return;
      if (restarts >= (o.maxRestarts ?? 10)) {
        o.say(`environment '${key.name}' instance ${instance} exited (${signal ?? `code ${code}`}); not restarted: ${restarts} restarts already (its log: ${join(o.logs, `env-${instance}.log`)})`);
        return;
      }
      restarts += 1;
      o.say(`environment '${key.name}' instance ${instance} exited (${signal ?? `code ${code}`}); starting it again`);
      start(k);
    });
    children.set(k, child);
  };
  for (let k = 0; k < key.instances; k++) start(k);
  o.say(`started ${key.instances} instance(s) of environment '${key.name}': ${typeof command === 'string' ? command : command.join(' ')}`);
  return {
    get pids() {
      return [...children.values()].map((c) => c.pid!).filter((p) => p !== undefined);
    },
    get restarts() {
      return restarts;
    },
    kill(k) {
      const c = children.get(k);
      if (!c?.pid) return undefined;
      try {
        process.kill(-c.pid, 'SIGKILL');
      } catch {
        return undefined;
      }
      return c.pid;
    },
    async stop() {
      stopping = true;
      const running = [...children.values()].filter((c) => c.exitCode === null && c.signalCode === null);
      const kill = (c: ChildProcess, sig: NodeJS.Signals) => {
        try {
          process.kill(-c.pid!, sig);
        } catch {
          // already gone
        }
      };
      running.forEach((c) => kill(c, 'SIGTERM'));
      const timer = setTimeout(() => running.forEach((c) => kill(c, 'SIGKILL')), 3000);
      await Promise.all(running.map((c) => new Promise<void>((r) => (c.exitCode !== null || c.signalCode !== null ? r() : c.once('exit', () => r())))));
      clearTimeout(timer);
    },
  };
}
