// The supervisor machine on its own: every stage is a stand-in actor, so its paths (a clean run,
// losses, failing stages, escalation, take-over, interruption) run without processes or NATS.
import { describe, it, expect, vi } from 'vitest';
import { createActor, fromCallback, fromPromise, waitFor, type InputFrom } from 'xstate';
import type { CallBody, CallOf, Metrics } from '../../mesh/wire/messages/protocol.ts';
import type { Dispatcher } from '../runtime/dispatch/dispatch.ts';
import type { Recorder, Summary } from '../runtime/record/record.ts';
import type { Progress, RunStore } from '../runtime/store/store.ts';
import { layoutOf, ownerOf, planDevices, runSpec, type IterationResult, type RunSpec } from '../runtime/run/run.ts';
import { keptModels, type CheckpointSet, type SnapshotCost } from '../runtime/run/setup.ts';
import { MemoryShelf } from '../../mesh/wire/index.ts';
import { parseScenario } from '../runtime/scenario/scenario.ts';
import { supervisorMachine, type MembershipCommand, type MigrationOutput, type SupervisorInput } from './supervisor.machine.ts';
import { FOUR_DEVICES } from '../runtime/run/four-devices.fixture.ts';

type Impl = NonNullable<NonNullable<Parameters<typeof supervisorMachine.provide>[0]>['actors']>;
/** The input the machine gives a stage actor. */
type In<K extends keyof Impl> = InputFrom<NonNullable<Impl[K]>>;

const delay = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

function deferred<T>() {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

function spec(o: { iterations?: number; every?: number; intensity?: number; join?: number; recover?: number } = {}): RunSpec {
  const yaml = [
    `rl: { iterations: ${o.iterations ?? 3}, batch: 8 }`,
    `checkpoint: { every: ${o.every ?? 1} }`,
    `supervision: { intensity: ${o.intensity ?? 5}, period_seconds: 60 }`,
    `timeouts: { join_seconds: ${o.join ?? 5}, recover_seconds: ${o.recover ?? 5} }`,
  ].join('\n');
  return runSpec(parseScenario(yaml, 'unit.yaml'));
}

/** A dispatcher that counts interruptions and answers resets (kept in `resets`): the stand-in stages call the devices for nothing else. */
function stubDispatcher() {
  const interrupts: string[] = [];
  const resets: Array<{ device: number; epoch: number; keep: string[] }> = [];
  const never = (what: string) => () => {
    throw new Error(`the stand-in dispatcher's ${what} was called`);
  };
  const d: Dispatcher & { interrupts: string[]; resets: typeof resets } = {
    interrupts,
    resets,
    get epoch() {
      return interrupts.length;
    },
    interrupt: (reason: string) => void interrupts.push(reason),
    call: (async (device: number, _model: string, _iteration: number, body: CallBody) => {
      if (body.fn !== 'reset') never(`call (${body.fn})`)();
      const { epoch, keep } = body as CallOf<'reset'>;
      resets.push({ device, epoch, keep: keep ?? [] });
      return { dropped: [], kept: [], busy: [] };
    }) as Dispatcher['call'],
    realloc: never('realloc'),
    checkpointShard: never('checkpointShard'),
    restoreShard: never('restoreShard'),
    close: never('close'),
  };
  return d;
}

/** A recorder that keeps every call, and their order as short lines. */
function stubRecorder() {
  const log: string[] = [];
  const recorder = {
    log,
    phase: vi.fn<Recorder['phase']>((phase) => void log.push(`phase ${phase}`)),
    iteration: vi.fn<Recorder['iteration']>((m) => void log.push(`iteration ${m.iteration}`)),
    finished: vi.fn<Recorder['finished']>((s) => void log.push(`finished ${s.status}`)),
    rewind: vi.fn<NonNullable<Recorder['rewind']>>((kept) => void log.push(`rewind [${kept.map((m) => m.iteration).join(',')}]`)),
  };
  return recorder;
}

function stubStore(): RunStore {
  return {
    saveProgress: vi.fn(async () => {}),
    loadProgress: vi.fn(async () => undefined),
    saveStage: vi.fn(async () => {}),
    loadStage: vi.fn(async () => undefined),
    saveSnapshot: vi.fn(async () => ({ bytes: 0 })),
    loadSnapshot: vi.fn(async () => undefined),
    loadManifest: vi.fn(async () => undefined),
    previousSnapshot: vi.fn(async () => undefined),
    close: vi.fn(async () => {}),
    shelf: new MemoryShelf(),
  };
}

const result = (): IterationResult => ({
  fields: { scores: Float32Array.of(0.5, 1), kl: 0.1, actor_loss: 0.2, critic_loss: 0.3 },
  moved: [],
  sources: { rule: 0.75 },
  generated: 8,
});

/** The metrics a take-over's progress keeps for an iteration done before. */
const pastMetrics = (iteration: number): Metrics => ({
  iteration,
  reward_mean: 0.5,
  seconds: 1,
  tokens: 8,
  tokens_per_second: 8,
  realloc_seconds: 0,
  realloc_bytes: 0,
});

interface Options {
  spec?: RunSpec;
  /** Each iteration's stand-in: `attempt` counts the calls for that iteration (0 first). */
  iterate?: (iteration: number, attempt: number) => Promise<IterationResult>;
  /** The checkpoint stand-in's answer for an iteration (default: a snapshot after every one); `force`: the machine asks for one whatever checkpoint.every says. */
  checkpoint?: (iteration: number, force?: boolean) => SnapshotCost | undefined;
  setup?: (attempt: number) => Promise<{ parameters: Record<string, number> }>;
  recover?: (input: In<'recover'>, attempt: number) => Promise<{ parameters: Record<string, number>; snapshot: number }>;
  digest?: (attempt: number) => Promise<{ digests: Record<string, string>; rollouts: { prompts: number; lost: number; duplicated: number } }>;
  input?: Partial<SupervisorInput>;
}

/** Starts the machine with stand-ins for every stage; records each stage's inputs. */
function startSupervisor(o: Options = {}) {
  const r = o.spec ?? spec();
  const dispatcher = stubDispatcher();
  const recorder = stubRecorder();
  const store = stubStore();
  const calls = {
    membership: [] as Array<{ need: number[] }>,
    membershipStopped: 0,
    /** What the machine told membership (a re-plan's devices). */
    told: [] as MembershipCommand[],
    migrate: [] as In<'migrate'>[],
    setup: [] as In<'setupModels'>[],
    recover: [] as In<'recover'>[],
    iteration: [] as In<'iteration'>[],
    checkpoint: [] as In<'checkpoint'>[],
    progress: [] as Progress[],
    digest: [] as In<'digest'>[],
    stop: [] as In<'stopWorkers'>[],
  };
  const attempts = new Map<number, number>();
  const machine = supervisorMachine.provide({
    actors: {
      membership: fromCallback<MembershipCommand, { need: number[] }>(({ input, receive }) => {
        calls.membership.push(input);
        receive((command) => void calls.told.push(command));
        return () => void calls.membershipStopped++;
      }),
      // The migration's stand-in: what a restore onto the new plan returns, checked.
      migrate: fromPromise<MigrationOutput, In<'migrate'>>(async ({ input }) => {
        calls.migrate.push(input);
        return { parameters: { actor: 10 }, snapshot: input.snapshot ?? -1, migration: { seconds: 0.01, bytes: 300, minimumBytes: 100, equal: true } };
      }),
      setupModels: fromPromise<{ parameters: Record<string, number> }, In<'setupModels'>>(async ({ input }) => {
        calls.setup.push(input);
        if (o.setup) return o.setup(calls.setup.length - 1);
        return { parameters: { actor: 10 } };
      }),
      recover: fromPromise<{ parameters: Record<string, number>; snapshot: number }, In<'recover'>>(async ({ input }) => {
        calls.recover.push(input);
        if (o.recover) return o.recover(input, calls.recover.length - 1);
        return { parameters: { actor: 10 }, snapshot: input.snapshot ?? input.resume?.iteration ?? -1 };
      }),
      checkpoint: fromPromise<SnapshotCost | undefined, In<'checkpoint'>>(async ({ input }) => {
        calls.checkpoint.push(input);
        return o.checkpoint ? o.checkpoint(input.iteration, input.force) : { bytes: 1, manifest_bytes: 2, write_seconds: 0, manifest_seconds: 0 };
      }),
      saveProgress: fromPromise<void, In<'saveProgress'>>(async ({ input }) => {
        calls.progress.push(structuredClone(input.progress));
      }),
      iteration: fromPromise<IterationResult, In<'iteration'>>(async ({ input }) => {
        calls.iteration.push(input);
        const attempt = attempts.get(input.iteration) ?? 0;
        attempts.set(input.iteration, attempt + 1);
        if (o.iterate) return o.iterate(input.iteration, attempt);
        // A few milliseconds, as an iteration takes some time (its tokens per second stay finite).
        await delay(5);
        return result();
      }),
      digest: fromPromise<{ digests: Record<string, string>; rollouts: { prompts: number; lost: number; duplicated: number } }, In<'digest'>>(async ({ input }) => {
        calls.digest.push(input);
        if (o.digest) return o.digest(calls.digest.length - 1);
        return { digests: { actor: 'a' }, rollouts: { prompts: 24, lost: 0, duplicated: 0 } };
      }),
      stopWorkers: fromPromise<void, In<'stopWorkers'>>(async ({ input }) => {
        calls.stop.push(input);
      }),
    },
  });
  const actor = createActor(machine, { input: { spec: r, run: 'unit', dispatcher, recorder, store, ...o.input } });
  actor.start();
  const devices = planDevices(r);
  const join = (only: readonly number[] = devices, worker = (d: number) => `w-${d}`) => {
    for (const device of only) actor.send({ type: 'worker.joined', device, worker: worker(device), backend: 'cpu' });
  };
  const lose = (device: number, reason = 'exited with code 1') => actor.send({ type: 'worker.lost', device, worker: `w-${device}`, reason });
  const finished = async () => {
    await waitFor(actor, (s) => s.status === 'done', { timeout: 5000 });
    return actor.getSnapshot();
  };
  const summary = (): Summary => {
    expect(recorder.finished).toHaveBeenCalledTimes(1);
    return recorder.finished.mock.calls[0]![0];
  };
  return { actor, spec: r, devices, dispatcher, recorder, store, calls, join, lose, finished, summary };
}

/** The standard iteration's metrics (time and throughput vary). */
const expectedMetrics = (iteration: number) => ({
  iteration,
  reward_mean: 0.75,
  kl: 0.1,
  actor_loss: 0.2,
  critic_loss: 0.3,
  seconds: expect.any(Number),
  tokens: 8,
  tokens_per_second: expect.any(Number),
  realloc_seconds: 0,
  realloc_bytes: 0,
  rewards: { rule: 0.75 },
});

describe('supervisor machine', () => {
  it("writes the run directory's checkpoint once, from the last snapshot, when the run ends well or not; asked to stop again meanwhile, it stops", async () => {
    const set: CheckpointSet = { actor: [{ tensors: [{ name: 'w', shape: [1], data: Float32Array.of(1) }] }] };
    const layouts = { actor: { devices: [0], dp: 1, tp: 1, pp: 1 } };
    const saved: number[] = [];
    const saveCheckpoint = vi.fn(async (iteration: number, got: CheckpointSet) => {
      expect(got).toBe(set);
      saved.push(iteration);
    });
    // Well: the snapshot after the last iteration, once.
    const well = startSupervisor({ input: { saveCheckpoint } });
    vi.mocked(well.store.loadSnapshot).mockImplementation(async () => ({ set, layouts }));
    well.join();
    expect((await well.finished()).value).toBe('done');
    expect(saved).toEqual([2]);
    expect(vi.mocked(well.store.loadSnapshot).mock.calls).toEqual([[2]]);
    // Not well: stopped in iteration 1, it keeps the snapshot after iteration 0.
    let stopHere!: () => void;
    const inOne = new Promise<void>((resolve) => (stopHere = resolve));
    const stopped = startSupervisor({ input: { saveCheckpoint }, iterate: async (i) => (i === 1 ? (stopHere(), new Promise<never>(() => {})) : result()) });
    vi.mocked(stopped.store.loadSnapshot).mockImplementation(async () => ({ set, layouts }));
    stopped.join();
    await inOne;
    stopped.actor.send({ type: 'interrupt', reason: 'interrupted: ctrl-c' });
    const end = await stopped.finished();
    expect(end.value).toBe('failed');
    expect(saved).toEqual([2, 0]);
    // Reading the snapshot back hangs: a second interrupt ends the run at once, for the first reason.
    const hung = startSupervisor({ input: { saveCheckpoint }, iterate: async (i) => (i === 1 ? new Promise<never>(() => {}) : result()) });
    vi.mocked(hung.store.loadSnapshot).mockImplementation(() => new Promise(() => {}));
    hung.join();
    await waitFor(hung.actor, (x) => x.context.iteration === 1, { timeout: 2000 });
    hung.actor.send({ type: 'interrupt', reason: 'interrupted: first' });
    await waitFor(hung.actor, (x) => x.matches('failing'), { timeout: 2000 });
    hung.actor.send({ type: 'interrupt', reason: 'interrupted: second' });
    const over = await hung.finished();
    expect(over.value).toBe('failed');
    expect(over.output).toEqual({ status: 'failed', error: 'interrupted: first' });
    expect(saved).toEqual([2, 0]);
  });

  it('a clean run: gathers, sets up, records every iteration once in order, collects digests and stops', async () => {
    const s = startSupervisor();
    expect(s.devices).toEqual([0, 1, 2, 3]);
    expect(s.calls.membership).toEqual([{ need: [0, 1, 2, 3] }]);
    expect(s.actor.getSnapshot().value).toBe('gathering');
    s.join(s.devices.slice(0, 3));
    expect(s.actor.getSnapshot().value).toBe('gathering');
    expect(s.calls.setup).toHaveLength(0);
    s.join([3]);
    const snap = await s.finished();

    expect(snap.value).toBe('done');
    expect(snap.output).toEqual({ status: 'succeeded', error: undefined });

    // stages, in order, with the iterations they were given
    expect(s.calls.setup).toHaveLength(1);
    expect(s.calls.setup[0]).toMatchObject({ r: s.spec, iteration: -1, resume: undefined, resumeAfter: undefined });
    expect(s.calls.iteration.map((i) => i.iteration)).toEqual([0, 1, 2]);
    expect(s.calls.checkpoint.map((i) => i.iteration)).toEqual([0, 1, 2]);
    expect(s.calls.progress.map((p) => [p.iteration, p.snapshot, p.history.length])).toEqual([
      [0, -1, 0],
      [1, 0, 1],
      [2, 1, 2],
    ]);
    expect(s.calls.digest.map((i) => i.iteration)).toEqual([2]);
    expect(s.calls.stop.map((i) => i.iteration)).toEqual([2]);
    expect(s.calls.recover).toHaveLength(0);
    expect(s.dispatcher.interrupts).toEqual([]);

    // the recorder saw each iteration once, in order, with its metrics
    expect(s.recorder.log).toEqual([
      'phase gathering',
      'phase setup',
      'phase iterating',
      'iteration 0',
      'phase iterating',
      'iteration 1',
      'phase iterating',
      'iteration 2',
      'phase finishing',
      'phase stopping',
      'finished succeeded',
    ]);
    expect(s.recorder.iteration.mock.calls.map(([m, n]) => [m, n])).toEqual([0, 1, 2].map((i) => [expectedMetrics(i), 3]));
    for (const [m] of s.recorder.iteration.mock.calls) {
      expect(m.seconds).toBeGreaterThan(0);
      expect(Number.isFinite(m.tokens_per_second)).toBe(true);
      expect(m).not.toHaveProperty('scores');
      expect(m).not.toHaveProperty('rule_score');
    }
    expect(s.recorder.rewind).not.toHaveBeenCalled();

    const summary = s.summary();
    expect(summary).toMatchObject({
      status: 'succeeded',
      scenario: 'scenario',
      run: 'unit',
      iterations: 3,
      backend: 'cpu',
      reward_first5: 0.75,
      reward_last5: 0.75,
      digests: { actor: 'a' },
      parameters: { actor: 10 },
      recoveries: [],
      snapshots: { count: 3, bytes: 1, total_bytes: 3, bytes_via_supervisor: 6, write_seconds: 0, manifest_seconds: 0 },
      rollouts: { prompts: 24, lost: 0, duplicated: 0 },
    });
    expect(summary).not.toHaveProperty('error');
    expect(summary).not.toHaveProperty('transport');
    expect(Object.keys(summary.plan).sort()).toEqual(Object.keys(s.spec.plan).sort());
    // the machine is done: membership was stopped with it; the stand-ins never touched the store
    expect(s.calls.membershipStopped).toBe(1);
    expect(s.store.saveProgress).not.toHaveBeenCalled();
    expect(s.store.loadSnapshot).not.toHaveBeenCalled();
  });

  it('a worker lost while an iteration runs: interrupts, waits for the device, restores the last snapshot and goes on after it', async () => {
    const hung = deferred<IterationResult>();
    const s = startSupervisor({
      iterate: async (iteration, attempt) => {
        if (iteration === 1 && attempt === 0) return hung.promise;
        await delay(5);
        return result();
      },
    });
    s.join();
    await vi.waitFor(() => expect(s.calls.iteration).toHaveLength(2));
    expect(s.actor.getSnapshot().matches({ iterating: 'running' })).toBe(true);
    expect(s.actor.getSnapshot().context.iteration).toBe(1);
    const abandoned = s.calls.iteration[1]!;

    s.lose(2, 'exited with code 1');
    await waitFor(s.actor, (x) => x.matches({ recovering: 'waiting' }), { timeout: 2000 });
    expect(s.dispatcher.interrupts).toEqual(['device 2 (worker w-2): exited with code 1']);
    expect(s.dispatcher.epoch).toBe(1);
    expect(s.recorder.phase).toHaveBeenCalledWith('recovering', 'device 2 (worker w-2): exited with code 1 (recovery 1)');
    // the abandoned iteration's dispatcher is fenced: it can reach no device any more
    expect(() => abandoned.d.call(0, 'actor', 1, { fn: 'manifest' })).toThrow(/abandoned: this stage began in epoch 0, the run is in epoch 1/);
    // it waits for device 2
    await delay(100);
    expect(s.actor.getSnapshot().matches({ recovering: 'waiting' })).toBe(true);
    expect(s.calls.recover).toHaveLength(0);

    s.join([2], () => 'w-2b');
    const snap = await s.finished();
    // the abandoned call finishing late changes nothing
    hung.resolve(result());
    await delay(20);

    expect(snap.value).toBe('done');
    expect(snap.output).toEqual({ status: 'succeeded', error: undefined });
    expect(s.calls.recover).toHaveLength(1);
    expect(s.calls.recover[0]).toMatchObject({ snapshot: 0, devices: [0, 1, 2, 3], iteration: -1 });
    expect(s.calls.recover[0]!.d.epoch).toBe(1);
    expect(s.calls.iteration.map((i) => i.iteration)).toEqual([0, 1, 1, 2]);
    expect(s.calls.iteration[2]!.d.epoch).toBe(1);
    expect(s.recorder.rewind).toHaveBeenCalledTimes(1);
    expect(s.recorder.rewind.mock.calls[0]![0]).toEqual([expectedMetrics(0)]);
    expect(s.recorder.iteration.mock.calls.map(([m]) => m.iteration)).toEqual([0, 1, 2]);
    expect(s.recorder.log).toEqual([
      'phase gathering',
      'phase setup',
      'phase iterating',
      'iteration 0',
      'phase iterating',
      'phase recovering',
      'rewind [0]',
      'phase iterating',
      'iteration 1',
      'phase iterating',
      'iteration 2',
      'phase finishing',
      'phase stopping',
      'finished succeeded',
    ]);
    // the progress after the recovery says where a take-over would start
    expect(s.calls.progress.map((p) => [p.epoch, p.iteration, p.snapshot, p.recoveries.length])).toEqual([
      [0, 0, -1, 0],
      [0, 1, 0, 0],
      [1, 1, 0, 1],
      [1, 2, 1, 1],
    ]);

    const summary = s.summary();
    expect(summary.status).toBe('succeeded');
    expect(summary.iterations).toBe(3);
    expect(summary.recoveries).toEqual([{ epoch: 1, reason: 'device 2 (worker w-2): exited with code 1', snapshot: 0, iteration: 1, seconds: expect.any(Number) }]);
    expect(summary.recoveries[0]!.seconds).toBeGreaterThanOrEqual(0.1);
  });

  it('an iteration that fails in a call recovers, naming the iteration and the node', async () => {
    const s = startSupervisor({
      iterate: async (iteration, attempt) => {
        await delay(5);
        if (iteration === 1 && attempt === 0) throw Object.assign(new Error('out of memory'), { node: 'actor.train' });
        return result();
      },
    });
    s.join();
    const snap = await s.finished();
    expect(snap.value).toBe('done');
    expect(snap.output).toEqual({ status: 'succeeded', error: undefined });
    expect(s.dispatcher.interrupts).toEqual(['iteration 1, actor.train: Error: out of memory']);
    expect(s.recorder.phase).toHaveBeenCalledWith('recovering', 'iteration 1, actor.train: Error: out of memory (recovery 1)');
    expect(s.calls.recover.map((i) => i.snapshot)).toEqual([0]);
    expect(s.calls.iteration.map((i) => i.iteration)).toEqual([0, 1, 1, 2]);
    expect(s.recorder.rewind.mock.calls.map(([kept]) => kept.map((m) => m.iteration))).toEqual([[0]]);
    expect(s.recorder.iteration.mock.calls.map(([m]) => m.iteration)).toEqual([0, 1, 2]);
    const { recoveries } = s.summary();
    expect(recoveries).toHaveLength(1);
    expect(recoveries[0]!.reason).toContain('iteration 1, actor.train:');
    expect(recoveries[0]).toMatchObject({ epoch: 1, snapshot: 0, iteration: 1 });
  });

  it('an error without a node is named as the iteration', async () => {
    const s = startSupervisor({
      iterate: async (iteration, attempt) => {
        if (iteration === 0 && attempt === 0) throw new TypeError('bad field');
        return result();
      },
    });
    s.join();
    await s.finished();
    expect(s.summary().recoveries.map((r) => r.reason)).toEqual(['iteration 0, iteration: TypeError: bad field']);
    // no snapshot after an iteration yet: back to the one after setup, and nothing is kept
    expect(s.calls.recover.map((i) => i.snapshot)).toEqual([-1]);
    expect(s.recorder.rewind.mock.calls).toEqual([[[]]]);
    expect(s.calls.iteration.map((i) => i.iteration)).toEqual([0, 0, 1, 2]);
  });

  it('a fatal error (a reward actor that never came) fails the run at once, without recovering', async () => {
    const s = startSupervisor({
      iterate: async (iteration) => {
        await delay(5);
        if (iteration === 1) throw Object.assign(new Error("no reward actor 'judge' appeared within 60 s"), { node: 'reward.inference', fatal: true });
        return result();
      },
    });
    s.join();
    const snap = await s.finished();
    const error = "iteration 1, reward.inference: Error: no reward actor 'judge' appeared within 60 s";
    expect(snap.value).toBe('failed');
    expect(snap.output).toEqual({ status: 'failed', error });
    expect(s.calls.recover).toHaveLength(0);
    expect(s.dispatcher.interrupts).toEqual([]);
    expect(s.recorder.phase).not.toHaveBeenCalledWith('recovering', expect.anything());
    expect(s.calls.iteration.map((i) => i.iteration)).toEqual([0, 1]);
    expect(s.calls.digest).toHaveLength(0);
    expect(s.calls.stop).toHaveLength(0);
    expect(s.summary()).toMatchObject({ status: 'failed', error, iterations: 1, recoveries: [] });
  });

  it('failures past the supervision intensity end the run with a supervision error', async () => {
    const s = startSupervisor({
      spec: spec({ intensity: 2 }),
      iterate: async () => {
        await delay(5);
        throw Object.assign(new Error('NaN in the loss'), { node: 'actor.train' });
      },
    });
    s.join();
    const snap = await s.finished();
    expect(snap.value).toBe('failed');
    const output = snap.output!;
    expect(output.status).toBe('failed');
    expect(output.error).toMatch(/^supervision: /);
    expect(output.error).toContain('3 failures within 60 s (supervision.intensity allows 2)');
    expect(output.error).toContain('iteration 0, actor.train: Error: NaN in the loss');
    // two recoveries were allowed; the third failure escalated
    expect(s.calls.iteration.map((i) => i.iteration)).toEqual([0, 0, 0]);
    expect(s.calls.recover.map((i) => i.snapshot)).toEqual([-1, -1]);
    expect(s.dispatcher.interrupts).toHaveLength(3);
    expect(s.recorder.iteration).not.toHaveBeenCalled();
    const summary = s.summary();
    expect(summary.status).toBe('failed');
    expect(summary.error).toBe(output.error);
    expect(summary.recoveries).toHaveLength(2);
  });

  it('no worker for some devices within join_seconds: fails naming them, and sets nothing up', async () => {
    const s = startSupervisor({ spec: spec({ join: 0.3 }) });
    s.join([0, 1]);
    const t0 = Date.now();
    const snap = await s.finished();
    expect(Date.now() - t0).toBeGreaterThanOrEqual(250);
    const error = 'no worker joined for device(s) 2, 3 within 0.3 s';
    expect(snap.value).toBe('failed');
    expect(snap.output).toEqual({ status: 'failed', error });
    expect(s.calls.setup).toHaveLength(0);
    expect(s.calls.iteration).toHaveLength(0);
    expect(s.recorder.log).toEqual(['phase gathering', 'finished failed']);
    expect(s.summary()).toMatchObject({ status: 'failed', error, iterations: 0, backend: 'cpu', recoveries: [], digests: {} });
  });

  it('a take-over recovers as soon as every device has a worker, then continues from the iteration in progress', async () => {
    const startedAt = Date.now() - 10_000;
    const takeOver: Progress = { epoch: 0, iteration: 1, snapshot: 0, history: [pastMetrics(0)], startedAt, recoveries: [] };
    const s = startSupervisor({ input: { takeOver } });
    s.join([0, 1, 2]);
    await delay(50);
    expect(s.actor.getSnapshot().value).toBe('gathering');
    expect(s.dispatcher.interrupts).toEqual([]);
    s.join([3]);
    const snap = await s.finished();

    expect(snap.value).toBe('done');
    expect(snap.output).toEqual({ status: 'succeeded', error: undefined });
    expect(s.calls.setup).toHaveLength(0);
    expect(s.dispatcher.interrupts).toEqual(['supervisor: a new supervisor took the run over']);
    expect(s.calls.recover).toHaveLength(1);
    expect(s.calls.recover[0]).toMatchObject({ snapshot: 0, devices: [0, 1, 2, 3] });
    expect(s.calls.iteration.map((i) => i.iteration)).toEqual([1, 2]);
    expect(s.recorder.rewind.mock.calls).toEqual([[[pastMetrics(0)]]]);
    expect(s.recorder.iteration.mock.calls.map(([m]) => m.iteration)).toEqual([1, 2]);
    expect(s.recorder.log.slice(0, 3)).toEqual(['phase gathering', 'phase recovering', 'rewind [0]']);

    const summary = s.summary();
    expect(summary.status).toBe('succeeded');
    expect(summary.iterations).toBe(3);
    expect(summary.reward_first5).toBeCloseTo((0.5 + 0.75 + 0.75) / 3);
    expect(summary.recoveries).toEqual([{ epoch: 1, reason: 'supervisor: a new supervisor took the run over', snapshot: 0, iteration: 1, seconds: expect.any(Number) }]);
    // the run's clock is the one it started with
    expect(summary.wall_seconds).toBeGreaterThanOrEqual(10);
    expect(summary.digests).toEqual({ actor: 'a' });
  });

  it('an interrupt event ends the run as failed with its reason, and the summary is still written', async () => {
    const hung = deferred<IterationResult>();
    const s = startSupervisor({
      iterate: async (iteration) => {
        if (iteration === 1) return hung.promise;
        await delay(5);
        return result();
      },
    });
    s.join();
    await vi.waitFor(() => expect(s.calls.iteration).toHaveLength(2));
    s.actor.send({ type: 'interrupt', reason: 'interrupted (SIGINT)' });
    const snap = await s.finished();
    hung.resolve(result());

    expect(snap.value).toBe('failed');
    expect(snap.output).toEqual({ status: 'failed', error: 'interrupted (SIGINT)' });
    expect(s.calls.recover).toHaveLength(0);
    expect(s.calls.digest).toHaveLength(0);
    expect(s.calls.stop).toHaveLength(0);
    expect(s.calls.membershipStopped).toBe(1);
    expect(s.recorder.log.at(-1)).toBe('finished failed');
    expect(s.summary()).toMatchObject({ status: 'failed', error: 'interrupted (SIGINT)', iterations: 1, recoveries: [], digests: {} });
  });

  it('a loss while collecting digests restores the last snapshot and goes straight back to finishing', async () => {
    const digesting = deferred<{ digests: Record<string, string>; rollouts: { prompts: number; lost: number; duplicated: number } }>();
    const s = startSupervisor({
      digest: async (attempt) => (attempt === 0 ? digesting.promise : { digests: { actor: 'b' }, rollouts: { prompts: 24, lost: 0, duplicated: 0 } }),
    });
    s.join();
    await vi.waitFor(() => expect(s.calls.digest).toHaveLength(1));
    s.lose(0, 'no heartbeat for 10 s');
    await waitFor(s.actor, (x) => x.matches({ recovering: 'waiting' }), { timeout: 2000 });
    s.join([0]);
    const snap = await s.finished();

    expect(snap.value).toBe('done');
    expect(s.calls.recover.map((i) => i.snapshot)).toEqual([2]);
    expect(s.calls.iteration.map((i) => i.iteration)).toEqual([0, 1, 2]);
    expect(s.calls.digest.map((i) => i.iteration)).toEqual([2, 2]);
    expect(s.calls.stop.map((i) => i.iteration)).toEqual([2]);
    expect(s.recorder.rewind.mock.calls.map(([kept]) => kept.map((m) => m.iteration))).toEqual([[0, 1, 2]]);
    expect(s.summary()).toMatchObject({
      status: 'succeeded',
      iterations: 3,
      digests: { actor: 'b' },
      recoveries: [{ epoch: 1, reason: 'device 0 (worker w-0): no heartbeat for 10 s', snapshot: 2, iteration: 3 }],
    });
  });

  it('without a checkpoint after an iteration, a recovery goes back to the last one taken', async () => {
    const s = startSupervisor({
      spec: spec({ iterations: 4, every: 2 }),
      // every: 2 (and the last): snapshots after iterations 1 and 3 only
      checkpoint: (i) => ((i + 1) % 2 === 0 ? { bytes: 1, manifest_bytes: 2, write_seconds: 0, manifest_seconds: 0 } : undefined),
      iterate: async (iteration, attempt) => {
        await delay(5);
        if (iteration === 3 && attempt === 0) throw Object.assign(new Error('boom'), { node: 'critic.train' });
        return result();
      },
    });
    s.join();
    await s.finished();
    expect(s.calls.recover.map((i) => i.snapshot)).toEqual([1]);
    expect(s.calls.iteration.map((i) => i.iteration)).toEqual([0, 1, 2, 3, 2, 3]);
    expect(s.recorder.rewind.mock.calls.map(([kept]) => kept.map((m) => m.iteration))).toEqual([[0, 1]]);
    expect(s.recorder.iteration.mock.calls.map(([m]) => m.iteration)).toEqual([0, 1, 2, 2, 3]);
    expect(s.summary()).toMatchObject({ status: 'succeeded', iterations: 4, snapshots: { count: 2 }, recoveries: [{ snapshot: 1, iteration: 2 }] });
  });

  it('a recovery that fails starts over after a backoff, and its reason is what failed', async () => {
    const times: number[] = [];
    const s = startSupervisor({
      iterate: async (iteration, attempt) => {
        await delay(5);
        if (iteration === 1 && attempt === 0) throw Object.assign(new Error('boom'), { node: 'actor.generate' });
        return result();
      },
      recover: async (input, attempt) => {
        times.push(Date.now());
        if (attempt === 0) throw new Error('reset refused');
        return { parameters: { actor: 10 }, snapshot: input.snapshot ?? input.resume?.iteration ?? -1 };
      },
    });
    s.join();
    const snap = await s.finished();
    expect(snap.value).toBe('done');
    expect(s.calls.recover.map((i) => i.snapshot)).toEqual([0, 0]);
    expect(s.dispatcher.interrupts).toEqual(['iteration 1, actor.generate: Error: boom', 'recovery: Error: reset refused']);
    // the first attempt started at once; the second waited 0.25 s first
    expect(times[1]! - times[0]!).toBeGreaterThanOrEqual(240);
    expect(s.summary().recoveries).toEqual([{ epoch: 2, reason: 'recovery: Error: reset refused', snapshot: 0, iteration: 1, seconds: expect.any(Number) }]);
  });

  it('no worker back within recover_seconds: fails naming the device and the failure', async () => {
    const s = startSupervisor({
      spec: spec({ recover: 0.3 }),
      iterate: async (iteration) => (iteration === 1 ? new Promise<IterationResult>(() => {}) : (await delay(5), result())),
    });
    s.join();
    await vi.waitFor(() => expect(s.calls.iteration).toHaveLength(2));
    s.lose(3, 'killed by SIGKILL');
    const snap = await s.finished();
    const error = 'recovery from "device 3 (worker w-3): killed by SIGKILL": no worker for device(s) 3 within 0.3 s (timeouts.recover_seconds)';
    expect(snap.value).toBe('failed');
    expect(snap.output).toEqual({ status: 'failed', error });
    expect(s.calls.recover).toHaveLength(0);
    expect(s.summary()).toMatchObject({ status: 'failed', error, iterations: 1, recoveries: [] });
  });

  it('a worker lost during setup: no snapshot yet, so the recovery sets up from scratch and the run starts at iteration 0', async () => {
    const setting = deferred<{ parameters: Record<string, number> }>();
    const s = startSupervisor({ setup: (attempt) => (attempt === 0 ? setting.promise : Promise.resolve({ parameters: { actor: 10 } })) });
    s.join();
    await vi.waitFor(() => expect(s.calls.setup).toHaveLength(1));
    s.lose(1, 'exited with code 137');
    await waitFor(s.actor, (x) => x.matches({ recovering: 'waiting' }), { timeout: 2000 });
    s.join([1]);
    const snap = await s.finished();
    expect(snap.value).toBe('done');
    expect(s.calls.setup).toHaveLength(1);
    expect(s.calls.recover).toHaveLength(1);
    expect(s.calls.recover[0]!.snapshot).toBeUndefined();
    expect(s.calls.iteration.map((i) => i.iteration)).toEqual([0, 1, 2]);
    expect(s.recorder.rewind.mock.calls).toEqual([[[]]]);
    expect(s.summary()).toMatchObject({ status: 'succeeded', iterations: 3, recoveries: [{ epoch: 1, reason: 'device 1 (worker w-1): exited with code 137', snapshot: -1, iteration: 0 }] });
  });

  // Found by this test: context.iteration is 0 during setup, so a setup failure used to read
  // "iteration 0, setup: …" as though iteration 0 had failed.
  it('a failed setup recovers, and its reason names setup, not an iteration', async () => {
    const s = startSupervisor({
      setup: async (attempt) => {
        if (attempt === 0) throw new Error('warm-up diverged');
        return { parameters: { actor: 10 } };
      },
    });
    s.join();
    const snap = await s.finished();
    expect(snap.value).toBe('done');
    expect(s.calls.recover.map((i) => i.snapshot)).toEqual([undefined]);
    expect(s.dispatcher.interrupts).toEqual(['setup: Error: warm-up diverged']);
  });

  it('trouble on the bus during an iteration recovers without waiting for any worker', async () => {
    const hung = deferred<IterationResult>();
    const s = startSupervisor({ iterate: async (iteration, attempt) => (iteration === 2 && attempt === 0 ? hung.promise : (await delay(5), result())) });
    s.join();
    await vi.waitFor(() => expect(s.calls.iteration).toHaveLength(3));
    s.actor.send({ type: 'bus.trouble', reason: 'the supervisor reconnected to NATS' });
    const snap = await s.finished();
    expect(snap.value).toBe('done');
    expect(s.dispatcher.interrupts).toEqual(['bus: the supervisor reconnected to NATS']);
    expect(s.calls.recover.map((i) => i.snapshot)).toEqual([1]);
    expect(s.calls.iteration.map((i) => i.iteration)).toEqual([0, 1, 2, 2]);
    expect(s.summary().recoveries).toMatchObject([{ reason: 'bus: the supervisor reconnected to NATS', snapshot: 1, iteration: 2 }]);
  });

  it('a resumed run sets up from its checkpoint and goes on after it, keeping the metrics before it', async () => {
    const checkpoint: CheckpointSet = {};
    const s = startSupervisor({ input: { resume: { iteration: 0, checkpoint, history: [pastMetrics(0)] } } });
    s.join();
    const snap = await s.finished();
    expect(snap.value).toBe('done');
    expect(s.calls.setup).toHaveLength(1);
    expect(s.calls.setup[0]!.resume).toBe(checkpoint);
    expect(s.calls.setup[0]!.resumeAfter).toBe(0);
    expect(s.calls.progress[0]).toMatchObject({ iteration: 1, snapshot: 0, history: [pastMetrics(0)] });
    expect(s.calls.iteration.map((i) => i.iteration)).toEqual([1, 2]);
    expect(s.summary()).toMatchObject({ status: 'succeeded', iterations: 3, recoveries: [] });
  });

  it('a run resumed after its last iteration goes straight to finishing', async () => {
    const s = startSupervisor({ input: { resume: { iteration: 2, checkpoint: {}, history: [0, 1, 2].map(pastMetrics) } } });
    s.join();
    const snap = await s.finished();
    expect(snap.value).toBe('done');
    expect(s.calls.setup[0]!.resumeAfter).toBe(2);
    expect(s.calls.iteration).toHaveLength(0);
    expect(s.calls.progress).toHaveLength(0);
    expect(s.calls.digest.map((i) => i.iteration)).toEqual([2]);
    expect(s.summary()).toMatchObject({ status: 'succeeded', iterations: 3, digests: { actor: 'a' } });
  });

  // Found by this test: a resumed run has no snapshot in the store until its setup is done, and a
  // loss during that setup used to set up from scratch, losing the resume (the run started again
  // at iteration 0). Recovery now sets up again from the checkpoint the run resumed from.
  it("a loss during a resumed run's setup goes back to the resumed checkpoint, not to scratch", async () => {
    const setting = deferred<{ parameters: Record<string, number> }>();
    const s = startSupervisor({
      input: { resume: { iteration: 0, checkpoint: {}, history: [pastMetrics(0)] } },
      setup: (attempt) => (attempt === 0 ? setting.promise : Promise.resolve({ parameters: { actor: 10 } })),
    });
    s.join();
    await vi.waitFor(() => expect(s.calls.setup).toHaveLength(1));
    s.lose(0);
    await waitFor(s.actor, (x) => x.matches({ recovering: 'waiting' }), { timeout: 2000 });
    s.join([0]);
    const snap = await s.finished();
    expect(snap.value).toBe('done');
    expect(s.recorder.rewind.mock.calls).toEqual([[[pastMetrics(0)]]]);
    expect(s.calls.iteration.map((i) => i.iteration)).toEqual([1, 2]);
  });
});

describe('supervisor machine: an elastic run', () => {
  const elasticSpec = (extra = '') =>
    runSpec(parseScenario(`${FOUR_DEVICES}rl: { iterations: 4, batch: 8 }\nelastic: { search_seconds: 0.25 }\ntimeouts: { join_seconds: 5, recover_seconds: 5 }\n${extra}`, 'unit.yaml'));

  /** A supervisor of the elastic spec whose iteration `at` waits, its first time, until `gate` opens; returned once that iteration runs. */
  async function holdingIteration(at: number, options: Omit<Options, 'iterate'>) {
    const gate = deferred<void>();
    const s = startSupervisor({
      ...options,
      iterate: async (iteration, attempt) => {
        if (iteration === at && attempt === 0) await gate.promise;
        return result();
      },
    });
    s.join();
    await waitFor(s.actor, () => s.calls.iteration.some((c) => c.iteration === at), { timeout: 5000 });
    return { s, gate };
  }

  it('a device lost for good: the plan searched on the devices left is written ahead, membership told, the run migrated onto it and gone on with; the loss does not count against the intensity', async () => {
    const { s, gate } = await holdingIteration(2, {
      spec: elasticSpec('supervision: { intensity: 0, period_seconds: 60 }'),
    });
    s.actor.send({ type: 'device.lost', device: 3, trigger: 'chaos', reason: 'its worker was killed' });
    // At once, while the plan is searched: the devices left reset, each keeping the shards it holds.
    const models = (device: number) => keptModels(s.spec).filter((m) => layoutOf(s.spec, ownerOf(s.spec, m)).devices.includes(device));
    await waitFor(s.actor, () => s.dispatcher.resets.length === 3, { timeout: 5000 });
    expect(s.calls.migrate).toEqual([]);
    expect(s.dispatcher.resets).toEqual([0, 1, 2].map((device) => ({ device, epoch: 1, keep: models(device) })));
    expect(models(0).length).toBeGreaterThan(0);
    await waitFor(s.actor, () => s.calls.migrate.length === 1, { timeout: 30_000 });
    gate.resolve();
    await s.finished();
    const out = s.summary();
    expect(out.status).toBe('succeeded');
    expect(out.iterations).toBe(4);
    expect(out.lost).toEqual([3]);
    const [r] = out.replans!;
    expect(r).toMatchObject({
      iteration: 2,
      trigger: 'chaos',
      lost: [3],
      reason: 'its worker was killed',
      changed: true,
      migration_bytes: 300,
      migration_minimum_bytes: 100,
      parameters_equal_after_migration: true,
    });
    for (const p of Object.values(r!.plan_after)) expect(p.mesh).not.toMatch(/3/);
    // Written ahead: a progress record with the new plan before the migration started.
    expect(s.calls.progress.find((p) => p.plan)).toMatchObject({ plan: r!.plan_after, lost: [3], iteration: 2, snapshot: 1 });
    expect(s.calls.told).toEqual([{ type: 'need', need: planDevices(s.calls.migrate[0]!.r), lost: [3] }]);
    expect(s.calls.migrate[0]).toMatchObject({ snapshot: 1, lost: [3], devices: planDevices(s.calls.migrate[0]!.r) });
    expect(out.plan).toEqual(r!.plan_after);
    // Iterations 2 and 3 ran again on the new plan, after the snapshot of iteration 1.
    expect(s.calls.iteration.filter((c) => c.iteration >= 2).every((c, i) => i === 0 || c.r === s.calls.migrate[0]!.r)).toBe(true);
  }, 60_000);

  it("an operator's cordon while an iteration runs drains the device: the iteration ends and is snapshotted (whatever checkpoint.every says), then the run re-plans from that snapshot, nothing run again", async () => {
    const cordoned: number[] = [];
    const { s, gate } = await holdingIteration(1, {
      spec: elasticSpec(),
      // No snapshot after an iteration but the last, unless the machine asks for one.
      checkpoint: (iteration, force) => (force || iteration === 3 ? { bytes: 1, manifest_bytes: 2, write_seconds: 0, manifest_seconds: 0 } : undefined),
      input: { onCordoned: (c) => void cordoned.push(c.device) },
    });
    s.actor.send({ type: 'device.lost', device: 2, trigger: 'cordon', reason: 'maintenance' });
    await delay(100);
    // The iteration goes on: nothing interrupted, reset or searched; whoever restarts workers knows already.
    expect(s.actor.getSnapshot().matches({ iterating: 'running' })).toBe(true);
    expect(s.dispatcher.interrupts).toEqual([]);
    expect(s.dispatcher.resets).toEqual([]);
    expect(cordoned).toEqual([2]);
    gate.resolve();
    await s.finished();
    const out = s.summary();
    expect(out.status).toBe('succeeded');
    expect(out.lost).toEqual([2]);
    // Its snapshot was taken (forced), and the re-plan went on from it: iteration 1 ran once.
    expect(s.calls.checkpoint.map((c) => [c.iteration, c.force])).toEqual([
      [0, false],
      [1, true],
      [2, false],
      [3, false],
    ]);
    expect(out.replans).toHaveLength(1);
    expect(out.replans![0]).toMatchObject({ iteration: 2, trigger: 'cordon', lost: [2], reason: 'maintenance', changed: true });
    expect(s.calls.migrate).toHaveLength(1);
    expect(s.calls.migrate[0]).toMatchObject({ snapshot: 1, lost: [2] });
    expect(s.calls.iteration.map((c) => c.iteration)).toEqual([0, 1, 2, 3]);
    expect(s.dispatcher.interrupts).toEqual(['re-planning: maintenance']);
    // Told once, when the cordon came.
    expect(cordoned).toEqual([2]);
  }, 60_000);

  it('a device being drained whose worker is lost: the re-plan starts at once, from the last snapshot, and the loss does not count against the intensity', async () => {
    const { s, gate } = await holdingIteration(1, {
      spec: elasticSpec('supervision: { intensity: 0, period_seconds: 60 }'),
    });
    s.actor.send({ type: 'device.lost', device: 2, trigger: 'cordon', reason: 'maintenance' });
    await delay(50);
    expect(s.dispatcher.interrupts).toEqual([]);
    s.lose(2);
    await waitFor(s.actor, () => s.calls.migrate.length === 1, { timeout: 30_000 });
    expect(s.dispatcher.interrupts).toEqual(['re-planning: maintenance']);
    expect(s.calls.migrate[0]).toMatchObject({ snapshot: 0, lost: [2] });
    gate.resolve();
    await s.finished();
    const out = s.summary();
    expect(out.status).toBe('succeeded');
    expect(out.replans![0]).toMatchObject({ iteration: 1, trigger: 'cordon', lost: [2], reason: 'maintenance' });
    expect(s.calls.iteration.map((c) => c.iteration)).toEqual([0, 1, 1, 2, 3]);
  }, 60_000);

  it('a loss that no plan on the devices left survives ends the run, naming the model and the memory it needs', async () => {
    // LLaMA-2 7B trained with Adam on two 80 GB GPUs: on the one left it does not fit.
    const big = runSpec(
      parseScenario(
        'seed: 1\ncluster: { nodes: 1, devices_per_node: 2, device: h100-80gb }\nmodels: { actor: llama2-7b }\nalgorithm: { name: grpo, group: 2 }\nplan:\n  actor.train: { mesh: "0:0-1", tp: 2 }\n  actor.generate: { mesh: "0:0-1", tp: 2 }\n  reference.inference: { mesh: "0:0-1", tp: 2 }\n  reward.inference: { mesh: "0:0" }\nrl: { iterations: 3, batch: 8 }\nelastic: { search_seconds: 0.25 }\n',
        'unit.yaml',
      ),
    );
    const gate = deferred<IterationResult>();
    const s = startSupervisor({ spec: big, iterate: () => gate.promise });
    s.join();
    await waitFor(s.actor, () => s.calls.iteration.length === 1, { timeout: 5000 });
    s.actor.send({ type: 'device.lost', device: 1, trigger: 'intensity', reason: 'its worker kept failing' });
    await s.finished();
    const out = s.summary();
    expect(out.status).toBe('failed');
    expect(out.error).toMatch(/^re-planning: ReplanError: no plan fits the 1 device\(s\) left \(0\) after losing 1: .*needs [\d.]+ GB on a device of 80 GB/);
    expect(s.calls.migrate).toEqual([]);
  }, 60_000);
});
