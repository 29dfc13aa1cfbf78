// The re-plan's search off the supervisor's event loop: in a worker thread (started once and kept;
// an elastic run's supervisor starts it at once, and it readies the run's planning problem then),
// so that a budget of seconds never silences the
// supervisor's heartbeat (the launcher kills a supervisor that stops beating for
// timeouts.heartbeat_seconds) nor its answers on the bus. The thread gets the scenario as data,
// builds the run's spec again (importing a user's algorithm file where the scenario names one),
// decides, and sends back the decision; the supervisor builds the new spec.
import { Worker, isMainThread, parentPort, workerData } from 'node:worker_threads';
import type { ReplanRecord } from '../../mesh/wire/index.ts';
import { isPath, loadAlgorithmFile } from '../algorithms/index.ts';
import { BUNDLE_ENV } from '../model/index.ts';
import { runSpec, type RunSpec } from '../runtime/index.ts';
import type { Scenario } from '../runtime/index.ts';
import { decideReplan, problemFor, specOnPlan, type Loss } from './decide.ts';
import { Evaluator, type Problem } from '../runtime/index.ts';
import { candidateOf } from '../runtime/index.ts';

interface Ask {
  scenario: Scenario;
  spares: number[];
  loss: Loss;
  iteration: number;
  measuredPeriod?: number;
}

type Answer = { ok: true; record: ReplanRecord; changed: boolean } | { ok: false; name: string; message: string };

/** The search thread: started once (warmWorker, or the first decision), kept for the process's life, never keeping it alive. */
let shared: { worker: Worker; pending: Map<number, { resolve: (a: Answer) => void; reject: (e: Error) => void }>; next: number } | undefined;

function searchThread(): NonNullable<typeof shared> {
  if (shared) return shared;
  // The thread runs this module as the process does: in a process started from the bundle, its
  // chunk as it is (engine/cli/process-bundle.ts); through tsx, with tsx registered first.
  const self = JSON.stringify(import.meta.url);
  const boot = process.env[BUNDLE_ENV] ? `import(${self})` : `import('tsx/esm/api').then(({ register }) => { register(); return import(${self}); })`;
  const worker = new Worker(boot, { eval: true, workerData: { serve: true } });
  worker.unref();
  const thread = { worker, pending: new Map<number, { resolve: (a: Answer) => void; reject: (e: Error) => void }>(), next: 0 };
  const fail = (e: Error) => {
    for (const p of thread.pending.values()) p.reject(e);
    thread.pending.clear();
    if (shared === thread) shared = undefined;
  };
  worker.on('message', (m: { id: number; answer: Answer }) => {
    thread.pending.get(m.id)?.resolve(m.answer);
    thread.pending.delete(m.id);
  });
  worker.on('error', fail);
  worker.on('exit', (code) => fail(new Error(`the re-plan's search thread exited with code ${code}`)));
  shared = thread;
  return thread;
}

/**
 * Starts the search thread ahead of need (an elastic run's supervisor does, so that a re-plan does
 * not wait for it to load); with the run's scenario, the thread readies its planning problem too.
 */
export function warmSearchThread(scenario?: Scenario): void {
  const thread = searchThread();
  if (scenario) thread.worker.postMessage({ prepare: scenario });
}

/** decideReplan, in the search thread; its errors come back with their names (a ReplanError stays one by name). */
export async function decideOffThread(
  r: RunSpec,
  spares: readonly number[],
  loss: Loss,
  iteration: number,
  measuredPeriod?: number,
): Promise<{ spec: RunSpec; record: ReplanRecord; changed: boolean }> {
  const ask: Ask = { scenario: r.scenario, spares: [...spares], loss, iteration, ...(measuredPeriod === undefined ? {} : { measuredPeriod }) };
  const thread = searchThread();
  const id = thread.next++;
  const answer = await new Promise<Answer>((resolve, reject) => {
    thread.pending.set(id, { resolve, reject });
    thread.worker.postMessage({ id, ask });
  });
  if (!answer.ok) {
    const e = new Error(answer.message);
    e.name = answer.name;
    throw e;
  }
  return { spec: answer.changed ? specOnPlan(r, answer.record.plan_after) : r, record: answer.record, changed: answer.changed };
}

/** The run's spec and planning problem, readied before a decision needs them (by the scenario they are of). */
let ready: { key: string; spec: RunSpec; problem: Problem } | undefined;

/** Readies `scenario`'s spec and problem, and prices its own plan once (the decision's "before"; it warms the evaluator too). */
async function prepare(scenario: Scenario): Promise<{ spec: RunSpec; problem: Problem }> {
  const key = JSON.stringify(scenario);
  if (ready?.key === key) return ready;
  const a = scenario.algorithm;
  const name = typeof a === 'string' ? a : a.name;
  if (isPath(name)) await loadAlgorithmFile(name);
  const spec = runSpec(scenario);
  const problem = problemFor(spec);
  try {
    new Evaluator(problem).evaluate(candidateOf(scenario));
  } catch {
    // Only a warm-up: the decision prices the plan again, and says what fails there.
  }
  ready = { key, spec, problem };
  return ready;
}

async function serve(ask: Ask): Promise<Answer> {
  try {
    const { spec, problem } = await prepare(ask.scenario);
    const { record, changed } = decideReplan(spec, ask.spares, ask.loss, ask.iteration, problem, ask.measuredPeriod);
    return { ok: true, record, changed };
  } catch (e) {
    return { ok: false, name: (e as Error).name ?? 'Error', message: (e as Error).message ?? String(e) };
  }
}

if (!isMainThread && parentPort && (workerData as { serve?: boolean } | undefined)?.serve) {
  const port = parentPort;
  port.on('message', (m: { id: number; ask: Ask } | { prepare: Scenario }) => {
    // Readying is only ahead of need: a failure there is met again, and answered, by the decision.
    if ('prepare' in m) return void prepare(m.prepare).catch(() => {});
    void serve(m.ask).then((answer) => port.postMessage({ id: m.id, answer }));
  });
}
