// The supervisor: one XState machine that gathers a worker for every device, sets the models up,
// then runs each iteration of the algorithm's graph (engine/rlhf.ts's runIteration: every call as
// soon as its inputs exist), checkpoints, and finally collects digests and stops the workers. Each
// stage is an invoked promise actor (stages.ts); its input, events and context, and the rules its
// states share, are in context.ts, and the metrics and summary it reports in report.ts. The machine
// knows no algorithm.
//
// Failures are recovered in place. A device given up (its process exited, its heartbeats
// stopped) or a stage that fails sends the machine to `recovering`: every call in flight is
// abandoned, it waits until every device has a worker again (the launcher restarts them), resets
// them all, restores the last snapshot, and goes on from the iteration after it. Rollouts and
// scores already computed come back from the run store instead of being computed again; training
// runs again from the restored state, so every prompt is trained on exactly once. Past the
// supervision intensity it gives up with an error that names the failures.
//
// An elastic run (`elastic:`) goes on without a device lost for good (cordoned, past the
// intensity, not back within the grace period, a chaos event): `replanning` searches a plan on the
// devices left (engine/elastic/), writes it ahead to the store, restores the last snapshot onto it
// (checked bit for bit) and goes on; workers that join beyond the plan are offered to the planner
// at an iteration boundary. An operator's cordon of a device that still works drains it first: the
// iteration under way ends and is snapshotted, so the devices left hold the snapshot's state and
// the migration sends only what they lack.
import { assign, sendTo, setup } from 'xstate';
import type { ReplanRecord } from '../../mesh/wire/index.ts';
import { lostAfter, placementsOf, planNumber, readSnapshot, recentPeriod, unfinishedMigration } from '../elastic/index.ts';
export type { MigrationOutput } from '../elastic/index.ts';
import { fence } from '../runtime/index.ts';
import type { Summary } from '../runtime/index.ts';
import { planDevices, type HeldView, type IterationResult, type RunSpec } from '../runtime/index.ts';
import { NextViews } from '../asynchrony/index.ts';
import { Intensity } from './supervision.ts';
import { stages } from './stages.ts';
import { resetKeepingShards } from '../runtime/index.ts';
import { iterationMetrics, runSummary } from './report.ts';
import {
  DRAIN_ON_CORDON,
  RECOVER_ON_LOSS,
  errorText,
  failedNode,
  fatal,
  missingDevices,
  restoreInput,
  sparesOf,
  withDevice,
  type Context,
  type MembershipCommand,
  type SupervisorEvent,
  type SupervisorInput,
} from './context.ts';
export type { MembershipCommand, SupervisorEvent, SupervisorInput } from './context.ts';
export { sparesOf } from './context.ts';

export const supervisorMachine = setup({
  types: {
    context: {} as Context,
    events: {} as SupervisorEvent,
    input: {} as SupervisorInput,
    output: {} as { status: 'succeeded' | 'failed'; error?: string },
  },
  actors: stages,
  guards: {
    allJoined: ({ context }) => missingDevices(context).length === 0,
    /** A supervisor taking a run over recovers as soon as every device has a worker. */
    takingOver: ({ context }) => missingDevices(context).length === 0 && context.takeOver !== undefined,
    /** …or, where its predecessor died migrating onto a new plan, migrates again. */
    takingOverMigration: ({ context }) => context.takeOver !== undefined && context.from !== undefined,
    takenOver: ({ context }) => context.takeOver !== undefined,
    moreIterations: ({ context }) => context.iteration + 1 < context.spec.scenario.rl.iterations,
    elastic: ({ context }) => context.spec.scenario.elastic !== undefined && missingDevices(context).length > 0,
    /** Workers joined beyond the plan since the last offer, and iterations left to use them in. */
    offered: ({ context }) =>
      context.spec.scenario.elastic !== undefined && context.iteration + 1 < context.spec.scenario.rl.iterations && sparesOf(context).some((d) => !context.considered.includes(d)),
    nothingLeft: ({ context }) => context.iteration >= context.spec.scenario.rl.iterations,
    escalated: ({ context }) => context.error !== undefined,
    /** A loss for good was decided (an elastic run's worker past the intensity): re-plan. */
    losing: ({ context }) => context.loss !== undefined,
    /** A cordon waits for the iteration it was heard in: done, and snapshotted. */
    drainedSnapshotted: ({ context }) => context.draining !== undefined && context.snapshot === context.iteration,
    /** …not snapshotted yet (the cordon came while the checkpoint decided there was none to take): taken now. */
    drainedUnsnapshotted: ({ context }) => context.draining !== undefined && context.snapshot !== context.iteration,
  },
  delays: {
    joinTimeout: ({ context }) => context.spec.scenario.timeouts.join_seconds * 1000,
    recoverTimeout: ({ context }) => context.spec.scenario.timeouts.recover_seconds * 1000,
    grace: ({ context }) => (context.spec.scenario.elastic?.grace_seconds ?? 0) * 1000,
    /** A recovery that follows failed ones waits first: 0.25 s, 0.5 s, 1 s, … up to 5 s. */
    backoff: ({ context }) => (context.attempts <= 1 ? 0 : Math.min(5000, 250 * 2 ** (context.attempts - 2))),
  },
  actions: {
    fail: assign((_, params: { stage: string; error: unknown }) => ({
      error: `${params.stage}: ${errorText(params.error)}`,
    })),
    /** What a stage's failure becomes: a reason to recover, naming the stage (unless a loss came first). */
    stageFailed: assign(({ context }, params: { stage: string; error: unknown }) => ({
      // Setup comes before any iteration: its failures name no iteration.
      failure: context.failure ?? { reason: `${params.stage === 'setup' ? '' : `iteration ${context.iteration}, `}${params.stage}: ${errorText(params.error)}`, at: Date.now() },
    })),
    phase: ({ context }, params: { phase: string; detail: string }) => context.recorder.phase(params.phase, params.detail),
    join: assign({
      joined: ({ context, event }) => (event.type === 'worker.joined' ? { ...context.joined, [event.device]: { worker: event.worker, backend: event.backend } } : context.joined),
    }),
    unjoin: assign({
      joined: ({ context, event }) => {
        if (event.type !== 'worker.lost') return context.joined;
        const { [event.device]: _gone, ...rest } = context.joined;
        return rest;
      },
    }),
    noteLoss: assign({
      failure: ({ context, event }) => {
        if (context.failure) return context.failure;
        if (event.type === 'worker.lost') return { reason: `device ${event.device} (worker ${event.worker}): ${event.reason}`, at: Date.now(), device: event.device };
        if (event.type === 'bus.trouble') return { reason: `bus: ${event.reason}`, at: Date.now() };
        return undefined;
      },
    }),
    /**
     * Entering a recovery: abandon every call in flight, and count the failure against the
     * supervision intensity; one too many ends the run.
     */
    beginRecovery: assign(({ context }) => {
      const failure = context.failure ?? { reason: 'unknown failure', at: Date.now() };
      context.dispatcher.interrupt(failure.reason);
      const escalation = context.intensity.record({ at: Date.now(), actor: failure.reason.split(':')[0]!, reason: failure.reason.slice(failure.reason.indexOf(':') + 1).trim() });
      // An elastic run gives up the device whose worker keeps failing, not the run; the count starts over.
      if (escalation && context.spec.scenario.elastic && failure.device !== undefined && context.need.length > 1) {
        const s = context.spec.scenario.supervision;
        const reason = `its worker failed past supervision.intensity (${s.intensity} in ${s.period_seconds} s), the last time: ${failure.reason}`;
        const loss = withDevice(context.draining, failure.device, 'intensity', reason);
        return { attempts: context.attempts + 1, intensity: new Intensity(s.intensity, s.period_seconds), loss, draining: undefined };
      }
      // A device was being drained: the run does not go back onto a plan that still has it, it re-plans without it now.
      if (context.draining && !escalation) return { attempts: context.attempts + 1, loss: { ...context.draining, at: Date.now() }, draining: undefined };
      context.recorder.phase('recovering', `${failure.reason} (recovery ${context.dispatcher.epoch})`);
      return { attempts: context.attempts + 1, ...(escalation ? { error: `supervision: ${escalation}` } : {}) };
    }),
    /** A device lost for good: the re-plan that follows leaves it out (and whoever restarts workers hears so). */
    noteLostForGood: assign(({ context, event }) => {
      if (event.type !== 'device.lost') return {};
      // A device being drained goes with it.
      return { loss: withDevice(context.loss ?? context.draining, event.device, event.trigger, event.reason), draining: undefined };
    }),
    /** An operator's cordon while an iteration runs: whoever restarts workers hears of it now; the re-plan waits for the iteration's end and its snapshot. */
    noteCordon: assign(({ context, event }) => {
      if (event.type !== 'device.lost') return {};
      context.onCordoned?.({ device: event.device, trigger: event.trigger, reason: event.reason });
      context.recorder.phase('draining', `device ${event.device} cordoned (${event.reason}): the run re-plans without it once iteration ${context.iteration} and its snapshot are done`);
      const draining = withDevice(context.draining, event.device, event.trigger, event.reason);
      return { draining: { ...draining, announced: [...(draining.announced ?? []), event.device] } };
    }),
    /** The devices drained (or one of them lost its worker meanwhile): the loss the re-plan answers, from now. */
    drained: assign(({ context }) => ({ loss: { ...context.draining!, at: Date.now() }, draining: undefined })),
    /** Devices of the plan still missing past elastic.grace_seconds: lost for good. */
    graceExpired: assign(({ context }) => {
      const missing = missingDevices(context);
      const reason = `no worker for device(s) ${missing.join(', ')} within elastic.grace_seconds (${context.spec.scenario.elastic?.grace_seconds} s)`;
      return { loss: { devices: missing, trigger: 'grace' as const, reason, at: Date.now() } };
    }),
    /** Entering a re-plan: abandon every call in flight; a loss is a decision, not a failure, and does not count against the intensity. */
    beginReplan: ({ context }) => {
      const loss = context.loss;
      if (!loss) {
        // Taking over a run whose supervisor died migrating: the plan was decided and written ahead.
        context.dispatcher.interrupt('re-planning: taking over a migration');
        context.recorder.phase('migrating', `taking over the migration onto devices ${context.need.join(', ')} (the plan written ahead)`);
        return;
      }
      context.dispatcher.interrupt(`re-planning: ${loss.reason}`);
      context.recorder.phase(
        'replanning',
        loss.devices.length
          ? `device(s) ${loss.devices.join(', ')} lost for good (${loss.trigger}: ${loss.reason}): searching a plan on the devices left`
          : `${loss.reason}: offering device(s) ${loss.joined?.join(', ')} to the planner`,
      );
      if (loss.trigger !== 'join') for (const device of loss.devices.filter((x) => !loss.announced?.includes(x))) context.onCordoned?.({ device, trigger: loss.trigger, reason: loss.reason });
    },
    /**
     * After a loss (a plan without a device always migrates), the snapshot to migrate from is read
     * (from the devices' buckets), and its logical digests computed, while the search runs, not
     * after it. Not for workers that joined: the plan may well stay.
     */
    readSnapshotAhead: assign(({ context }) => {
      if (context.snapshot === undefined || !context.loss?.devices.length) return { reading: undefined };
      const loaded = readSnapshot(context.store, context.snapshot, context.spec);
      // Its failure is the migration's to meet (it reads it again then), never unhandled here.
      loaded.catch(() => {});
      return { reading: { snapshot: context.snapshot, loaded } };
    }),
    /**
     * After a loss, the devices left are reset at once, each keeping the shards it holds: the calls
     * abandoned there end while the search runs, and the migration's reset only drops what the new
     * plan does not keep. Its failure is the migration's to meet (its own reset).
     */
    resetAhead: ({ context }) => {
      const loss = context.loss;
      if (!loss?.devices.length) return;
      const left = context.need.filter((d) => context.joined[d] !== undefined && !loss.devices.includes(d));
      resetKeepingShards(fence(context.dispatcher), context.spec, left).catch(() => {});
    },
    adoptPlan: assign(({ context }, out: { spec: RunSpec; record: ReplanRecord }) => {
      context.recorder.phase('migrating', out.record.why);
      // Decided: the loss is answered (a recovery from here on restores onto the new plan).
      return {
        from: context.spec,
        spec: out.spec,
        need: planDevices(out.spec),
        lost: lostAfter(context.lost, out.spec, context.loss!),
        replans: [...context.replans, out.record],
        loss: undefined,
        lossAt: context.loss!.at,
        // Every device with a worker now was offered to this search: one it leaves idle is not offered again.
        considered: [...new Set([...context.considered, ...Object.keys(context.joined).map(Number)])],
      };
    }),
    /** Workers joined beyond the plan, at an iteration boundary: the planner is offered their devices (once each). */
    noteJoined: assign(({ context }) => {
      const fresh = sparesOf(context).filter((d) => !context.considered.includes(d));
      return {
        loss: { devices: [], joined: fresh, trigger: 'join' as const, reason: `worker(s) joined for device(s) ${fresh.join(', ')}`, at: Date.now() },
        considered: [...context.considered, ...fresh],
      };
    }),
    /** The planner kept the plan (the devices offered save less than moving onto them costs): the decision is recorded, the run goes on. */
    keptPlan: assign(({ context }, out: { record: ReplanRecord }) => {
      context.recorder.phase('iterating', out.record.why);
      return { replans: [...context.replans, { ...out.record, seconds: (Date.now() - (context.loss?.at ?? Date.now())) / 1000 }], loss: undefined, iteration: context.iteration + 1 };
    }),
    migrated: assign(({ context }, out: { snapshot: number; migration?: { seconds: number; bytes: number; minimumBytes: number; equal: boolean } }) => {
      const last = context.replans.at(-1)!;
      const m = out.migration;
      const done: ReplanRecord = {
        ...last,
        ...(m ? { migration_seconds: m.seconds, migration_bytes: m.bytes, migration_minimum_bytes: m.minimumBytes, parameters_equal_after_migration: m.equal } : {}),
        seconds: (Date.now() - (context.lossAt ?? Date.now())) / 1000,
      };
      // What the recovery entry that follows says: the run went back to its snapshot by a re-plan.
      const change = last.lost.length ? `without device(s) ${last.lost.join(', ')}` : `onto device(s) ${last.joined.join(', ')}`;
      const failure = { reason: `re-plan ${change} (${last.trigger}): ${last.reason}`, at: context.lossAt ?? Date.now() };
      return { replans: [...context.replans.slice(0, -1), done], from: undefined, lossAt: undefined, failure };
    }),
    recovered: assign(
      (
        { context },
        out: { parameters: Record<string, number>; snapshot: number; warmup?: Summary['warmup']; rewardModel?: Summary['reward_model']; bytes?: number; keptBytes?: number; viaSupervisor?: number },
      ) => {
        const seconds = (Date.now() - (context.failure?.at ?? Date.now())) / 1000;
        const history = context.history.filter((m) => m.iteration <= out.snapshot);
        const moved = out.bytes === undefined ? {} : { restored_bytes: out.bytes, kept_bytes: out.keptBytes ?? 0, via_supervisor_bytes: out.viaSupervisor ?? out.bytes };
        const entry = { epoch: context.dispatcher.epoch, reason: context.failure?.reason ?? 'unknown', snapshot: out.snapshot, iteration: out.snapshot + 1, seconds, ...moved };
        context.recorder.rewind?.(history);
        context.onRecovered?.(entry);
        return {
          attempts: 0,
          parameters: out.parameters,
          rewardModel: out.rewardModel ?? context.rewardModel,
          warmup: out.warmup ?? context.warmup,
          snapshot: out.snapshot,
          iteration: out.snapshot + 1,
          history,
          failure: undefined,
          recoveries: [...context.recoveries, entry],
        };
      },
    ),
    /** The iteration's metrics: the reward, every statistic the graph produced, time, tokens, moves. */
    recordIteration: assign(({ context }, out: IterationResult) => {
      const metrics = iterationMetrics(context, out, (Date.now() - context.starts.at(-1)!.at) / 1000);
      if (out.episodes) context.recorder.episodes?.(context.iteration, out.episodes.sample);
      context.recorder.iteration(metrics, context.spec.scenario.rl.iterations);
      return { history: [...context.history, metrics] };
    }),
    writeSummary: ({ context }) => context.recorder.finished(runSummary(context)),
  },
}).createMachine({
  id: 'supervisor',
  context: ({ input }) => ({
    ...input,
    need: planDevices(input.spec),
    joined: {},
    iteration: input.takeOver?.iteration ?? (input.resume ? input.resume.iteration + 1 : 0),
    startedAt: input.takeOver?.startedAt ?? Date.now(),
    starts: [],
    history: input.takeOver?.history ?? input.resume?.history ?? [],
    parameters: {},
    digests: {},
    snapshot: input.takeOver?.snapshot,
    intensity: new Intensity(input.spec.scenario.supervision.intensity, input.spec.scenario.supervision.period_seconds),
    recoveries: input.takeOver?.recoveries ?? [],
    lost: input.takeOver?.lost ?? [],
    replans: input.takeOver?.replans ?? [],
    considered: [],
    // A supervisor that died in a migration: the one taking over does it again, onto the plan written ahead.
    ...unfinishedMigration(input.takeOver, input.spec),
    attempts: 0,
    snapshots: { count: 0, bytes: 0, total_bytes: 0, bytes_via_supervisor: 0, write_seconds: 0, manifest_seconds: 0 },
    views: new NextViews<HeldView>(),
    ...(input.takeOver ? { failure: { reason: 'supervisor: a new supervisor took the run over', at: Date.now() } } : {}),
  }),
  // Membership runs for the whole run: workers can die and be replaced at any time.
  invoke: { id: 'membership', src: 'membership', input: ({ context }) => ({ need: context.need }) },
  initial: 'gathering',
  on: {
    // Ctrl-C, a stop request, or the launcher's escalation: the run ends as failed, and says why.
    interrupt: { target: '#supervisor.failing', actions: assign({ error: ({ event }) => event.reason }) },
    'worker.joined': { actions: 'join' },
    'worker.lost': { actions: 'unjoin' },
  },
  states: {
    gathering: {
      entry: { type: 'phase', params: { phase: 'gathering', detail: 'waiting for a worker on every device' } },
      always: [
        { guard: 'takingOverMigration', target: '#supervisor.replanning.waiting' },
        { guard: 'takingOver', target: 'recovering' },
        { guard: 'allJoined', target: 'settingUp' },
      ],
      // Taking a run over whose device was lost for good (the launcher asks again): re-plan without it.
      on: { 'device.lost': { guard: 'takenOver', target: '#supervisor.replanning', actions: 'noteLostForGood' } },
      after: {
        joinTimeout: {
          target: 'failing',
          actions: assign({
            error: ({ context }) => {
              return `no worker joined for device(s) ${missingDevices(context).join(', ')} within ${context.spec.scenario.timeouts.join_seconds} s`;
            },
          }),
        },
      },
    },
    settingUp: {
      entry: { type: 'phase', params: { phase: 'setup', detail: 'loading models, warm-up, copying the models that start from another' } },
      on: RECOVER_ON_LOSS,
      invoke: {
        src: 'setupModels',
        input: ({ context }) => ({
          d: fence(context.dispatcher),
          r: context.spec,
          store: context.store,
          iteration: -1,
          demonstrate: context.demonstrate,
          resume: context.resume?.checkpoint,
          resumeAfter: context.resume?.iteration,
        }),
        onDone: [
          // Resumed from the last iteration's checkpoint: nothing is left to train.
          {
            guard: 'nothingLeft',
            target: 'finishing',
            actions: assign({ parameters: ({ event }) => event.output.parameters, iteration: ({ context }) => context.iteration - 1, snapshot: ({ context }) => context.iteration - 1 }),
          },
          {
            target: 'saving',
            actions: assign({
              parameters: ({ event }) => event.output.parameters,
              snapshot: ({ context }) => context.resume?.iteration ?? -1,
              rewardModel: ({ event }) => event.output.rewardModel,
              warmup: ({ event }) => event.output.warmup,
            }),
          },
        ],
        onError: [
          { guard: ({ event }) => fatal(event.error), target: '#supervisor.failing', actions: { type: 'fail', params: ({ event }) => ({ stage: 'setup', error: event.error }) } },
          { target: '#supervisor.recovering', actions: { type: 'stageFailed', params: ({ event }) => ({ stage: 'setup', error: event.error }) } },
        ],
      },
    },
    recovering: {
      entry: 'beginRecovery',
      always: [
        { guard: 'escalated', target: 'failing' },
        { guard: 'losing', target: 'replanning' },
      ],
      // Another loss while recovering: start the recovery over (it counts against the intensity too).
      on: {
        'worker.lost': { target: 'recovering', reenter: true, actions: ['unjoin', 'noteLoss'] },
        'bus.trouble': { target: 'recovering', reenter: true, actions: 'noteLoss' },
        'device.lost': { target: '#supervisor.replanning', actions: 'noteLostForGood' },
      },
      initial: 'pausing',
      states: {
        pausing: { after: { backoff: 'waiting' } },
        waiting: {
          always: { guard: 'allJoined', target: 'restoring' },
          after: {
            // An elastic run does not wait past its grace period for a device: it goes on without it.
            grace: { guard: 'elastic', target: '#supervisor.replanning', actions: 'graceExpired' },
            recoverTimeout: {
              target: '#supervisor.failing',
              actions: assign({
                error: ({ context }) => {
                  return `recovery from "${context.failure?.reason}": no worker for device(s) ${missingDevices(context).join(', ')} within ${context.spec.scenario.timeouts.recover_seconds} s (timeouts.recover_seconds)`;
                },
              }),
            },
          },
        },
        restoring: {
          invoke: {
            src: 'recover',
            input: ({ context }) => restoreInput(context),
            onDone: [
              {
                guard: ({ context, event }) => event.output.snapshot + 1 >= context.spec.scenario.rl.iterations,
                target: '#supervisor.finishing',
                actions: [{ type: 'recovered', params: ({ event }) => event.output }, assign({ iteration: ({ context }) => context.iteration - 1 })],
              },
              { target: '#supervisor.saving', actions: { type: 'recovered', params: ({ event }) => event.output } },
            ],
            onError: [
              { guard: ({ event }) => fatal(event.error), target: '#supervisor.failing', actions: { type: 'fail', params: ({ event }) => ({ stage: 'recovery', error: event.error }) } },
              {
                target: '#supervisor.recovering',
                reenter: true,
                actions: assign({ failure: ({ event }) => ({ reason: `recovery: ${errorText(event.error)}`, at: Date.now() }) }),
              },
            ],
          },
        },
      },
    },
    /**
     * A device lost for good (elastic runs): the calls in flight are abandoned; a plan on the
     * devices left is searched and written ahead to the store; once every device of the new plan
     * has a worker, the last snapshot is restored onto it (checked bit for bit) and the run goes
     * on from the iteration after it, computing what the old plan recorded past the snapshot again
     * (each plan reads only its own stage records: the iteration's `plan`). A failure in the
     * migration is recovered as any other, onto the new plan.
     */
    replanning: {
      entry: ['beginReplan', 'readSnapshotAhead', 'resetAhead'],
      exit: assign({ reading: undefined }),
      on: {
        'worker.lost': { actions: 'unjoin' },
        'bus.trouble': {},
        'device.lost': { target: 'replanning', reenter: true, actions: 'noteLostForGood' },
      },
      initial: 'searching',
      states: {
        searching: {
          invoke: {
            src: 'decide',
            input: ({ context }) => ({
              r: context.spec,
              store: context.store,
              lost: context.lost,
              spares: sparesOf(context),
              loss: context.loss!,
              at: context.loss!.at,
              measuredPeriod: recentPeriod(context.starts, context.replans.at(-1)?.iteration ?? 0),
              progress: {
                epoch: context.dispatcher.epoch,
                iteration: (context.snapshot ?? -1) + 1,
                snapshot: context.snapshot,
                history: context.history.filter((m) => m.iteration <= (context.snapshot ?? -1)),
                startedAt: context.startedAt,
                recoveries: context.recoveries,
                replans: context.replans,
              },
            }),
            onDone: [
              { guard: ({ event }) => !event.output.changed, target: '#supervisor.saving', actions: { type: 'keptPlan', params: ({ event }) => event.output } },
              {
                target: 'waiting',
                actions: [
                  { type: 'adoptPlan', params: ({ event }) => event.output },
                  sendTo('membership', ({ context }) => ({ type: 'need', need: context.need, lost: context.lost }) as MembershipCommand),
                ],
              },
            ],
            onError: { target: '#supervisor.failing', actions: { type: 'fail', params: ({ event }) => ({ stage: 're-planning', error: event.error }) } },
          },
        },
        waiting: {
          always: { guard: 'allJoined', target: 'migrating' },
          after: {
            recoverTimeout: {
              target: '#supervisor.failing',
              actions: assign({
                error: ({ context }) =>
                  `re-planned onto devices ${context.need.join(', ')}, but no worker for device(s) ${missingDevices(context).join(', ')} came within ${context.spec.scenario.timeouts.recover_seconds} s (timeouts.recover_seconds)`,
              }),
            },
          },
        },
        migrating: {
          invoke: {
            src: 'migrate',
            input: ({ context }) => ({
              ...restoreInput(context),
              from: context.from!,
              lost: context.lost,
              ...(context.reading && context.reading.snapshot === context.snapshot ? { ahead: context.reading.loaded } : {}),
            }),
            onDone: [
              {
                guard: ({ context, event }) => event.output.snapshot + 1 >= context.spec.scenario.rl.iterations,
                target: '#supervisor.finishing',
                actions: [
                  { type: 'migrated', params: ({ event }) => event.output },
                  { type: 'recovered', params: ({ event }) => event.output },
                  assign({ iteration: ({ context }) => context.iteration - 1 }),
                ],
              },
              {
                target: '#supervisor.saving',
                actions: [
                  { type: 'migrated', params: ({ event }) => event.output },
                  { type: 'recovered', params: ({ event }) => event.output },
                ],
              },
            ],
            onError: [
              { guard: ({ event }) => fatal(event.error), target: '#supervisor.failing', actions: { type: 'fail', params: ({ event }) => ({ stage: 'migration', error: event.error }) } },
              { target: '#supervisor.recovering', actions: { type: 'stageFailed', params: ({ event }) => ({ stage: 'migration', error: event.error }) } },
            ],
          },
        },
      },
    },
    /** The progress record: where a supervisor that takes over would start. */
    saving: {
      on: RECOVER_ON_LOSS,
      invoke: {
        src: 'saveProgress',
        input: ({ context }) => ({
          store: context.store,
          progress: {
            epoch: context.dispatcher.epoch,
            iteration: context.iteration,
            snapshot: context.snapshot,
            history: context.history,
            startedAt: context.startedAt,
            recoveries: context.recoveries,
            ...(context.replans.length ? { plan: placementsOf(context.spec), lost: context.lost, replans: context.replans } : {}),
          },
        }),
        onDone: [{ guard: 'nothingLeft', target: 'finishing', actions: assign({ iteration: ({ context }) => context.iteration - 1 }) }, { target: 'iterating' }],
        onError: { target: 'failing', actions: { type: 'fail', params: ({ event }) => ({ stage: 'saving progress to the run store', error: event.error }) } },
      },
    },
    iterating: {
      initial: 'running',
      entry: { type: 'phase', params: { phase: 'iterating', detail: 'iterating' } },
      on: DRAIN_ON_CORDON,
      states: {
        running: {
          entry: assign({ starts: ({ context }) => [...context.starts, { iteration: context.iteration, at: Date.now() }] }),
          invoke: {
            src: 'iteration',
            input: ({ context }) => ({
              d: fence(context.dispatcher),
              r: context.spec,
              store: context.store,
              plan: planNumber(context.replans),
              iteration: context.iteration,
              rewards: context.rewards,
              views: context.views,
            }),
            onDone: { target: 'iterationDone', actions: { type: 'recordIteration', params: ({ event }) => event.output } },
            onError: [
              // A reward actor that never came, a loss that fails: going back to a snapshot would not mend it.
              {
                guard: ({ event }) => fatal(event.error),
                target: '#supervisor.failing',
                actions: { type: 'fail', params: ({ context, event }) => ({ stage: `iteration ${context.iteration}, ${failedNode(event.error)}`, error: event.error }) },
              },
              { target: '#supervisor.recovering', actions: { type: 'stageFailed', params: ({ event }) => ({ stage: failedNode(event.error), error: event.error }) } },
            ],
          },
        },
        iterationDone: {
          invoke: {
            src: 'checkpoint',
            // A device being drained: the snapshot is taken whatever checkpoint.every says (the re-plan goes on from it).
            input: ({ context }) => ({ d: fence(context.dispatcher), r: context.spec, store: context.store, iteration: context.iteration, force: context.draining !== undefined }),
            onDone: [
              {
                guard: ({ event }) => event.output !== undefined,
                target: 'advancing',
                actions: assign({
                  snapshot: ({ context }) => context.iteration,
                  snapshots: ({ context, event }) => ({
                    count: context.snapshots.count + 1,
                    bytes: event.output!.bytes,
                    total_bytes: context.snapshots.total_bytes + event.output!.bytes,
                    bytes_via_supervisor: context.snapshots.bytes_via_supervisor + event.output!.manifest_bytes,
                    write_seconds: context.snapshots.write_seconds + event.output!.write_seconds,
                    manifest_seconds: context.snapshots.manifest_seconds + event.output!.manifest_seconds,
                  }),
                }),
              },
              { target: 'advancing' },
            ],
            onError: { target: '#supervisor.recovering', actions: { type: 'stageFailed', params: ({ event }) => ({ stage: 'checkpoint', error: event.error }) } },
          },
        },
        advancing: {
          always: [
            // A device cordoned during the iteration: drained, the run re-plans without it from this snapshot.
            { guard: 'drainedUnsnapshotted', target: 'iterationDone' },
            { guard: 'drainedSnapshotted', target: '#supervisor.replanning', actions: 'drained' },
            // Workers that joined beyond the plan are offered to the planner at the boundary.
            { guard: 'offered', target: '#supervisor.replanning', actions: 'noteJoined' },
            { guard: 'moreIterations', target: '#supervisor.saving', actions: assign({ iteration: ({ context }) => context.iteration + 1 }) },
            { target: '#supervisor.finishing' },
          ],
        },
      },
    },
    finishing: {
      initial: 'digesting',
      entry: { type: 'phase', params: { phase: 'finishing', detail: 'collecting digests, stopping workers' } },
      states: {
        digesting: {
          on: RECOVER_ON_LOSS,
          invoke: {
            src: 'digest',
            input: ({ context }) => ({ d: fence(context.dispatcher), r: context.spec, store: context.store, plan: planNumber(context.replans), iteration: context.iteration }),
            onDone: { target: 'keeping', actions: assign({ digests: ({ event }) => event.output.digests, rollouts: ({ event }) => event.output.rollouts }) },
            onError: { target: '#supervisor.recovering', actions: { type: 'stageFailed', params: ({ event }) => ({ stage: 'digests', error: event.error }) } },
          },
        },
        keeping: {
          invoke: {
            src: 'keepCheckpoint',
            input: ({ context }) => ({ store: context.store, snapshot: context.snapshot, save: context.saveCheckpoint }),
            onDone: { target: 'stopping' },
            // Failed already: not tried again on the way out.
            onError: { target: '#supervisor.failed', actions: { type: 'fail', params: ({ event }) => ({ stage: "writing the run directory's checkpoint", error: event.error }) } },
          },
        },
        stopping: {
          entry: { type: 'phase', params: { phase: 'stopping', detail: 'stopping the workers' } },
          invoke: {
            src: 'stopWorkers',
            input: ({ context }) => ({ d: fence(context.dispatcher), r: context.spec, store: context.store, iteration: context.iteration }),
            onDone: { target: '#supervisor.done' },
            onError: { target: '#supervisor.failing', actions: { type: 'fail', params: ({ event }) => ({ stage: 'stopping the workers', error: event.error }) } },
          },
        },
      },
    },
    /** A run that fails keeps its last snapshot in the run directory too, then ends. */
    failing: {
      // Asked to stop again while it writes: it stops now, for the reason it was failing.
      on: { interrupt: { target: 'failed' } },
      invoke: {
        src: 'keepCheckpoint',
        input: ({ context }) => ({ store: context.store, snapshot: context.snapshot, save: context.saveCheckpoint }),
        onDone: { target: 'failed' },
        onError: { target: 'failed', actions: ({ context, event }) => context.recorder.phase('failing', `the run directory keeps no checkpoint of this run: ${errorText(event.error)}`) },
      },
    },
    done: { type: 'final', entry: 'writeSummary' },
    failed: { type: 'final', entry: 'writeSummary' },
  },
  output: ({ context }) => ({ status: context.error ? 'failed' : 'succeeded', error: context.error }),
});
