// The same supervisor machine and the same devices in one process, with no bus: the baseline
// that benchmarks compare the distributed run against, and a quick way to test the arithmetic.
import { createActor, fromCallback, toPromise } from 'xstate';
import { LocalDispatcher } from '../dispatch/local-dispatch.ts';
import { planDevices, type RunSpec } from './run.ts';
import type { Recorder } from '../record/record.ts';
import { MemoryStore } from '../store/store.ts';
import { supervisorMachine, type MembershipCommand } from '../supervisor/supervisor.machine.ts';

export async function runInProcess(spec: RunSpec, recorder: Recorder, backend: string, run = 'local') {
  const devices = planDevices(spec);
  const dispatcher = new LocalDispatcher(Math.max(...devices) + 1);
  const machine = supervisorMachine.provide({
    actors: {
      membership: fromCallback<MembershipCommand, { need: number[] }>(({ sendBack, input }) => {
        for (const device of input.need) sendBack({ type: 'worker.joined', device, worker: `local-${device}`, backend });
        return () => {};
      }),
    },
  });
  const actor = createActor(machine, { input: { spec, run, dispatcher, recorder, store: new MemoryStore(dispatcher.shelf) } });
  actor.start();
  const output = await toPromise(actor);
  await dispatcher.close();
  return output;
}
