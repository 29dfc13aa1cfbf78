// A worker: the process that is one device. It joins a run, then serves calls on its device's
// subject one at a time. A call its state does not allow gets a typed error and changes nothing;
// a call it has already answered (same id) gets the same answer again, so a retry is harmless;
// bytes that do not decode are reported with their subject, and the worker keeps serving.
import { assign, fromCallback, fromPromise, setup } from 'xstate';
import { PROTOCOL_VERSION, type Call, type ErrorCode, type Reply } from '../mesh/wire/index.ts';
import type { ProtocolError } from '../mesh/wire/index.ts';
import { CallRejected, type Device } from '../engine/device/index.ts';

export type Respond = (reply: Reply) => void;

export type WorkerEvent = { type: 'call'; call: Call; respond: Respond } | { type: 'malformed'; error: ProtocolError; respond?: Respond } | { type: 'stop' };

export interface WorkerInput {
  worker: string;
  /** Builds the device once the run has assigned an index. */
  makeDevice: (index: number) => Device;
  log: (line: string) => void;
  /** Tells the run's observers about a message this worker rejected (on its heartbeat; the supervisor says it on the events). */
  reportRejected?: (problem: string) => void;
  /** Runs as a call starts, before the device does anything (chaos testing's kill points). */
  beforeRun?: (call: Call, device: number) => Promise<void>;
}

interface Context extends WorkerInput {
  index: number;
  device?: Device;
  /** The call running now, and everyone waiting for its reply (a retry joins the first asker). */
  current?: { call: Call; respond: Respond[] };
  /** Replies to recent calls by id, to answer a repeated call without running it again. */
  answered: Map<string, Reply>;
  /** The epoch of the last reset: calls of an earlier epoch are abandoned work, refused. */
  epoch: number;
  error?: string;
}

const REMEMBERED = 64;

const errorReply = (id: string | undefined, code: ErrorCode, message: string, subject?: string): Reply => ({
  type: 'error',
  v: PROTOCOL_VERSION,
  ...(id === undefined ? {} : { id }),
  code,
  message,
  ...(subject === undefined ? {} : { subject }),
});

export const workerMachine = setup({
  types: {
    context: {} as Context,
    events: {} as WorkerEvent,
    input: {} as WorkerInput,
    output: {} as { error?: string },
  },
  actors: {
    /** Asks the run for a device; resolves with its index. Provided by the process host. */
    join: fromPromise<number, { worker: string }>(async () => {
      throw new Error('join is provided by the host');
    }),
    /** The device's call subscription; provided by the host. */
    callListener: fromCallback<WorkerEvent, { index: number }>(() => () => {}),
    /** Liveness beacons; provided by the host. */
    heartbeat: fromCallback<WorkerEvent, { index: number; worker: string }>(() => () => {}),
    runCall: fromPromise(async ({ input }: { input: { device: Device; call: Call; beforeRun?: WorkerInput['beforeRun'] } }) => {
      await input.beforeRun?.(input.call, input.device.index);
      const t0 = performance.now();
      const body = await input.device.run(input.call);
      return { body, ms: performance.now() - t0 };
    }),
  },
  guards: {
    refused: ({ context, event }) => event.type === 'call' && context.device!.check(event.call) !== undefined,
    answeredBefore: ({ context, event }) => event.type === 'call' && context.answered.has(event.call.id),
    isCurrent: ({ context, event }) => event.type === 'call' && context.current?.call.id === event.call.id,
    wasShutdown: ({ context }) => context.current?.call.body.fn === 'shutdown',
    isReset: ({ event }) => event.type === 'call' && event.call.body.fn === 'reset',
    stale: ({ context, event }) => event.type === 'call' && event.call.epoch !== undefined && event.call.epoch < context.epoch,
  },
  actions: {
    /**
     * A reset preempts whatever runs: the running call's askers hear `interrupted`, the device
     * drops its shards (the abandoned computation fails at its next step) but the ones it is told
     * to keep and nothing is running on, and remembered answers go, so that nothing from before
     * the reset is ever answered after it.
     */
    resetDevice: assign(({ context, event }) => {
      if (event.type !== 'call' || event.call.body.fn !== 'reset') return {};
      const running = context.current?.call;
      const why = `device ${context.index} was reset for recovery ${event.call.body.epoch}`;
      if (running) for (const respond of context.current!.respond) respond(errorReply(running.id, 'interrupted', `${why} while running call ${running.id}`));
      const { dropped, kept, busy } = context.device!.reset(why, event.call.body.keep, event.call.body.epoch);
      const waiting = busy.length ? `; ${busy.join(', ')} still busy` : '';
      context.log(`${why}${running ? `, abandoning call ${running.id}` : ''}; dropped ${dropped.join(', ') || 'nothing'}; kept ${kept.map((k) => k.model).join(', ') || 'nothing'}${waiting}`);
      event.respond({ type: 'result', v: PROTOCOL_VERSION, id: event.call.id, body: { dropped, kept, busy, ...(running ? { interrupted: running.id } : {}) } });
      return { current: undefined, answered: new Map<string, Reply>(), epoch: Math.max(context.epoch, event.call.body.epoch) };
    }),
    refuseStale: ({ context, event }) => {
      if (event.type !== 'call') return;
      context.log(`refused call ${event.call.id}: it belongs to epoch ${event.call.epoch}, and this device was reset for epoch ${context.epoch}`);
      event.respond(errorReply(event.call.id, 'interrupted', `call ${event.call.id} belongs to epoch ${event.call.epoch}; device ${context.index} was reset for epoch ${context.epoch}`));
    },
    replyAgain: ({ context, event }) => {
      if (event.type === 'call') event.respond(context.answered.get(event.call.id)!);
    },
    refuse: ({ context, event }) => {
      if (event.type !== 'call') return;
      const r = context.device!.check(event.call)!;
      context.log(`refused call ${event.call.id} (${event.call.body.fn} of ${event.call.model}): ${r.message}`);
      event.respond(errorReply(event.call.id, r.code, r.message));
    },
    refuseBusy: ({ context, event }) => {
      if (event.type !== 'call') return;
      const busy = context.current!.call;
      event.respond(errorReply(event.call.id, 'busy', `device ${context.index} is running call ${busy.id} (${busy.body.fn} of ${busy.model})`));
    },
    reportMalformed: ({ context, event }) => {
      if (event.type !== 'malformed') return;
      context.log(`rejected: ${event.error.message}`);
      context.reportRejected?.(event.error.message);
      event.respond?.(errorReply(undefined, 'malformed', event.error.problem, event.error.subject));
    },
    joinCurrent: ({ context, event }) => {
      if (event.type === 'call') context.current!.respond.push(event.respond);
    },
    finishCall: assign(({ context }, params: { reply: Reply }) => {
      for (const respond of context.current!.respond) respond(params.reply);
      const answered = new Map(context.answered);
      // Only results are remembered: a retry after a failure (a timeout, a lost peer) runs again.
      if (params.reply.type === 'result') answered.set(context.current!.call.id, params.reply);
      if (answered.size > REMEMBERED) answered.delete(answered.keys().next().value!);
      return { answered, current: undefined };
    }),
  },
}).createMachine({
  id: 'worker',
  context: ({ input }) => ({ ...input, index: -1, answered: new Map(), epoch: 0 }),
  initial: 'joining',
  states: {
    joining: {
      on: { stop: { target: 'stopped' } },
      invoke: {
        src: 'join',
        input: ({ context }) => ({ worker: context.worker }),
        onDone: {
          target: 'serving',
          actions: assign(({ context, event }) => ({ index: event.output, device: context.makeDevice(event.output) })),
        },
        onError: {
          target: 'failed',
          actions: assign({ error: ({ event }) => `could not join: ${(event.error as Error).message}` }),
        },
      },
    },
    serving: {
      invoke: [
        { src: 'callListener', input: ({ context }) => ({ index: context.index }) },
        { src: 'heartbeat', input: ({ context }) => ({ index: context.index, worker: context.worker }) },
      ],
      on: {
        malformed: { actions: 'reportMalformed' },
        stop: { target: 'stopped' },
      },
      initial: 'idle',
      states: {
        idle: {
          on: {
            call: [
              { guard: 'isReset', actions: 'resetDevice' },
              { guard: 'stale', actions: 'refuseStale' },
              { guard: 'answeredBefore', actions: 'replyAgain' },
              { guard: 'refused', actions: 'refuse' },
              { target: 'busy', actions: assign({ current: ({ event }) => ({ call: event.call, respond: [event.respond] }) }) },
            ],
          },
        },
        busy: {
          on: {
            call: [
              { guard: 'isReset', target: 'idle', actions: 'resetDevice' },
              { guard: 'stale', actions: 'refuseStale' },
              { guard: 'answeredBefore', actions: 'replyAgain' },
              // The same call again while it runs (a retry): it gets the one reply too.
              { guard: 'isCurrent', actions: 'joinCurrent' },
              { actions: 'refuseBusy' },
            ],
          },
          invoke: {
            src: 'runCall',
            input: ({ context }) => ({ device: context.device!, call: context.current!.call, beforeRun: context.beforeRun }),
            onDone: [
              {
                guard: 'wasShutdown',
                target: '#worker.stopped',
                actions: {
                  type: 'finishCall',
                  params: ({ context, event }) => ({ reply: { type: 'result', v: PROTOCOL_VERSION, id: context.current!.call.id, body: event.output.body, ms: event.output.ms } }),
                },
              },
              {
                target: 'idle',
                actions: {
                  type: 'finishCall',
                  params: ({ context, event }) => ({ reply: { type: 'result', v: PROTOCOL_VERSION, id: context.current!.call.id, body: event.output.body, ms: event.output.ms } }),
                },
              },
            ],
            onError: {
              target: 'idle',
              actions: [
                ({ context, event }) => context.log(`call ${context.current!.call.id} failed: ${(event.error as Error).stack ?? event.error}`),
                {
                  type: 'finishCall',
                  params: ({ context, event }) => {
                    const e = event.error;
                    const code: ErrorCode = e instanceof CallRejected ? e.code : 'failed';
                    return { reply: errorReply(context.current!.call.id, code, e instanceof Error ? `${e.name}: ${e.message}` : String(e)) };
                  },
                },
              ],
            },
          },
        },
      },
    },
    stopped: { type: 'final' },
    failed: { type: 'final' },
  },
  output: ({ context }) => ({ error: context.error }),
});
