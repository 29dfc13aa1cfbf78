// How a supervisor reaches devices. The same supervisor machine runs over NATS (actors/
// bus-dispatcher.ts) or in one process (local-dispatch.ts, for benchmarks and tests): the
// arithmetic is identical, only the transport differs.
import { ResultBodies, type CallFn, type CallOf, type ResultOf, type TensorManifest } from '../mesh/protocol.ts';

export class CallError extends Error {
  override name = 'CallError';
  constructor(
    readonly code: string,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

export interface Dispatcher {
  call<F extends CallFn>(device: number, model: string, iteration: number, body: CallOf<F>): Promise<ResultOf<F>>;
  /** Copies the named tensors of `from`'s model into `to`'s model (a parameter transfer). */
  transfer(t: {
    id: string;
    iteration: number;
    from: { device: number; model: string };
    to: { device: number; model: string };
    manifest: TensorManifest[];
  }): Promise<ResultOf<'recv_params'>>;
  close(): Promise<void>;
  /** Where call time went, for transports that can tell (the bus). */
  stats?(): TransportStats;
}

export interface TransportStats {
  calls: number;
  /** Seconds from sending calls to having their replies, summed. */
  round_trip_seconds: number;
  /** Seconds the devices spent running those calls, summed; the rest is transport and queueing. */
  device_seconds: number;
}

/** Checks a reply body against the call's result schema. */
export function checkResult<F extends CallFn>(fn: F, body: unknown, where: string): ResultOf<F> {
  const parsed = ResultBodies[fn].safeParse(body);
  if (!parsed.success) throw new CallError('malformed', `${where}: reply to '${fn}' does not match its schema: ${parsed.error.message}`);
  return parsed.data as ResultOf<F>;
}

/** Runs calls one at a time per device, as a device does. */
export class PerDeviceQueue {
  private readonly tails = new Map<number, Promise<unknown>>();
  run<T>(device: number, job: () => Promise<T>): Promise<T> {
    const prev = this.tails.get(device) ?? Promise.resolve();
    const next = prev.then(job, job);
    this.tails.set(device, next.catch(() => {}));
    return next;
  }
}
