// Devices in this process, reached by direct calls: no bus, no processes. Parameter transfers
// copy arrays in memory.
import { PROTOCOL_VERSION, type Call, type CallFn, type CallOf, type ResultOf } from '../mesh/protocol.ts';
import type { NamedTensor } from '../mesh/transfer.ts';
import { Device, CallRejected, type ParamLink } from './device.ts';
import { CallError, PerDeviceQueue, checkResult, type Dispatcher } from './dispatch.ts';

/** In-memory parameter exchange between devices of one process. */
class MemoryLinks {
  private readonly waiting = new Map<string, (t: readonly NamedTensor[]) => void>();
  link(): ParamLink {
    return {
      send: async (transfer, tensors) => {
        const receiver = this.waiting.get(transfer);
        if (!receiver) throw new CallError('invalid_state', `transfer ${transfer}: no receiver`);
        this.waiting.delete(transfer);
        receiver(tensors.map((t) => ({ ...t, data: t.data.slice() })));
        return { bytes: tensors.reduce((n, t) => n + t.data.byteLength, 0), chunks: tensors.length };
      },
      receive: (transfer, manifest) =>
        new Promise((resolve) => {
          this.waiting.set(transfer, (tensors) => {
            const wanted = new Set(manifest.map((m) => m.name));
            const got = tensors.filter((t) => wanted.has(t.name));
            resolve({ tensors: got, bytes: got.reduce((n, t) => n + t.data.byteLength, 0), chunks: got.length });
          });
        }),
    };
  }
  hasReceiver(transfer: string): boolean {
    return this.waiting.has(transfer);
  }
}

export class LocalDispatcher implements Dispatcher {
  private readonly devices: Device[];
  private readonly links = new MemoryLinks();
  private readonly queue = new PerDeviceQueue();
  private seq = 0;

  constructor(count: number) {
    this.devices = Array.from({ length: count }, (_, i) => new Device(i, this.links.link()));
  }

  call<F extends CallFn>(device: number, model: string, iteration: number, body: CallOf<F>): Promise<ResultOf<F>> {
    const call: Call = { type: 'call', v: PROTOCOL_VERSION, id: `local-${this.seq++}`, model, iteration, body };
    return this.queue.run(device, async () => {
      try {
        return checkResult(body.fn as F, await this.devices[device]!.run(call), `device ${device}`);
      } catch (e) {
        if (e instanceof CallRejected) throw new CallError(e.code, `device ${device}, '${body.fn}' of ${model}: ${e.message}`);
        throw e;
      }
    });
  }

  async transfer(t: Parameters<Dispatcher['transfer']>[0]): Promise<ResultOf<'recv_params'>> {
    if (t.from.device === t.to.device) {
      return this.call(t.to.device, t.to.model, t.iteration, { fn: 'copy_params', source: t.from.model, names: t.manifest.map((m) => m.name) });
    }
    const recv = this.call(t.to.device, t.to.model, t.iteration, { fn: 'recv_params', transfer: t.id, manifest: t.manifest });
    while (!this.links.hasReceiver(t.id)) await new Promise((r) => setImmediate(r));
    await this.call(t.from.device, t.from.model, t.iteration, {
      fn: 'send_params',
      transfer: t.id,
      chunkBytes: 1 << 20,
      names: t.manifest.map((m) => m.name),
    });
    return recv;
  }

  async close(): Promise<void> {}
}
