// How a supervisor reaches devices. The same supervisor machine runs over NATS (actors/
// bus-dispatcher.ts) or in one process (local-dispatch.ts, for benchmarks and tests): the
// arithmetic is identical, only the transport differs.
import { randomBytes } from 'node:crypto';
import type { Bus } from '../../../mesh/wire/index.ts';
import { subscribe } from '../../../mesh/wire/index.ts';
import { encode } from '../../../mesh/wire/index.ts';
import type { Layout } from '../../../mesh/parallel/index.ts';
import { PROTOCOL_VERSION, Ready, ResultBodies, SampleLog, TurnLog, type CallFn, type CallOf, type Checkpoint, type ResultOf } from '../../../mesh/wire/index.ts';
import { offerTensors, receiveTensors, tensorDigest } from '../../../mesh/wire/index.ts';
import type { ReallocPlan } from '../../../mesh/parallel/index.ts';
import type { Subjects } from '../../../mesh/wire/index.ts';

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
  /**
   * `group` names the collective of a call that several ranks of a mesh run together. `beside`:
   * the call waits only for the device's other calls beside, not for its running call, and runs
   * next to it (a load, fill or release of a view the running call does not touch; see
   * engine/device/beside.ts).
   */
  call<F extends CallFn>(device: number, model: string, iteration: number, body: CallOf<F>, group?: string, options?: CallOptions): Promise<ResultOf<F>>;
  /** Carries out a reallocation plan: every destination ends with its new slices, verified. */
  realloc(r: ReallocRequest): Promise<ReallocOutcome>;
  /** One shard's checkpoint, streamed from its device. `shapes`: its slices; `optimizer`: whether it trains. */
  checkpointShard(device: number, model: string, iteration: number, shapes: ReadonlyArray<{ name: string; shape: number[] }>, optimizer: boolean): Promise<Checkpoint>;
  /**
   * Streams a checkpoint back into a loaded shard of the same layout and rank; `onto`: into the
   * shard the device holds, moved onto that layout and rank, the checkpoint holding only the
   * pieces it lacks; `digest`: the answer carries the digest of the weights held after it (see
   * the protocol's `restore`).
   */
  restoreShard(device: number, model: string, iteration: number, checkpoint: Checkpoint, o?: RestoreOptions): Promise<ResultOf<'restore'>>;
  close(): Promise<void>;
  /** Where call time went, for transports that can tell (the bus). */
  stats?(): TransportStats;
  /** Counts interruptions: calls made under an older epoch are abandoned work. */
  readonly epoch: number;
  /**
   * Abandons every call in flight (each rejects with code `interrupted`) and starts a new epoch:
   * the supervisor does this when it gives a device up, before it recovers.
   */
  interrupt(reason: string): void;
  /**
   * Hears the answers generating devices receive from environments, as they come (their
   * `turns` subjects): what a generation played again after a fault reads instead of asking.
   * Returns the unsubscribe.
   */
  turns?(listener: (log: TurnLog, device: number) => void): () => void;
  /** Hears continuous generations' rows as they end (devices' `samples` subjects). Returns the unsubscribe. */
  samples?(listener: (log: SampleLog, device: number) => void): () => void;
}

export interface CallOptions {
  beside?: boolean;
}

/** Devices' answers from environments on `bus`; a message that does not decode is said and dropped. */
export function listenTurns(bus: Bus, subj: Subjects, listener: (log: TurnLog, device: number) => void, onDropped?: (line: string) => void): () => void {
  return subscribe(
    bus,
    subj.allTurns,
    TurnLog,
    (log, msg) => listener(log, Number(msg.subject.slice(msg.subject.lastIndexOf('.') + 1))),
    (e) => onDropped?.(`dropped environment answers: ${e.message}`),
  );
}

/** Devices' rows of continuous generations on `bus`; a message that does not decode is said and dropped. */
export function listenSamples(bus: Bus, subj: Subjects, listener: (log: SampleLog, device: number) => void, onDropped?: (line: string) => void): () => void {
  return subscribe(
    bus,
    subj.allSamples,
    SampleLog,
    (log, msg) => listener(log, Number(msg.subject.slice(msg.subject.lastIndexOf('.') + 1))),
    (e) => onDropped?.(`dropped a generated sample: ${e.message}`),
  );
}

/**
 * The dispatcher as seen by one stage of the supervisor: once the dispatcher has been
 * interrupted, every further call of that stage (a `finally` that releases a view, a retry) is
 * refused, so that abandoned work cannot reach devices that are being recovered.
 */
export function fence(d: Dispatcher): Dispatcher {
  const epoch = d.epoch;
  const check = () => {
    if (d.epoch !== epoch) throw new CallError('interrupted', `abandoned: this stage began in epoch ${epoch}, the run is in epoch ${d.epoch}`);
  };
  return {
    get epoch() {
      return d.epoch;
    },
    call: (device, model, iteration, body, group, options) => (check(), d.call(device, model, iteration, body, group, options)),
    realloc: (r) => (check(), d.realloc(r)),
    checkpointShard: (device, model, iteration, shapes, optimizer) => (check(), d.checkpointShard(device, model, iteration, shapes, optimizer)),
    restoreShard: (device, model, iteration, c, o) => (check(), d.restoreShard(device, model, iteration, c, o)),
    close: () => d.close(),
    interrupt: (reason) => d.interrupt(reason),
    ...(d.stats ? { stats: () => d.stats!() } : {}),
    ...(d.turns ? { turns: (listener) => d.turns!(listener) } : {}),
    ...(d.samples ? { samples: (listener) => d.samples!(listener) } : {}),
  };
}

/**
 * Calls in flight that an interruption can abandon: `track` races a call against the next
 * interruption, `interrupt` rejects every tracked call and bumps the epoch.
 */
export class InFlight {
  epoch = 0;
  private readonly pending = new Set<(e: Error) => void>();

  track<T>(work: Promise<T>): Promise<T> {
    let abandon!: (e: Error) => void;
    const abandoned = new Promise<never>((_, reject) => (abandon = reject));
    this.pending.add(abandon);
    return Promise.race([work, abandoned]).finally(() => this.pending.delete(abandon));
  }

  interrupt(reason: string): void {
    this.epoch += 1;
    const error = new CallError('interrupted', `abandoned: ${reason}`);
    for (const abandon of [...this.pending]) abandon(error);
    this.pending.clear();
  }
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

/** Runs calls one at a time per device, as a device does; calls beside in a second line of their own. */
export class PerDeviceQueue {
  private readonly tails = new Map<string, Promise<unknown>>();
  run<T>(device: number, job: () => Promise<T>, beside = false): Promise<T> {
    const key = `${beside ? 'beside' : 'main'}:${device}`;
    const prev = this.tails.get(key) ?? Promise.resolve();
    const next = prev.then(job, job);
    this.tails.set(
      key,
      next.catch(() => {}),
    );
    return next;
  }
}

export interface ReallocRequest {
  id: string;
  iteration: number;
  from: { model: string; layout: Layout };
  to: { model: string; layout: Layout };
  plan: ReallocPlan;
  /** Every device's part runs beside its running call (filling a view nothing running reads). */
  beside?: boolean;
}

export interface ReallocOutcome {
  received_bytes: number;
  sent_bytes: number;
  copied_bytes: number;
  minimum_bytes: number;
  seconds: number;
  /** Each device's milliseconds per kind of work (and from go to done, `wall_ms`), summed over the devices. */
  times: Record<string, number>;
  /** What the exchange made each device hold at most, in MiB, by device. */
  held_mb: Record<number, number>;
}

/**
 * The supervisor's side of an exchange between devices (a reallocation, or a raw probe), over any
 * bus: one call per device involved; once every device has said it is subscribed, one `go`; then
 * the replies. A device that fails before it is ready fails the whole exchange at once, and the
 * others are told to stop waiting.
 */
export async function runExchange<F extends 'realloc' | 'probe' | 'checkpoint' | 'restore'>(
  bus: Bus,
  subj: Subjects,
  call: Dispatcher['call'],
  id: string,
  iteration: number,
  model: string,
  devices: readonly number[],
  bodyFor: (device: number) => CallOf<F>,
  /** Runs once every device is ready, before go (e.g. the caller's own sending). */
  beforeGo?: () => Promise<void>,
): Promise<Array<ResultOf<F>>> {
  const waiting = new Set(devices);
  let allReady!: () => void;
  const ready = new Promise<void>((resolve) => (allReady = resolve));
  const stop = subscribe(
    bus,
    subj.ready(id),
    Ready,
    (m) => {
      // Only an expected device's ready for this very exchange counts (its id is unguessable and
      // carries the epoch of a reallocation).
      if (m.realloc !== id || !waiting.has(m.device)) return;
      waiting.delete(m.device);
      if (waiting.size === 0) allReady();
    },
    () => {},
  );
  try {
    await bus.flush();
    const replies = devices.map((device) => call(device, model, iteration, bodyFor(device)) as Promise<ResultOf<F>>);
    const all = Promise.all(replies);
    try {
      if (devices.length) await Promise.race([ready, all]);
      await beforeGo?.();
      bus.publish(subj.go(id), encode({ type: 'go', v: PROTOCOL_VERSION, realloc: id }));
      return await all;
    } catch (e) {
      // The others would wait for a go or for chunks that will never come: release them now.
      bus.publish(subj.go(id), encode({ type: 'go', v: PROTOCOL_VERSION, realloc: id, abort: true }));
      await Promise.allSettled(replies);
      throw e;
    }
  } finally {
    stop();
  }
}

/** Carries out a reallocation plan (see runExchange): each device sends, receives and copies its part. */
export async function runRealloc(bus: Bus, subj: Subjects, call: Dispatcher['call'], r: ReallocRequest, chunkBytes: number): Promise<ReallocOutcome> {
  const t0 = performance.now();
  const { plan } = r;
  const tid = (index: number) => `${r.id}-${index}`;
  const callHere: Dispatcher['call'] = r.beside ? (d, m, i, b, g) => call(d, m, i, b, g, { beside: true }) : call;
  const results = await runExchange<'realloc'>(bus, subj, callHere, r.id, r.iteration, r.to.model, plan.devices, (device) => ({
    fn: 'realloc',
    realloc: r.id,
    source: r.from.model,
    sends: plan.transfers.filter((g) => g.src === device).map((g) => ({ transfer: tid(g.index), pieces: g.pieces, to: g.dsts })),
    recvs: plan.transfers.filter((g) => g.dsts.includes(device)).map((g) => ({ transfer: tid(g.index), pieces: g.pieces, from: g.src })),
    locals: plan.locals.filter((l) => l.device === device).map(({ device: _d, ...slice }) => slice),
    chunkBytes,
  }));
  const outcome: ReallocOutcome = { received_bytes: 0, sent_bytes: 0, copied_bytes: 0, minimum_bytes: plan.minimumBytes, seconds: 0, times: {}, held_mb: {} };
  results.forEach((res, i) => {
    if (res.held_mb !== undefined) outcome.held_mb[plan.devices[i]!] = res.held_mb;
  });
  for (const res of results) {
    outcome.received_bytes += res.received_bytes;
    outcome.sent_bytes += res.sent_bytes;
    outcome.copied_bytes += res.copied_bytes;
    for (const [k, ms] of Object.entries(res.times ?? {})) outcome.times[k] = (outcome.times[k] ?? 0) + ms;
  }
  outcome.seconds = (performance.now() - t0) / 1000;
  return outcome;
}

let exchanges = 0;

/** See Dispatcher.checkpointShard: the caller subscribes, the device sends on go. */
export async function fetchCheckpoint(
  bus: Bus,
  subj: Subjects,
  call: Dispatcher['call'],
  device: number,
  model: string,
  iteration: number,
  shapes: ReadonlyArray<{ name: string; shape: number[] }>,
  optimizer: boolean,
  chunkBytes: number,
): Promise<Checkpoint> {
  const id = exchangeId(`ckpt-${device}-${model.replace(/[^A-Za-z0-9_-]/g, '-')}-${exchanges++}`);
  const expected = shapes.flatMap((s) => [`w:${s.name}`, ...(optimizer ? [`m:${s.name}`, `v:${s.name}`] : [])].map((name) => ({ name, shape: [...s.shape] })));
  const got = new Map<string, Float32Array>();
  const incoming = receiveTensors(bus, subj, [{ transfer: id, expected, from: device }], 300_000, (t) => got.set(t.name, t.data), { me: 'supervisor' });
  // The device waits until this side holds every chunk: a transfer that cannot complete (a chunk
  // asked for again too often) ends the exchange at once, and is what the caller hears of.
  let failed: unknown;
  incoming.done.catch((e: unknown) => {
    failed = e;
    bus.publish(subj.go(id), encode({ type: 'go', v: PROTOCOL_VERSION, realloc: id, abort: true }));
  });
  try {
    await bus.flush();
    // The device sends on go; chunks, and requests to send one again, are timed from then.
    const [reply] = await runExchange<'checkpoint'>(
      bus,
      subj,
      call,
      id,
      iteration,
      model,
      [device],
      () => ({ fn: 'checkpoint', realloc: id, transfer: id, chunkBytes, optimizer }),
      async () => incoming.arm(),
    ).catch((e: unknown) => {
      throw failed ?? e;
    });
    if (reply!.optimizer !== optimizer)
      throw new CallError('invalid_state', `device ${device}, '${model}': expected ${optimizer ? 'an' : 'no'} optimizer state, the shard has ${reply!.optimizer ? 'one' : 'none'}`);
    await incoming.done;
    return {
      tensors: shapes.map((s) => ({ name: s.name, shape: [...s.shape], data: got.get(`w:${s.name}`)! })),
      ...(optimizer ? { optimizer: { step: reply!.step, moments: shapes.map((s) => ({ name: s.name, m: got.get(`m:${s.name}`)!, v: got.get(`v:${s.name}`)! })) } } : {}),
      ledger: reply!.ledger,
    };
  } finally {
    incoming.close();
  }
}

/**
 * An exchange's id: its readable stem and 64 random bits. The id names the exchange's subjects
 * (ready, go, chunks); a client on the bus that could guess the next one could send its `ready`
 * or its chunks early.
 */
export function exchangeId(stem: string): string {
  return `${stem}-${randomBytes(8).toString('hex')}`;
}

/** Where a restore moves the shard a device holds: a rank of another layout (the protocol's `restore.onto`). */
export type Onto = NonNullable<CallOf<'restore'>['onto']>;

/** A restore's options: `onto` (the protocol's `restore.onto`), and whether its answer carries the digest of the weights held after it. */
export interface RestoreOptions {
  onto?: Onto;
  digest?: boolean;
}

/**
 * See Dispatcher.restoreShard. A checkpoint of half a chunk or less travels in the call itself
 * (`inline`, each tensor with its digest): one round. A larger one is streamed: the device
 * subscribes and says ready; the caller sends its chunks.
 */
export async function pushCheckpoint(
  bus: Bus,
  subj: Subjects,
  call: Dispatcher['call'],
  device: number,
  model: string,
  iteration: number,
  c: Checkpoint,
  chunkBytes: number,
  o: RestoreOptions = {},
): Promise<ResultOf<'restore'>> {
  const id = exchangeId(`rstr-${device}-${model.replace(/[^A-Za-z0-9_-]/g, '-')}-${exchanges++}`);
  const tensors = [
    ...c.tensors.map((t) => ({ ...t, name: `w:${t.name}` })),
    ...(c.optimizer?.moments ?? []).flatMap((m) => {
      const shape = c.tensors.find((t) => t.name === m.name)?.shape ?? [m.m.length];
      return [
        { name: `m:${m.name}`, shape, data: m.m },
        { name: `v:${m.name}`, shape, data: m.v },
      ];
    }),
  ];
  const body: CallOf<'restore'> = {
    fn: 'restore',
    realloc: id,
    transfer: id,
    step: c.optimizer?.step ?? 0,
    optimizer: c.optimizer !== undefined,
    ledger: c.ledger ?? [],
    ...(o.onto ? { onto: o.onto } : {}),
    ...(o.digest ? { digest: true as const } : {}),
  };
  if (tensors.reduce((n, t) => n + t.data.byteLength, 0) <= chunkBytes / 2) {
    return call(device, model, iteration, { ...body, inline: tensors.map((t) => ({ name: t.name, shape: [...t.shape], data: t.data, digest: tensorDigest(t.data) })) });
  }
  // The device asks for chunks again until it holds them all; its reply says it does.
  const byName = new Map(tensors.map((t) => [t.name, t]));
  const outgoing = offerTensors(bus, subj, { transfer: id, from: 'supervisor', to: [device], tensors: () => tensors, tensor: (name) => byName.get(name) }, chunkBytes);
  try {
    const [answer] = await runExchange<'restore'>(
      bus,
      subj,
      call,
      id,
      iteration,
      model,
      [device],
      () => body,
      async () => {
        await outgoing.send();
      },
    );
    return answer!;
  } finally {
    outgoing.close();
  }
}
