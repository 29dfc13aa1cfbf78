// The supervisor's side of the bus: calls go to `dev.<n>.call` as requests, one at a time per
// device; parameter transfers are ordered so that every destination is subscribed before the
// source publishes a byte.
import type { NatsConnection } from '@nats-io/transport-node';
import { request, subscribe } from '../mesh/bus.ts';
import { PROTOCOL_VERSION, Ready, Reply, type CallFn, type CallOf, type ResultOf } from '../mesh/protocol.ts';
import type { Subjects } from '../mesh/subjects.ts';
import { CallError, PerDeviceQueue, checkResult, type Dispatcher, type TransportStats } from '../engine/dispatch.ts';

export class BusDispatcher implements Dispatcher {
  private readonly queue = new PerDeviceQueue();
  private seq = 0;
  private readonly totals: TransportStats = { calls: 0, round_trip_seconds: 0, device_seconds: 0 };

  constructor(
    private readonly nc: NatsConnection,
    private readonly subj: Subjects,
    private readonly run: string,
    private readonly callTimeoutMs: number,
  ) {}

  call<F extends CallFn>(device: number, model: string, iteration: number, body: CallOf<F>): Promise<ResultOf<F>> {
    const id = `${this.run}.${iteration}.${model}.${body.fn}.${this.seq++}`;
    return this.queue.run(device, async () => {
      const where = `device ${device}, '${body.fn}' of ${model}`;
      let reply: Reply;
      const t0 = performance.now();
      try {
        reply = await request(this.nc, this.subj.call(device), { type: 'call', v: PROTOCOL_VERSION, id, model, iteration, body }, Reply, this.callTimeoutMs);
      } catch (cause) {
        throw new CallError('timeout', `${where}: ${(cause as Error).message}`, { cause });
      }
      if (reply.type === 'error') throw new CallError(reply.code, `${where}: ${reply.message}`);
      this.totals.calls += 1;
      this.totals.round_trip_seconds += (performance.now() - t0) / 1000;
      this.totals.device_seconds += (reply.ms ?? 0) / 1000;
      if (reply.id !== id) throw new CallError('malformed', `${where}: reply is for call ${reply.id}, expected ${id}`);
      return checkResult(body.fn as F, reply.body, where);
    });
  }

  async transfer(t: Parameters<Dispatcher['transfer']>[0]): Promise<ResultOf<'recv_params'>> {
    if (t.from.device === t.to.device) {
      return this.call(t.to.device, t.to.model, t.iteration, { fn: 'copy_params', source: t.from.model, names: t.manifest.map((m) => m.name) });
    }
    const id = `${t.id}-${this.seq++}`;
    let onReady!: () => void;
    const ready = new Promise<void>((resolve) => (onReady = resolve));
    const stop = subscribe(
      this.nc,
      this.subj.ready(id),
      Ready,
      (msg) => msg.device === t.to.device && onReady(),
      () => {},
    );
    try {
      await this.nc.flush();
      const recv = this.call(t.to.device, t.to.model, t.iteration, { fn: 'recv_params', transfer: id, manifest: t.manifest });
      // If the destination refuses, it never gets ready: whichever settles first decides.
      await Promise.race([ready, recv]);
      await this.call(t.from.device, t.from.model, t.iteration, {
        fn: 'send_params',
        transfer: id,
        chunkBytes: this.nc.info?.max_payload ?? 1 << 20,
        names: t.manifest.map((m) => m.name),
      });
      return await recv;
    } finally {
      stop();
    }
  }

  stats(): TransportStats {
    return { ...this.totals };
  }

  async close(): Promise<void> {}
}
