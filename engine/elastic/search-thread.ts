// The re-plan's search off the supervisor's event loop: in a worker thread, so that a budget of
// seconds never silences the supervisor's heartbeat (the launcher kills a supervisor that stops
// beating for timeouts.heartbeat_seconds) nor its answers on the bus. The thread gets the
// scenario as data, builds the run's spec again (importing a user's algorithm file where the
// scenario names one), decides, and sends back the decision; the supervisor builds the new spec.
import { Worker, isMainThread, parentPort, workerData } from 'node:worker_threads';
import type { ReplanRecord } from '../../mesh/wire/index.ts';
import { isPath, loadAlgorithmFile } from '../algorithms/index.ts';
import { runSpec, type RunSpec } from '../runtime/run/run.ts';
import type { Scenario } from '../runtime/scenario/scenario.ts';
import { decideReplan, specOnPlan, type Loss } from './decide.ts';

interface Ask {
  scenario: Scenario;
  spares: number[];
  loss: Loss;
  iteration: number;
}

type Answer = { ok: true; record: ReplanRecord; changed: boolean } | { ok: false; name: string; message: string };

/** decideReplan, in a worker thread; its errors come back with their names (a ReplanError stays one by name). */
export async function decideOffThread(r: RunSpec, spares: readonly number[], loss: Loss, iteration: number): Promise<{ spec: RunSpec; record: ReplanRecord; changed: boolean }> {
  const ask: Ask = { scenario: r.scenario, spares: [...spares], loss, iteration };
  // The thread runs this file through tsx, as the process does.
  const boot = `import('tsx/esm/api').then(({ register }) => { register(); return import(${JSON.stringify(import.meta.url)}); })`;
  const answer = await new Promise<Answer>((resolve, reject) => {
    const w = new Worker(boot, { eval: true, workerData: ask });
    w.once('message', (m: Answer) => {
      resolve(m);
      void w.terminate();
    });
    w.once('error', reject);
    w.once('exit', (code) => reject(new Error(`the re-plan's search thread exited with code ${code} before it answered`)));
  });
  if (!answer.ok) {
    const e = new Error(answer.message);
    e.name = answer.name;
    throw e;
  }
  return { spec: answer.changed ? specOnPlan(r, answer.record.plan_after) : r, record: answer.record, changed: answer.changed };
}

async function serve(ask: Ask): Promise<Answer> {
  try {
    const a = ask.scenario.algorithm;
    const name = typeof a === 'string' ? a : a.name;
    if (isPath(name)) await loadAlgorithmFile(name);
    const { record, changed } = decideReplan(runSpec(ask.scenario), ask.spares, ask.loss, ask.iteration);
    return { ok: true, record, changed };
  } catch (e) {
    return { ok: false, name: (e as Error).name ?? 'Error', message: (e as Error).message ?? String(e) };
  }
}

if (!isMainThread && parentPort && (workerData as Partial<Ask> | undefined)?.loss) {
  void serve(workerData as Ask).then((answer) => parentPort!.postMessage(answer));
}
