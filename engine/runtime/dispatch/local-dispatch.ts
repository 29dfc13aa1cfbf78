// Devices in this process, reached by direct calls; parameter transfers go over an in-memory bus.
import { PROTOCOL_VERSION, type Call, type CallFn, type CallOf, type Checkpoint, type ResultOf, type TurnLog, type SampleLog } from '../../../mesh/wire/index.ts';
import { MemoryBus, MemoryShelf, type Bus, type Shelf } from '../../../mesh/wire/index.ts';
import { subjects } from '../../../mesh/wire/index.ts';
import { Device, CallRejected } from '../../device/index.ts';
import {
  CallError,
  InFlight,
  PerDeviceQueue,
  checkResult,
  fetchCheckpoint,
  listenTurns,
  listenSamples,
  pushCheckpoint,
  runRealloc,
  type CallOptions,
  type Dispatcher,
  type RestoreOptions,
  type ReallocOutcome,
  type ReallocRequest,
} from './dispatch.ts';

/** Devices in this process over an in-memory bus: the same device code, no NATS, no processes. */
export class LocalDispatcher implements Dispatcher {
  private readonly devices: Device[];
  private readonly bus: Bus;
  /** Chunks of a transfer: what one message of the bus carries. */
  private readonly chunkBytes: number;
  private readonly subj = subjects('local');
  private queue = new PerDeviceQueue();
  private readonly inFlight = new InFlight();
  private seq = 0;

  /**
   * `bus`: what the devices' collectives and environment clients ride (default: in memory; a NATS
   * connection reaches environments). `shelf`: where the devices write snapshots (default: in memory).
   * `beforeRun`: runs as a call starts on its device, in its place in the device's line (as a
   * worker's chaos hooks do), before the device does anything.
   */
  constructor(
    count: number,
    bus?: Bus,
    readonly shelf: Shelf = new MemoryShelf(),
    private readonly hooks: { beforeRun?: (device: number, call: Call) => Promise<void> } = {},
  ) {
    this.bus = bus ?? new MemoryBus();
    this.chunkBytes = this.bus.info?.max_payload ?? new MemoryBus().info.max_payload;
    this.devices = Array.from({ length: count }, (_, i) => new Device(i, this.bus, this.subj, { shelf }));
  }

  call<F extends CallFn>(device: number, model: string, iteration: number, body: CallOf<F>, group?: string, options: CallOptions = {}): Promise<ResultOf<F>> {
    const call: Call = {
      type: 'call',
      v: PROTOCOL_VERSION,
      id: `local-${this.seq++}`,
      model,
      iteration,
      epoch: this.epoch,
      ...(group ? { group } : {}),
      ...(options.beside ? { beside: true as const } : {}),
      body,
    };
    const epoch = this.epoch;
    return this.inFlight.track(
      this.queue.run(
        device,
        async () => {
          if (this.epoch !== epoch) throw new CallError('interrupted', `abandoned before it ran: epoch ${epoch}, now ${this.epoch}`);
          await this.hooks.beforeRun?.(device, call);
          try {
            return checkResult(body.fn as F, await this.devices[device]!.run(call), `device ${device}`);
          } catch (e) {
            if (e instanceof CallRejected) throw new CallError(e.code, `device ${device}, '${body.fn}' of ${model}: ${e.message}`);
            throw e;
          }
        },
        options.beside,
      ),
    );
  }

  get epoch(): number {
    return this.inFlight.epoch;
  }

  /** Abandons the calls in flight; the devices here cannot be stopped mid-call, so a new queue starts. */
  interrupt(reason: string): void {
    this.inFlight.interrupt(reason);
    this.queue = new PerDeviceQueue();
  }

  turns(listener: (log: TurnLog, device: number) => void): () => void {
    return listenTurns(this.bus, this.subj, listener);
  }

  samples(listener: (log: SampleLog, device: number) => void): () => void {
    return listenSamples(this.bus, this.subj, listener);
  }

  realloc(r: ReallocRequest): Promise<ReallocOutcome> {
    return runRealloc(this.bus, this.subj, (d, m, i, b, g, o) => this.call(d, m, i, b, g, o), r, this.chunkBytes);
  }

  checkpointShard(device: number, model: string, iteration: number, shapes: ReadonlyArray<{ name: string; shape: number[] }>, optimizer: boolean): Promise<Checkpoint> {
    return fetchCheckpoint(this.bus, this.subj, (d, m, i, b) => this.call(d, m, i, b), device, model, iteration, shapes, optimizer, this.chunkBytes);
  }

  restoreShard(device: number, model: string, iteration: number, checkpoint: Checkpoint, o?: RestoreOptions): Promise<ResultOf<'restore'>> {
    return pushCheckpoint(this.bus, this.subj, (d, m, i, b) => this.call(d, m, i, b), device, model, iteration, checkpoint, this.chunkBytes, o);
  }

  /** Closes every device: their shards' tensors are freed (a run in this process leaves none behind). */
  async close(): Promise<void> {
    for (const d of this.devices) d.close();
  }
}
