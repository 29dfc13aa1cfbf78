// The NATS connection and the two ways ferry talks over it: typed request/reply and typed
// subscriptions. Errors say which subject and what went wrong.
import { connect, type NatsConnection } from '@nats-io/transport-node';
import type { z } from 'zod';
import { decode, encode, ProtocolError } from './codec.ts';

export type { NatsConnection };

/** A received message: what ferry uses of a NATS message. */
export interface Msg {
  subject: string;
  data: Uint8Array;
  reply?: string;
  respond(data?: Uint8Array): boolean;
}

/**
 * The part of a NATS connection that ferry uses. A NatsConnection is one; so is the in-memory
 * bus (memory-bus.ts) that runs the same device code inside one process.
 */
export interface Bus {
  publish(subject: string, data?: Uint8Array): void;
  subscribe(subject: string, opts: { queue?: string; callback: (err: Error | null, msg: Msg) => void }): { unsubscribe(): void };
  request(subject: string, data: Uint8Array, opts: { timeout: number }): Promise<Msg>;
  flush(): Promise<void>;
  readonly info?: { max_payload: number };
}

export type BusFailure = 'unreachable' | 'timeout' | 'too_large' | 'failed';

export class BusError extends Error {
  override name = 'BusError';
  constructor(
    message: string,
    readonly reason: BusFailure = 'failed',
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/** Credentials on a closed bus: given, else $FERRY_NATS_USER and $FERRY_NATS_PASS (the launcher sets them per role). */
export interface Credentials {
  user?: string;
  pass?: string;
}

export async function connectBus(url: string, name: string, credentials: Credentials = {}): Promise<NatsConnection> {
  const user = credentials.user ?? process.env.FERRY_NATS_USER;
  const pass = credentials.pass ?? process.env.FERRY_NATS_PASS;
  try {
    return await connect({
      ...(user !== undefined ? { user, pass } : {}),
      // A comma-separated list names the servers of a cluster, tried in the order given.
      servers: url.includes(',') ? url.split(',').map((u) => u.trim()) : url,
      noRandomize: url.includes(','),
      name,
      // Ride out a server restart: keep trying for as long as a run could last.
      maxReconnectAttempts: -1,
      reconnectTimeWait: 250,
    });
  } catch (cause) {
    throw new BusError(`cannot connect to NATS at ${url}: ${(cause as Error).message}`, 'unreachable', { cause });
  }
}

/** Sends `message` and decodes the reply with `schema`; a timeout or no responder is a BusError. */
/** The prefix of the reply subjects nats.js (and the memory bus) makes for requests: their inboxes. */
export const INBOX_PREFIX = '_INBOX.';

/**
 * Whether a message may be answered: it has a reply subject and that subject is an inbox. A reply
 * never goes to a run's subject: a forged request naming one (a results subject, say) would
 * otherwise make its answerer write into the run's stream.
 */
export function answerable(msg: { reply?: string }): msg is { reply: string } {
  return typeof msg.reply === 'string' && msg.reply.startsWith(INBOX_PREFIX);
}

export async function request<S extends z.ZodType>(nc: Bus, subject: string, message: { type: string; v: number; [key: string]: unknown }, schema: S, timeoutMs: number): Promise<z.infer<S>> {
  let reply: Msg;
  const bytes = encode(message);
  const max = nc.info?.max_payload;
  if (max !== undefined && bytes.length > max) {
    throw new BusError(`request '${message.type}' on ${subject} is ${bytes.length} bytes, over the server's max payload of ${max}`, 'too_large');
  }
  try {
    reply = await nc.request(subject, bytes, { timeout: timeoutMs });
  } catch (cause) {
    const text = `${(cause as Error).name} ${String(cause)}`;
    const [why, reason]: [string, BusFailure] = /no ?responders/i.test(text)
      ? ['no one is subscribed', 'unreachable']
      : /timeout/i.test(text)
        ? [`no reply within ${timeoutMs} ms`, 'timeout']
        : [(cause as Error).message, 'failed'];
    throw new BusError(`request '${message.type}' on ${subject} failed: ${why}`, reason, { cause });
  }
  return decode(subject, reply.data, schema);
}

/**
 * Subscribes and hands each decoded message to `onMessage`; bytes that do not decode go to
 * `onMalformed` with the subject and the problem, and the subscription keeps going.
 */
export function subscribe<S extends z.ZodType>(
  nc: Bus,
  subject: string,
  schema: S,
  onMessage: (message: z.infer<S>, msg: Msg) => void,
  onMalformed: (error: ProtocolError, msg: Msg) => void,
  options: { queue?: string; onDecoded?: (ms: number) => void } = {},
): () => void {
  const sub = nc.subscribe(subject, {
    queue: options.queue,
    callback: (err, msg) => {
      if (err) return;
      let decoded: z.infer<S>;
      const t0 = options.onDecoded ? performance.now() : 0;
      try {
        decoded = decode(msg.subject, msg.data, schema);
        options.onDecoded?.(performance.now() - t0);
      } catch (e) {
        onMalformed(e instanceof ProtocolError ? e : new ProtocolError(msg.subject, String(e)), msg);
        return;
      }
      try {
        onMessage(decoded, msg);
      } catch (e) {
        // A handler's bug must not take the connection down with it.
        onMalformed(new ProtocolError(msg.subject, `handler failed: ${(e as Error).message}`, { cause: e }), msg);
      }
    },
  });
  return () => sub.unsubscribe();
}
