// The supervisor's side of the bus: calls go to `dev.<n>.call` as requests, one at a time per
// device; reallocations follow runRealloc (engine/dispatch.ts), so that every destination is
// subscribed before a source publishes a byte.
import type { NatsConnection } from '@nats-io/transport-node';
import { BusError, requestChecked } from '../../../mesh/wire/index.ts';
import { ProtocolError } from '../../../mesh/wire/index.ts';
import { PROTOCOL_VERSION, Reply, type CallFn, type CallOf, type Checkpoint, type ResultOf, type TurnLog, type SampleLog } from '../../../mesh/wire/index.ts';
import type { Subjects } from '../../../mesh/wire/index.ts';
import {
  CallError,
  InFlight,
  PerDeviceQueue,
  checkResult,
  exchangeId,
  fetchCheckpoint,
  listenTurns,
  listenSamples,
  pushCheckpoint,
  type CallOptions,
  type RestoreOptions,
  runRealloc,
  type Dispatcher,
  type ReallocOutcome,
  type ReallocRequest,
  type TransportStats,
} from './dispatch.ts';

export interface BusDispatcherOptions {
  /** The epoch to start in: a supervisor that takes over a run starts past its predecessor's. */
  epoch?: number;
  /** Runs before each call is sent (chaos testing's kill points for the supervisor). */
  beforeCall?: (device: number, model: string, iteration: number, fn: CallFn) => Promise<void>;
  /** Told of every call answered: when it was sent, when the device ran it, when the reply came. */
  onSpan?: (span: CallSpan) => void;
  /** The seal of the worker process that is a device now (membership.ts), when known: a reply without it is dropped. */
  sealOf?: (device: number) => string | undefined;
  /** Told of every reply dropped: it did not decode, answers another call, or is not the device's. */
  onDropped?: (line: string) => void;
}

/** One call as the timeline shows it (times in ms since the epoch). */
export interface CallSpan {
  device: number;
  model: string;
  fn: CallFn;
  iteration: number;
  epoch: number;
  sent: number;
  /** The device's own time on the call ends at `replied`; the rest of the round trip is the bus and queueing. */
  device_ms: number;
  replied: number;
  ok: boolean;
  /** The collective group of a mesh call; it names the graph's call (`g<epoch>-<iteration>-[<call>]-<n>`). */
  group?: string;
}

export class BusDispatcher implements Dispatcher {
  private queue = new PerDeviceQueue();
  private readonly counts = new Map<string, number>();
  private readonly totals: TransportStats = { calls: 0, round_trip_seconds: 0, device_seconds: 0 };
  private readonly inFlight = new InFlight();

  constructor(
    private readonly nc: NatsConnection,
    private readonly subj: Subjects,
    private readonly run: string,
    private readonly callTimeoutMs: number,
    private readonly options: BusDispatcherOptions = {},
  ) {
    this.inFlight.epoch = options.epoch ?? 0;
  }

  get epoch(): number {
    return this.inFlight.epoch;
  }

  /** Every call in flight rejects with `interrupted`; the next calls start a new epoch's ids and queues. */
  interrupt(reason: string): void {
    this.inFlight.interrupt(reason);
    this.queue = new PerDeviceQueue();
    this.counts.clear();
  }

  call<F extends CallFn>(device: number, model: string, iteration: number, body: CallOf<F>, group?: string, options: CallOptions = {}): Promise<ResultOf<F>> {
    // The id names the logical call — epoch, iteration, model, function, device, and how many such
    // calls came before — not the order of dispatch, so a retry asks again under the same id and
    // a worker answers it from what it remembers; a recovery (a new epoch) never meets old answers.
    const prefix = `${this.run}.e${this.epoch}.${iteration}.${model}.${body.fn}.d${device}`;
    const n = this.counts.get(prefix) ?? 0;
    this.counts.set(prefix, n + 1);
    const id = `${prefix}.${n}`;
    const epoch = this.epoch;
    return this.inFlight.track(
      this.queue.run(
        device,
        async () => {
          // Queued behind a call when a recovery began: abandoned, never sent.
          if (this.epoch !== epoch) throw new CallError('interrupted', `abandoned before it was sent: call ${id} belongs to epoch ${epoch}, the run is in epoch ${this.epoch}`);
          await this.options.beforeCall?.(device, model, iteration, body.fn);
          const where = `device ${device}, '${body.fn}' of ${model}`;
          let reply: Reply;
          const t0 = performance.now();
          const sent = Date.now();
          const span = (ok: boolean, ms = 0) =>
            this.options.onSpan?.({ device, model, fn: body.fn, iteration, epoch: this.epoch, sent, device_ms: ms, replied: Date.now(), ok, ...(group ? { group } : {}) });
          // Anyone holding the device's credential hears its calls and may answer first: only a
          // reply to this call, sealed by the device's worker process, counts; the call waits for it.
          const seal = this.options.sealOf?.(device);
          const mine = (r: Reply) =>
            r.id !== id
              ? `it answers ${r.id === undefined ? 'no call' : `call ${r.id}`}`
              : seal !== undefined && r.seal !== seal
                ? `it is not sealed by the worker process of device ${device}`
                : undefined;
          try {
            reply = await requestChecked(
              this.nc,
              this.subj.call(device),
              { type: 'call', v: PROTOCOL_VERSION, id, model, iteration, epoch, ...(group ? { group } : {}), ...(options.beside ? { beside: true as const } : {}), body },
              Reply,
              this.callTimeoutMs,
              mine,
              (problem) => this.options.onDropped?.(`dropped a reply to call ${id} (${where}): ${problem}`),
            );
          } catch (cause) {
            span(false);
            const code = cause instanceof BusError ? cause.reason : cause instanceof ProtocolError ? 'malformed' : 'failed';
            throw new CallError(code, `${where}: ${(cause as Error).message}`, { cause });
          }
          span(reply.type === 'result', reply.type === 'result' ? (reply.ms ?? 0) : 0);
          if (reply.type === 'error') throw new CallError(reply.code, `${where}: ${reply.message}`);
          this.totals.calls += 1;
          this.totals.round_trip_seconds += (performance.now() - t0) / 1000;
          this.totals.device_seconds += (reply.ms ?? 0) / 1000;
          return checkResult(body.fn as F, reply.body, where);
        },
        options.beside,
      ),
    );
  }

  realloc(r: ReallocRequest): Promise<ReallocOutcome> {
    // The epoch in the id keeps an abandoned exchange's ready, go and chunks out of its retry's;
    // its random part keeps anyone else's out.
    return runRealloc(this.nc, this.subj, (d, m, i, b, g, o) => this.call(d, m, i, b, g, o), { ...r, id: exchangeId(`${r.id}-e${this.epoch}`) }, this.nc.info?.max_payload ?? 1 << 20);
  }

  turns(listener: (log: TurnLog, device: number) => void): () => void {
    return listenTurns(this.nc, this.subj, listener, this.options.onDropped);
  }

  samples(listener: (log: SampleLog, device: number) => void): () => void {
    return listenSamples(this.nc, this.subj, listener, this.options.onDropped);
  }

  stats(): TransportStats {
    return { ...this.totals };
  }

  checkpointShard(device: number, model: string, iteration: number, shapes: ReadonlyArray<{ name: string; shape: number[] }>, optimizer: boolean): Promise<Checkpoint> {
    return fetchCheckpoint(this.nc, this.subj, (d, m, i, b) => this.call(d, m, i, b), device, model, iteration, shapes, optimizer, this.nc.info?.max_payload ?? 1 << 20);
  }

  restoreShard(device: number, model: string, iteration: number, checkpoint: Checkpoint, o?: RestoreOptions): Promise<ResultOf<'restore'>> {
    return pushCheckpoint(this.nc, this.subj, (d, m, i, b) => this.call(d, m, i, b), device, model, iteration, checkpoint, this.nc.info?.max_payload ?? 1 << 20, o);
  }

  async close(): Promise<void> {}
}
