// An in-memory bus with NATS's semantics for what ferry uses: subjects with `*` and `>`
// wildcards, fan-out to every subscriber, request/reply, and a max payload. Devices of one process
// (benchmarks' no-bus baseline, quick tests) talk through it with the same code as over NATS;
// messages are still encoded, but nothing leaves the process.
import type { Bus, Msg } from './bus.ts';

export class MemoryBusError extends Error {
  override name = 'MemoryBusError';
}

/** Whether a NATS subject pattern (with `*` for one token and `>` for the rest) matches a subject. */
export function subjectMatches(pattern: string, subject: string): boolean {
  const p = pattern.split('.');
  const s = subject.split('.');
  for (let i = 0; i < p.length; i++) {
    if (p[i] === '>') return s.length > i;
    if (i >= s.length || (p[i] !== '*' && p[i] !== s[i])) return false;
  }
  return p.length === s.length;
}

interface Sub {
  pattern: string;
  callback: (err: Error | null, msg: Msg) => void;
}

export class MemoryBus implements Bus {
  private readonly subs = new Set<Sub>();
  private inbox = 0;
  readonly info: { max_payload: number };

  constructor(maxPayload = 1 << 20) {
    this.info = { max_payload: maxPayload };
  }

  publish(subject: string, data: Uint8Array = new Uint8Array(), reply?: string): void {
    if (data.length > this.info.max_payload) throw new MemoryBusError(`message of ${data.length} bytes exceeds the max payload of ${this.info.max_payload}`);
    const targets = [...this.subs].filter((s) => subjectMatches(s.pattern, subject));
    // Delivered asynchronously, in order, as a server would.
    queueMicrotask(() => {
      for (const sub of targets) {
        if (!this.subs.has(sub)) continue;
        sub.callback(null, {
          subject,
          data,
          reply,
          respond: (answer = new Uint8Array()) => {
            if (!reply) return false;
            this.publish(reply, answer);
            return true;
          },
        });
      }
    });
  }

  subscribe(subject: string, opts: { callback: (err: Error | null, msg: Msg) => void }) {
    const sub: Sub = { pattern: subject, callback: opts.callback };
    this.subs.add(sub);
    return { unsubscribe: () => void this.subs.delete(sub) };
  }

  request(subject: string, data: Uint8Array, opts: { timeout: number }): Promise<Msg> {
    if (![...this.subs].some((s) => subjectMatches(s.pattern, subject))) return Promise.reject(new MemoryBusError(`no responders on ${subject}`));
    const inbox = `_INBOX.${this.inbox++}`;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        sub.unsubscribe();
        reject(new MemoryBusError(`request timeout on ${subject}`));
      }, opts.timeout);
      const sub = this.subscribe(inbox, {
        callback: (_err, msg) => {
          clearTimeout(timer);
          sub.unsubscribe();
          resolve(msg);
        },
      });
      this.publish(subject, data, inbox);
    });
  }

  async flush(): Promise<void> {
    await new Promise<void>((r) => setImmediate(r));
  }
}
