// Taking a device out of a running elastic run: an operator's `npm run cordon -- RUN_DIR DEVICE`,
// or the launcher (a worker past the restart intensity, a chaos `lose` event) asks the supervisor
// on the run's cordon subject; the supervisor answers whether the run goes on without the device,
// and re-plans at once. Refused, with the reason, and nothing changed: a run that is not elastic,
// a device the run does not have, the last device, and, for an operator's
// cordon of a device that still works, a loss no plan survives.
import { BusError, CordonReply, PROTOCOL_VERSION, request, type Bus, type CordonAsk, type Subjects } from '../../mesh/wire/index.ts';
import type { RunSpec } from '../runtime/index.ts';
import { decideOffThread } from './search-thread.ts';

/** Why the supervisor of `r` (on devices `need`, with workers beyond the plan on `spares`) refuses `ask`, or undefined. */
export async function cordonProblem(r: RunSpec, need: readonly number[], spares: readonly number[], ask: Pick<CordonAsk, 'device' | 'trigger'>, iteration: number): Promise<string | undefined> {
  if (!r.scenario.elastic) return 'this run is not elastic: a device lost for good ends it (elastic: in the scenario lets it re-plan onto the devices left)';
  if (!need.includes(ask.device)) return `device ${ask.device} is not one of this run's devices (${need.join(', ')})`;
  if (need.length === 1) return `device ${ask.device} is the run's last device: no plan runs on none`;
  if (ask.trigger !== 'cordon') return undefined;
  // A device that still works is taken out only where the run can go on without it.
  try {
    await decideOffThread(r, spares, { devices: [ask.device], trigger: 'cordon', reason: 'a check' }, iteration);
  } catch (e) {
    if ((e as Error).name === 'ReplanError') return `the run cannot go on without device ${ask.device}: ${(e as Error).message}`;
    throw e;
  }
  return undefined;
}

/** What the supervisor answered: the devices the run goes on with, or why it refused. */
export type CordonAnswer = { ok: true; left: number[] } | { ok: false; problem: string };

/**
 * Asks the run's supervisor to go on without a device. Unanswered (no supervisor: one taking the
 * run over, say), it asks again every second until `patienceMs` has passed, then throws.
 */
export async function askCordon(nc: Bus, subj: Subjects, ask: Omit<CordonAsk, 'type' | 'v'>, patienceMs: number): Promise<CordonAnswer> {
  const deadline = Date.now() + patienceMs;
  for (;;) {
    try {
      const reply = await request(nc, subj.cordon, { type: 'cordon', v: PROTOCOL_VERSION, ...ask }, CordonReply, 10_000);
      return reply.type === 'cordoned' ? { ok: true, left: reply.left } : { ok: false, problem: reply.message };
    } catch (e) {
      if (!(e instanceof BusError) || (e.reason !== 'unreachable' && e.reason !== 'timeout') || Date.now() > deadline) throw e;
      await new Promise((r) => setTimeout(r, 1000));
    }
  }
}
