// Starts what a run needs on this machine: a NATS server unless one is given, the supervisor
// process, and worker processes; everything it starts, it stops, on success, failure and Ctrl-C.
import { spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { connectBus, subscribe } from '../../mesh/bus.ts';
import { startNatsServer, type PrivateNatsServer } from '../../mesh/nats-server.ts';
import { RunEvent } from '../../mesh/protocol.ts';
import { subjects } from '../../mesh/subjects.ts';
import type { Summary } from '../record.ts';
import { planDevices, runSpec } from '../rlhf.ts';
import type { Scenario } from '../scenario.ts';
import { progress as makeProgress, type Progress } from './progress.ts';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');

export interface LaunchOptions {
  scenario: Scenario;
  run: string;
  out: string;
  /** An existing server; when absent a private one is started. */
  natsUrl?: string;
  /** Worker processes to start; the rest are expected to join by hand. Default: one per device. */
  workers?: number;
  backend?: string;
  progress?: Progress;
  /** Extra environment for the child processes. */
  env?: NodeJS.ProcessEnv;
  /** Go on from the last checkpoint in `out`. */
  resume?: boolean;
  say?: (line: string) => void;
}

export interface LaunchResult {
  code: number;
  summary?: Summary;
  natsUrl: string;
}

export function startProcess(script: string, argv: string[], logFile: string, env: NodeJS.ProcessEnv): ChildProcess {
  const log = createWriteStream(logFile);
  // Its own process group: a terminal's Ctrl-C reaches the launcher alone, which then stops the
  // children in order (the supervisor first writes its summary).
  // FERRY_NODE_ARGS: extra Node.js flags for every process started here (e.g. --cpu-prof).
  const nodeArgs = (process.env.FERRY_NODE_ARGS ?? '').split(' ').filter(Boolean);
  const child = spawn(process.execPath, [...nodeArgs, '--import', 'tsx', join(ROOT, script), ...argv], {
    cwd: ROOT,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
  });
  child.stdout!.pipe(log);
  child.stderr!.pipe(log);
  return child;
}

export const exited = (c: ChildProcess) =>
  c.exitCode !== null || c.signalCode !== null
    ? Promise.resolve()
    : new Promise<void>((r) => c.once('exit', () => r()));

function tail(file: string, lines = 15): string {
  try {
    return readFileSync(file, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
  } catch {
    return '';
  }
}

export async function launch(o: LaunchOptions): Promise<LaunchResult> {
  const say = o.say ?? ((line: string) => process.stdout.write(`${line}\n`));
  const spec = runSpec(o.scenario);
  const devices = planDevices(spec);
  const logs = join(o.out, 'logs');
  mkdirSync(logs, { recursive: true });
  let server: PrivateNatsServer | undefined;
  const children: ChildProcess[] = [];
  let interrupted = false;

  const cleanup = async () => {
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGTERM');
    const timer = setTimeout(() => children.forEach((c) => c.exitCode === null && c.kill('SIGKILL')), 5000);
    await Promise.all(children.map(exited));
    clearTimeout(timer);
    await server?.stop();
  };
  // Ctrl-C stops the children; the run's own flow then sees the supervisor exit, stops the
  // server in `finally`, and reports 130. A second Ctrl-C kills the launcher outright.
  const onSignal = () => {
    interrupted = true;
    say('interrupted: stopping the run');
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGTERM');
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);

  try {
    let url = o.natsUrl;
    if (!url) {
      server = await startNatsServer({ log: say });
      url = server.url;
      say(`nats-server on ${url} (private to this run, store in ${server.storeDir})`);
      if (interrupted) return { code: 130, natsUrl: url };
    } else {
      say(`using NATS at ${url}`);
    }
    const nc = await connectBus(url, `ferry-launcher-${o.run}`);
    const subj = subjects(o.run);
    const bar = o.progress ?? makeProgress();
    const stopEvents = subscribe(
      nc,
      subj.events,
      RunEvent,
      (e) => {
        if (e.type === 'phase') bar.phase(e.phase, e.detail);
        else if (e.type === 'progress') bar.iteration(e.metrics, e.iterations);
        else if (e.type === 'log') say(`${e.source}: ${e.message}`);
      },
      (err) => say(`ignored event: ${err.message}`),
    );
    await nc.flush();

    const env = { ...o.env, NATS_URL: url };
    // The supervisor reads the scenario as resolved here (defaults filled in, overrides applied),
    // and the run directory keeps it: the exact input of this run.
    const resolved = join(o.out, 'scenario.json');
    writeFileSync(resolved, `${JSON.stringify(o.scenario, null, 2)}\n`);
    const supervisor = startProcess(
      'actors/supervisor.ts',
      ['--scenario', resolved, '--run', o.run, '--out', o.out, '--nats', url, ...(o.resume ? ['--resume'] : [])],
      join(logs, 'supervisor.log'),
      env,
    );
    children.push(supervisor);
    // Workers take whichever device is free when they join, so that workers started here and
    // by hand never compete for the same slot; each log says which device its worker became.
    const count = Math.min(o.workers ?? devices.length, devices.length);
    for (let i = 0; i < count; i++) {
      children.push(
        startProcess('actors/worker.ts', ['--run', o.run, '--nats', url, '--backend', o.backend ?? o.scenario.backend], join(logs, `worker-${i}.log`), env),
      );
    }
    if (count < devices.length) {
      say(`waiting for ${devices.length - count} worker(s) to join by hand: npm run worker -- --nats ${url} --run ${o.run}`);
    }
    await exited(supervisor);
    bar.stop();
    stopEvents();
    await nc.drain().catch(() => {});
    const code = interrupted ? 130 : (supervisor.exitCode ?? 1);
    let summary: Summary | undefined;
    try {
      summary = JSON.parse(readFileSync(join(o.out, 'summary.json'), 'utf8')) as Summary;
    } catch {
      summary = undefined;
    }
    if (code !== 0 && !interrupted) {
      say(`the supervisor exited with code ${code}; its log (${join(logs, 'supervisor.log')}) ends:\n${tail(join(logs, 'supervisor.log'))}`);
    }
    // Workers stop on the supervisor's shutdown call; give them a moment, then stop the rest.
    const workers = children.slice(1);
    await Promise.race([Promise.all(workers.map(exited)), new Promise((r) => setTimeout(r, 3000))]);
    return { code, summary, natsUrl: url };
  } finally {
    await cleanup();
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
}
