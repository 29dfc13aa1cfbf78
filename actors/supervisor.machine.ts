// The supervisor: one XState machine that gathers a worker for every device, sets the models up,
// then walks each PPO iteration call group by call group (generate → inference → train), and
// finally collects digests and stops the workers. Each stage is an invoked promise actor; a
// failure anywhere is an event that ends in `failed` with the error, never an exception that
// escapes. The transport is the Dispatcher in the input: NATS in a run, memory in a benchmark.
import { assign, fromCallback, fromPromise, setup } from 'xstate';
import type { Metrics } from '../mesh/protocol.ts';
import type { Dispatcher } from '../engine/dispatch.ts';
import { median, rewardWindows, type Recorder, type Summary } from '../engine/record.ts';
import {
  takeCheckpoint,
  type CheckpointSet,
  finalDigests,
  generateStage,
  inferStage,
  planDevices,
  setupModels,
  trainStage,
  type Rollout,
  type RunSpec,
  type Scored,
  type Trained,
} from '../engine/rlhf.ts';

export interface SupervisorInput {
  spec: RunSpec;
  run: string;
  dispatcher: Dispatcher;
  recorder: Recorder;
  /** Where checkpoints go after each iteration (every `checkpoint.every`); none when absent. */
  saveCheckpoint?: (iteration: number, set: CheckpointSet) => Promise<void>;
  /** Continue a run: its last checkpoint, the iteration it was taken after, and the metrics so far. */
  resume?: { iteration: number; checkpoint: CheckpointSet; history: Metrics[] };
  /** Backends of workers that joined before the machine started (in-process runs). */
  backends?: string[];
}

export type SupervisorEvent =
  | { type: 'interrupt'; reason: string }
  | { type: 'worker.joined'; device: number; worker: string; backend: string }
  | { type: 'worker.left'; device: number; worker: string; reason: string };

interface Context extends SupervisorInput {
  need: number[];
  joined: Record<number, { worker: string; backend: string }>;
  iteration: number;
  startedAt: number;
  iterationStartedAt: number;
  rollout?: Rollout;
  scored?: Scored;
  history: Metrics[];
  parameters: Record<string, number>;
  digests: Record<string, string>;
  error?: string;
}

type StageInput = { d: Dispatcher; r: RunSpec; iteration: number; rollout?: Rollout; scored?: Scored };

const errorText = (e: unknown) => (e instanceof Error ? `${e.name}: ${e.message}` : String(e));

export const supervisorMachine = setup({
  types: {
    context: {} as Context,
    events: {} as SupervisorEvent,
    input: {} as SupervisorInput,
    output: {} as { status: 'succeeded' | 'failed'; error?: string },
  },
  actors: {
    /** Answers workers' join requests; the process host provides the NATS version. */
    gatherWorkers: fromCallback<SupervisorEvent, { need: number[] }>(() => () => {}),
    setupModels: fromPromise(({ input }: { input: StageInput & { resume?: CheckpointSet } }) => setupModels(input.d, input.r, input.resume)),
    checkpoint: fromPromise(async ({ input }: { input: StageInput & { save?: SupervisorInput['saveCheckpoint'] } }) => {
      const every = input.r.scenario.checkpoint.every;
      const last = input.iteration + 1 === input.r.scenario.ppo.iterations;
      if (!input.save || every === 0 || ((input.iteration + 1) % every !== 0 && !last)) return;
      await input.save(input.iteration, await takeCheckpoint(input.d, input.r, input.iteration));
    }),
    generate: fromPromise(({ input }: { input: StageInput }) => generateStage(input.d, input.r, input.iteration)),
    infer: fromPromise(({ input }: { input: StageInput }) => inferStage(input.d, input.r, input.rollout!)),
    train: fromPromise(({ input }: { input: StageInput }) => trainStage(input.d, input.r, input.rollout!, input.scored!)),
    finish: fromPromise(async ({ input }: { input: StageInput }) => {
      const digests = await finalDigests(input.d, input.r, input.iteration);
      await Promise.all(planDevices(input.r).map((dev) => input.d.call(dev, '*', input.iteration, { fn: 'shutdown' })));
      return digests;
    }),
  },
  guards: {
    allJoined: ({ context }) => context.need.every((d) => context.joined[d] !== undefined),
    moreIterations: ({ context }) => context.iteration + 1 < context.spec.scenario.ppo.iterations,
    nothingLeft: ({ context }) => context.iteration >= context.spec.scenario.ppo.iterations,
  },
  delays: {
    joinTimeout: ({ context }) => context.spec.scenario.timeouts.join_seconds * 1000,
  },
  actions: {
    fail: assign((_, params: { stage: string; error: unknown }) => ({
      error: `${params.stage}: ${errorText(params.error)}`,
    })),
    phase: ({ context }, params: { phase: string; detail: string }) => context.recorder.phase(params.phase, params.detail),
    recordIteration: assign(({ context }, trained: Trained) => {
      const seconds = (Date.now() - context.iterationStartedAt) / 1000;
      const tokens = context.rollout!.batch * context.spec.task.responseLen;
      const moved = context.rollout!.moved;
      const metrics: Metrics = {
        iteration: context.iteration,
        ...trained,
        seconds,
        tokens,
        tokens_per_second: tokens / seconds,
        realloc_seconds: moved.reduce((a, m) => a + m.seconds, 0),
        realloc_bytes: moved.reduce((a, m) => a + m.bytes, 0),
      };
      context.recorder.iteration(metrics, context.spec.scenario.ppo.iterations);
      return { history: [...context.history, metrics], rollout: undefined, scored: undefined };
    }),
    writeSummary: ({ context }) => {
      const s = context.spec.scenario;
      const windows = rewardWindows(context.history);
      const backends = [...new Set([...(context.backends ?? []), ...Object.values(context.joined).map((j) => j.backend)])];
      const summary: Summary = {
        status: context.error ? 'failed' : 'succeeded',
        scenario: s.name ?? 'scenario',
        run: context.run,
        iterations: context.history.length,
        seed: s.seed,
        backend: backends.join(',') || 'unknown',
        plan: Object.fromEntries(Object.values(context.spec.plan).map((p) => [p.call, { mesh: p.mesh, dp: p.dp, tp: p.tp, pp: p.pp }])),
        reward_first5: windows.first5,
        reward_last5: windows.last5,
        digests: context.digests,
        wall_seconds: (Date.now() - context.startedAt) / 1000,
        tokens_per_second: median(context.history.map((m) => m.tokens_per_second)),
        parameters: context.parameters,
        ...(context.dispatcher.stats ? { transport: context.dispatcher.stats() } : {}),
        ...(context.error ? { error: context.error } : {}),
      };
      context.recorder.finished(summary);
    },
  },
}).createMachine({
  id: 'supervisor',
  context: ({ input }) => ({
    ...input,
    need: planDevices(input.spec),
    joined: {},
    iteration: input.resume ? input.resume.iteration + 1 : 0,
    startedAt: Date.now(),
    iterationStartedAt: Date.now(),
    history: input.resume?.history ?? [],
    parameters: {},
    digests: {},
  }),
  initial: 'gathering',
  // Ctrl-C or a stop request: the run ends as failed, and its summary says why.
  on: {
    interrupt: { target: '#supervisor.failed', actions: assign({ error: ({ event }) => `interrupted: ${event.reason}` }) },
  },
  states: {
    gathering: {
      entry: { type: 'phase', params: { phase: 'gathering', detail: 'waiting for a worker on every device' } },
      invoke: { src: 'gatherWorkers', input: ({ context }) => ({ need: context.need }) },
      always: { guard: 'allJoined', target: 'settingUp' },
      on: {
        'worker.joined': {
          actions: assign({
            joined: ({ context, event }) => ({ ...context.joined, [event.device]: { worker: event.worker, backend: event.backend } }),
          }),
        },
      },
      after: {
        joinTimeout: {
          target: 'failed',
          actions: assign({
            error: ({ context }) => {
              const missing = context.need.filter((d) => context.joined[d] === undefined);
              return `no worker joined for device(s) ${missing.join(', ')} within ${context.spec.scenario.timeouts.join_seconds} s`;
            },
          }),
        },
      },
    },
    settingUp: {
      entry: { type: 'phase', params: { phase: 'setup', detail: 'loading models, warm-up, copying the reference and critic' } },
      invoke: {
        src: 'setupModels',
        input: ({ context }) => ({ d: context.dispatcher, r: context.spec, iteration: -1, resume: context.resume?.checkpoint }),
        onDone: [
          // Resumed from the last iteration's checkpoint: nothing is left to train.
          { guard: 'nothingLeft', target: 'finishing', actions: assign({ parameters: ({ event }) => event.output.parameters, iteration: ({ context }) => context.iteration - 1 }) },
          { target: 'iterating', actions: assign({ parameters: ({ event }) => event.output.parameters }) },
        ],
        onError: { target: 'failed', actions: { type: 'fail', params: ({ event }) => ({ stage: 'setup', error: event.error }) } },
      },
    },
    iterating: {
      initial: 'generating',
      entry: { type: 'phase', params: { phase: 'ppo', detail: 'iterating' } },
      states: {
        generating: {
          entry: assign({ iterationStartedAt: () => Date.now() }),
          invoke: {
            src: 'generate',
            input: ({ context }) => ({ d: context.dispatcher, r: context.spec, iteration: context.iteration }),
            onDone: { target: 'inferring', actions: assign({ rollout: ({ event }) => event.output }) },
            onError: { target: '#supervisor.failed', actions: { type: 'fail', params: ({ context, event }) => ({ stage: `iteration ${context.iteration}, generate`, error: event.error }) } },
          },
        },
        inferring: {
          invoke: {
            src: 'infer',
            input: ({ context }) => ({ d: context.dispatcher, r: context.spec, iteration: context.iteration, rollout: context.rollout }),
            onDone: { target: 'training', actions: assign({ scored: ({ event }) => event.output }) },
            onError: { target: '#supervisor.failed', actions: { type: 'fail', params: ({ context, event }) => ({ stage: `iteration ${context.iteration}, inference`, error: event.error }) } },
          },
        },
        training: {
          invoke: {
            src: 'train',
            input: ({ context }) => ({
              d: context.dispatcher,
              r: context.spec,
              iteration: context.iteration,
              rollout: context.rollout,
              scored: context.scored,
            }),
            onDone: { target: 'iterationDone', actions: { type: 'recordIteration', params: ({ event }) => event.output } },
            onError: { target: '#supervisor.failed', actions: { type: 'fail', params: ({ context, event }) => ({ stage: `iteration ${context.iteration}, train`, error: event.error }) } },
          },
        },
        iterationDone: {
          invoke: {
            src: 'checkpoint',
            input: ({ context }) => ({ d: context.dispatcher, r: context.spec, iteration: context.iteration, save: context.saveCheckpoint }),
            onDone: { target: 'advancing' },
            onError: { target: '#supervisor.failed', actions: { type: 'fail', params: ({ context, event }) => ({ stage: `iteration ${context.iteration}, checkpoint`, error: event.error }) } },
          },
        },
        advancing: {
          always: [
            { guard: 'moreIterations', target: 'generating', actions: assign({ iteration: ({ context }) => context.iteration + 1 }) },
            { target: '#supervisor.finishing' },
          ],
        },
      },
    },
    finishing: {
      entry: { type: 'phase', params: { phase: 'finishing', detail: 'collecting digests, stopping workers' } },
      invoke: {
        src: 'finish',
        input: ({ context }) => ({ d: context.dispatcher, r: context.spec, iteration: context.iteration }),
        onDone: { target: 'done', actions: assign({ digests: ({ event }) => event.output }) },
        onError: { target: 'failed', actions: { type: 'fail', params: ({ event }) => ({ stage: 'finishing', error: event.error }) } },
      },
    },
    done: { type: 'final', entry: 'writeSummary' },
    failed: { type: 'final', entry: 'writeSummary' },
  },
  output: ({ context }) => ({ status: context.error ? 'failed' : 'succeeded', error: context.error }),
});
