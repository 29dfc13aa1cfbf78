// A worker: the process that is one device. It joins a run, then serves calls on its device's
// subject one at a time, but for one call marked `beside` that may run next to the running one
// (the next policy version filled in while a generation goes on: engine/device/beside.ts); the two
// are the machine's two parallel regions, `main` and `side`. A call its state does not allow gets a typed error and changes nothing;
// a call it has already answered (same id) gets the same answer again, so a retry is harmless;
// bytes that do not decode are reported with their subject, and the worker keeps serving.
import { assign, fromCallback, fromPromise, not, setup } from 'xstate';
import { PROTOCOL_VERSION, type Call, type ErrorCode, type Reply } from '../mesh/wire/index.ts';
import type { ProtocolError } from '../mesh/wire/index.ts';
import { BESIDE_FNS, CallRejected, besideProblem, type Device } from '../engine/device/index.ts';

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
  /** The call running beside it, if any (same shape). */
  beside?: { call: Call; respond: Respond[] };
  /** Replies to recent calls by id, to answer a repeated call without running it again. */
  answered: Map<string, Reply>;
  /** The epoch of the last reset: calls of an earlier epoch are abandoned work, refused. */
  epoch: number;
  error?: string;
}

const REMEMBERED = 64;

const resultReply = (call: Call, out: { body: unknown; ms: number }): Reply => ({ type: 'result', v: PROTOCOL_VERSION, id: call.id, body: out.body as Record<string, unknown>, ms: out.ms });

const failureReply = (call: Call, e: unknown): Reply => errorReply(call.id, e instanceof CallRejected ? e.code : 'failed', e instanceof Error ? `${e.name}: ${e.message}` : String(e));

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
    isCurrentBeside: ({ context, event }) => event.type === 'call' && context.beside?.call.id === event.call.id,
    /** A call for the side region (the main region leaves it alone, and the other way round). */
    isBeside: ({ event }) => event.type === 'call' && event.call.beside === true && event.call.body.fn !== 'reset',
    /** A call marked beside that no call may be (only load, realloc and release may). */
    notBesideKind: ({ event }) => event.type === 'call' && !(BESIDE_FNS as readonly string[]).includes(event.call.body.fn),
    /** The call cannot run next to the one in the other region. */
    clashes: ({ context, event }) => {
      if (event.type !== 'call') return false;
      const other = event.call.beside ? context.current : context.beside;
      return other !== undefined && besideProblem(other.call, event.call) !== undefined;
    },
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
      const running = context.current?.call ?? context.beside?.call;
      const why = `device ${context.index} was reset for recovery ${event.call.body.epoch}`;
      for (const lane of [context.current, context.beside]) {
        for (const respond of lane?.respond ?? []) respond(errorReply(lane!.call.id, 'interrupted', `${why} while running call ${lane!.call.id}`));
      }
      const { dropped, kept, busy } = context.device!.reset(why, event.call.body.keep, event.call.body.epoch);
      const waiting = busy.length ? `; ${busy.join(', ')} still busy` : '';
      context.log(`${why}${running ? `, abandoning call ${running.id}` : ''}; dropped ${dropped.join(', ') || 'nothing'}; kept ${kept.map((k) => k.model).join(', ') || 'nothing'}${waiting}`);
      event.respond({ type: 'result', v: PROTOCOL_VERSION, id: event.call.id, body: { dropped, kept, busy, ...(running ? { interrupted: running.id } : {}) } });
      return { current: undefined, beside: undefined, answered: new Map<string, Reply>(), epoch: Math.max(context.epoch, event.call.body.epoch) };
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
    refuseBesideKind: ({ context, event }) => {
      if (event.type !== 'call') return;
      event.respond(
        errorReply(event.call.id, 'unsupported', `call ${event.call.id}: '${event.call.body.fn}' cannot run beside another call on device ${context.index} (only ${BESIDE_FNS.join(', ')} can)`),
      );
    },
    refuseBusy: ({ context, event }) => {
      if (event.type !== 'call') return;
      const running = [context.current, context.beside].flatMap((lane) => (lane ? [lane.call] : []));
      const clash = event.call.beside ? running.map((c) => besideProblem(c, event.call)).find((p) => p !== undefined) : undefined;
      const what = running.map((c) => `call ${c.id} (${c.body.fn} of ${c.model})`).join(' and ');
      event.respond(errorReply(event.call.id, 'busy', `device ${context.index} is running ${what}${clash ? `: ${clash}` : ''}`));
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
    joinBeside: ({ context, event }) => {
      if (event.type === 'call') context.beside!.respond.push(event.respond);
    },
    finishCall: assign(({ context }, params: { reply: Reply; lane?: 'current' | 'beside' }) => {
      const lane = params.lane ?? 'current';
      for (const respond of context[lane]!.respond) respond(params.reply);
      const answered = new Map(context.answered);
      // Only results are remembered: a retry after a failure (a timeout, a lost peer) runs again.
      if (params.reply.type === 'result') answered.set(context[lane]!.call.id, params.reply);
      if (answered.size > REMEMBERED) answered.delete(answered.keys().next().value!);
      return { answered, [lane]: undefined };
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
      type: 'parallel',
      states: {
        main: {
          initial: 'idle',
          states: {
            idle: {
              on: {
                call: [
                  { guard: 'isReset', actions: 'resetDevice' },
                  { guard: 'isBeside' },
                  { guard: 'stale', actions: 'refuseStale' },
                  { guard: 'answeredBefore', actions: 'replyAgain' },
                  { guard: 'refused', actions: 'refuse' },
                  { guard: 'clashes', actions: 'refuseBusy' },
                  { target: 'busy', actions: assign({ current: ({ event }) => ({ call: event.call, respond: [event.respond] }) }) },
                ],
              },
            },
            busy: {
              on: {
                call: [
                  { guard: 'isReset', target: 'idle', actions: 'resetDevice' },
                  { guard: 'isBeside' },
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
                    actions: { type: 'finishCall', params: ({ context, event }) => ({ reply: resultReply(context.current!.call, event.output) }) },
                  },
                  { target: 'idle', actions: { type: 'finishCall', params: ({ context, event }) => ({ reply: resultReply(context.current!.call, event.output) }) } },
                ],
                onError: {
                  target: 'idle',
                  actions: [
                    ({ context, event }) => context.log(`call ${context.current!.call.id} failed: ${(event.error as Error).stack ?? event.error}`),
                    { type: 'finishCall', params: ({ context, event }) => ({ reply: failureReply(context.current!.call, event.error) }) },
                  ],
                },
              },
            },
          },
        },
        side: {
          initial: 'idle',
          states: {
            idle: {
              on: {
                call: [
                  // A reset is the main region's to answer; a call not marked beside too.
                  { guard: 'isReset' },
                  { guard: not('isBeside') },
                  { guard: 'notBesideKind', actions: 'refuseBesideKind' },
                  { guard: 'stale', actions: 'refuseStale' },
                  { guard: 'answeredBefore', actions: 'replyAgain' },
                  { guard: 'refused', actions: 'refuse' },
                  { guard: 'clashes', actions: 'refuseBusy' },
                  { target: 'busy', actions: assign({ beside: ({ event }) => ({ call: event.call, respond: [event.respond] }) }) },
                ],
              },
            },
            busy: {
              on: {
                call: [
                  // The reset (answered by the main region) abandons this call too.
                  { guard: 'isReset', target: 'idle' },
                  { guard: not('isBeside') },
                  { guard: 'notBesideKind', actions: 'refuseBesideKind' },
                  { guard: 'stale', actions: 'refuseStale' },
                  { guard: 'answeredBefore', actions: 'replyAgain' },
                  { guard: 'isCurrentBeside', actions: 'joinBeside' },
                  { actions: 'refuseBusy' },
                ],
              },
              invoke: {
                src: 'runCall',
                input: ({ context }) => ({ device: context.device!, call: context.beside!.call, beforeRun: context.beforeRun }),
                onDone: {
                  target: 'idle',
                  actions: { type: 'finishCall', params: ({ context, event }) => ({ reply: resultReply(context.beside!.call, event.output), lane: 'beside' as const }) },
                },
                onError: {
                  target: 'idle',
                  actions: [
                    ({ context, event }) => context.log(`call ${context.beside!.call.id} (beside) failed: ${(event.error as Error).stack ?? event.error}`),
                    { type: 'finishCall', params: ({ context, event }) => ({ reply: failureReply(context.beside!.call, event.error), lane: 'beside' as const }) },
                  ],
                },
              },
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
