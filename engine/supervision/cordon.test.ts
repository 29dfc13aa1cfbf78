// An operator's cordon, in this process: the supervisor machine with its real stages over four
// in-process devices (the elastic scenario's plan), device 2 cordoned as soon as the actor's
// training step ends. The devices left have trained past the last snapshot then; drained — the
// iteration finished and snapshotted before the re-plan — they hold the snapshot's state, and the
// migration sends the least any could: what each new rank lacks.
import { describe, expect, it } from 'vitest';
import { createActor, fromCallback, toPromise, type AnyActorRef } from 'xstate';
import { MemoryShelf } from '../../mesh/wire/index.ts';
import { initBackend } from '../model/backend/backend.ts';
import type { Dispatcher } from '../runtime/dispatch/dispatch.ts';
import { LocalDispatcher } from '../runtime/dispatch/local-dispatch.ts';
import type { Summary } from '../runtime/record/record.ts';
import { FOUR_DEVICES } from '../runtime/run/four-devices.fixture.ts';
import { runSpec } from '../runtime/run/run.ts';
import { parseScenario } from '../runtime/scenario/scenario.ts';
import { MemoryStore } from '../runtime/store/store.ts';
import { supervisorMachine, type MembershipCommand } from './supervisor.machine.ts';

describe('a cordon, in process', () => {
  it("drains the device before the re-plan: the migration sends the minimum, and the cordon's iteration is not run again", async () => {
    await initBackend('wasm');
    const spec = runSpec(parseScenario(`${FOUR_DEVICES}warmup: { steps: 0 }\nrl: { iterations: 2, batch: 8 }\nelastic: { search_seconds: 0.2 }\n`, 'unit.yaml'));
    const shelf = new MemoryShelf();
    const local = new LocalDispatcher(4, undefined, shelf);
    let actor: AnyActorRef | undefined;
    const trained: number[] = [];
    // The local dispatcher, but the cordon is asked as the actor's first training step ends.
    const d: Dispatcher = Object.create(local);
    d.call = (async (device, model, iteration, body, ...rest) => {
      const out = await local.call(device, model, iteration, body, ...rest);
      if (model === 'actor' && body.fn === 'train') {
        trained.push(iteration);
        if (trained.length === 1) actor!.send({ type: 'device.lost', device: 2, trigger: 'cordon', reason: 'maintenance' });
      }
      return out;
    }) as Dispatcher['call'];
    const machine = supervisorMachine.provide({
      actors: {
        // Every device has a worker; one lost for good loses it.
        membership: fromCallback<MembershipCommand, { need: number[] }>(({ sendBack, input, receive }) => {
          for (const device of input.need) sendBack({ type: 'worker.joined', device, worker: `w-${device}`, backend: 'wasm' });
          receive((c) => {
            for (const device of c.lost) sendBack({ type: 'worker.lost', device, worker: `w-${device}`, reason: 'its device is lost for good' });
          });
          return () => {};
        }),
      },
    });
    let summary: Summary | undefined;
    const recorder = { phase() {}, iteration() {}, finished: (s: Summary) => void (summary = s) };
    actor = createActor(machine, { input: { spec, run: 'unit', dispatcher: d, recorder, store: new MemoryStore(shelf) } });
    actor.start();
    expect(await toPromise(actor)).toEqual({ status: 'succeeded', error: undefined });
    const [r] = summary!.replans!;
    expect(summary!.replans).toHaveLength(1);
    expect(r).toMatchObject({ trigger: 'cordon', lost: [2], changed: true, parameters_equal_after_migration: true });
    expect(r!.migration_minimum_bytes).toBeGreaterThan(0);
    expect(r!.migration_bytes).toBe(r!.migration_minimum_bytes);
    // After the iteration the cordon came in, from its snapshot.
    expect(r!.iteration).toBe(1);
    expect(summary!.recoveries).toMatchObject([{ snapshot: 0, iteration: 1 }]);
    // Each of the actor's two replicas trained in iteration 0, once; then iteration 1 on the new plan's one.
    expect(trained).toEqual([0, 0, 1]);
    expect(summary!.rollouts).toMatchObject({ lost: 0, duplicated: 0 });
  }, 120_000);
});
