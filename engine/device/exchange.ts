// What a device's side of an exchange shares (a reallocation, a probe, a checkpoint or restore
// with the supervisor): where it is on the bus, and the wait for the exchange's go.
import { Go, PROTOCOL_VERSION, encode, subscribe, type Bus, type Subjects } from '../../mesh/wire/index.ts';
import { CallRejected } from './checks.ts';

/** A device as its exchanges see it: its bus, its run's subjects, its index, its transfer settings. */
export interface DeviceLink {
  bus: Bus;
  subj: Subjects;
  index: number;
  options: { transferTimeoutMs?: number; warn?: (line: string) => void };
}

/**
 * Listens for an exchange's go (or abort) and says ready. Every device of the exchange listens,
 * receivers too: an abort must reach them.
 */
export function awaitGo(at: DeviceLink, id: string, transferTimeout: number) {
  // Devices of an exchange may be ready long before the others have finished the calls queued
  // ahead of it; the wait for go gets a longer limit than a transfer.
  const timeout = transferTimeout * 4;
  let stop = () => {};
  let timer: NodeJS.Timeout | undefined;
  let aborted!: (e: Error) => void;
  const abort = new Promise<never>((_, reject) => (aborted = reject));
  abort.catch(() => {});
  const go = new Promise<void>((resolve, reject) => {
    timer = setTimeout(() => reject(new CallRejected('timeout', `exchange ${id}: no go within ${timeout} ms`)), timeout);
    stop = subscribe(
      at.bus,
      at.subj.go(id),
      Go,
      (m) => {
        clearTimeout(timer);
        if (m.abort) {
          const e = new CallRejected('interrupted', `exchange ${id} was aborted: another device failed`);
          reject(e);
          aborted(e);
        } else resolve();
      },
      () => {},
    );
  });
  go.catch(() => {});
  return {
    go,
    aborted: abort,
    ready: async () => {
      await at.bus.flush();
      at.bus.publish(at.subj.ready(id), encode({ type: 'ready', v: PROTOCOL_VERSION, realloc: id, device: at.index }));
    },
    close: () => {
      clearTimeout(timer);
      stop();
    },
  };
}
