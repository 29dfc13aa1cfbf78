// The same supervisor machine and the same devices in one process, with no bus: the baseline
// that benchmarks compare the distributed run against, and a quick way to test the arithmetic.
import { createActor, fromCallback, toPromise } from 'xstate';
import { LocalDispatcher } from '../runtime/index.ts';
import { planDevices, type RunSpec } from '../runtime/index.ts';
import type { Recorder } from '../runtime/index.ts';
import { MemoryStore } from '../runtime/index.ts';
import { supervisorMachine, type MembershipCommand, type SupervisorEvent, type SupervisorInput } from './supervisor.machine.ts';

/**
 * `dispatcher`: the devices to run on (default: as many as the plan uses, here). `o.input`: a
 * resumed run's checkpoint, where its last snapshot goes; `o.started`: told how to send the
 * machine events once it runs (a device lost for good, as chaos would).
 */
export async function runInProcess(
  spec: RunSpec,
  recorder: Recorder,
  backend: string,
  run = 'local',
  dispatcher = new LocalDispatcher(Math.max(...planDevices(spec)) + 1),
  o: { input?: Pick<SupervisorInput, 'resume' | 'saveCheckpoint' | 'rewards'>; started?: (send: (event: SupervisorEvent) => void) => void } = {},
) {
  const machine = supervisorMachine.provide({
    actors: {
      membership: fromCallback<MembershipCommand, { need: number[] }>(({ sendBack, input }) => {
        for (const device of input.need) sendBack({ type: 'worker.joined', device, worker: `local-${device}`, backend });
        return () => {};
      }),
    },
  });
  const actor = createActor(machine, { input: { spec, run, dispatcher, recorder, store: new MemoryStore(dispatcher.shelf), ...o.input } });
  actor.start();
  o.started?.((event) => actor.send(event));
  const output = await toPromise(actor);
  await dispatcher.close();
  return output;
}
