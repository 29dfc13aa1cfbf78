// Which instances of a named service on the bus (a reward actor, an environment) are there: each
// beats on its presence subject every second, and counts as present from its first beat until it
// has been silent for `presenceMs`. Shared by every client of such a service.
import type { Bus } from '../bus/bus.ts';
import { decode } from '../messages/codec.ts';
import type { z } from 'zod';

export interface PresenceOptions {
  /** An instance silent this long is gone (default 3 s). */
  presenceMs?: number;
  /** Says when an instance appears, and what it ignored. */
  say?: (line: string) => void;
}

export class Presence {
  private readonly seen = new Map<string, number>();
  private readonly stop: () => void;

  /** `what`: how lines name the service ("reward actor 'x'"). */
  constructor(
    nc: Bus,
    subject: string,
    schema: z.ZodType<{ instance: string }>,
    version: number,
    readonly what: string,
    private readonly o: PresenceOptions = {},
  ) {
    const sub = nc.subscribe(subject, {
      callback: (_e, msg) => {
        try {
          const hello = decode(msg.subject, msg.data, schema, version);
          if (!this.seen.has(hello.instance)) o.say?.(`${what}: instance ${hello.instance} is serving`);
          this.seen.set(hello.instance, Date.now());
        } catch (e) {
          o.say?.(`${what}: ignored a presence message: ${(e as Error).message}`);
        }
      },
    });
    this.stop = () => sub.unsubscribe();
  }

  /** Instances heard from recently, in a fixed order. */
  live(): string[] {
    const fresh = Date.now() - (this.o.presenceMs ?? 3000);
    return [...this.seen]
      .filter(([, at]) => at >= fresh)
      .map(([id]) => id)
      .sort();
  }

  /** An instance known to be gone (nobody subscribed to its subject): until it beats again. */
  forget(instance: string): void {
    this.seen.delete(instance);
  }

  close(): void {
    this.stop();
  }
}

/** A bus error in words a user can act on. */
export function describeRequestError(e: unknown, timeoutMs: number): string {
  const m = e instanceof Error ? e.message : String(e);
  if (/timeout/i.test(m)) return `no reply within ${timeoutMs / 1000} s (timeout_seconds)`;
  if (/no responders|503/i.test(m)) return 'it is gone (no one is subscribed to its subject)';
  return m;
}

/** Whether a request failed because nobody listens on the instance's subject. */
export function isGone(e: unknown): boolean {
  return /no responders|503/i.test(String((e as Error)?.message ?? e));
}
