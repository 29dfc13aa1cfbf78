// The NATS connection and the two ways ferry talks over it: typed request/reply and typed
// subscriptions. Errors say which subject and what went wrong.
import { readFileSync } from 'node:fs';
import { connect, credsAuthenticator, nkeyAuthenticator, type NatsConnection } from '@nats-io/transport-node';
import type { z } from 'zod';
import { decode, encode, ProtocolError } from '../messages/codec.ts';

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

/**
 * Credentials on a closed bus, one way at most: a user and password, a token, an NKey seed file or
 * a creds file (JWT and seed), as nats.js supports them. Given here, else from the environment:
 * FERRY_NATS_USER and FERRY_NATS_PASS (the launcher sets them per role on its private server),
 * FERRY_NATS_TOKEN, FERRY_NATS_NKEY (a file holding the seed), FERRY_NATS_CREDS (a .creds file).
 */
export interface Credentials {
  user?: string;
  pass?: string;
  token?: string;
  nkeyFile?: string;
  credsFile?: string;
}

/** The environment variables that carry credentials. */
export const CREDENTIAL_ENV = ['FERRY_NATS_USER', 'FERRY_NATS_PASS', 'FERRY_NATS_TOKEN', 'FERRY_NATS_NKEY', 'FERRY_NATS_CREDS'] as const;

/** The credentials given (all of them, when any is), else the environment's; refuses two ways at once. */
export function credentialsOf(given: Credentials = {}, env: NodeJS.ProcessEnv = process.env): Credentials {
  const c: Credentials = Object.values(given).some((v) => v !== undefined)
    ? given
    : { user: env.FERRY_NATS_USER, pass: env.FERRY_NATS_PASS, token: env.FERRY_NATS_TOKEN, nkeyFile: env.FERRY_NATS_NKEY, credsFile: env.FERRY_NATS_CREDS };
  const ways = [
    c.user !== undefined && 'a user (FERRY_NATS_USER)',
    c.token !== undefined && 'a token (FERRY_NATS_TOKEN)',
    c.nkeyFile !== undefined && 'an NKey (FERRY_NATS_NKEY)',
    c.credsFile !== undefined && 'a creds file (FERRY_NATS_CREDS)',
  ].filter(Boolean);
  if (ways.length > 1) throw new BusError(`expected one way to authenticate to NATS, got ${ways.join(' and ')}`, 'failed');
  return c;
}

/** Whether any credentials are given (here or in the environment). */
export function hasCredentials(given: Credentials = {}): boolean {
  const c = credentialsOf(given);
  return c.user !== undefined || c.token !== undefined || c.nkeyFile !== undefined || c.credsFile !== undefined;
}

function readSecret(file: string, what: string): Uint8Array {
  try {
    return new Uint8Array(readFileSync(file));
  } catch (e) {
    throw new BusError(`cannot read the ${what} ${file}: ${(e as Error).message}`, 'failed');
  }
}

export async function connectBus(url: string, name: string, credentials: Credentials = {}): Promise<NatsConnection> {
  const c = credentialsOf(credentials);
  const auth =
    c.user !== undefined
      ? { user: c.user, pass: c.pass }
      : c.token !== undefined
        ? { token: c.token }
        : c.nkeyFile !== undefined
          ? { authenticator: nkeyAuthenticator(new TextEncoder().encode(new TextDecoder().decode(readSecret(c.nkeyFile, 'NKey seed file')).trim())) }
          : c.credsFile !== undefined
            ? { authenticator: credsAuthenticator(readSecret(c.credsFile, 'creds file')) }
            : {};
  try {
    return await connect({
      ...auth,
      // A comma-separated list names the servers of a cluster, tried in the order given.
      servers: url.includes(',') ? url.split(',').map((u) => u.trim()) : url,
      noRandomize: url.includes(','),
      name,
      // Ride out a server restart: keep trying for as long as a run could last.
      maxReconnectAttempts: -1,
      reconnectTimeWait: 250,
      // Replies to this client's requests come under its own prefix: on a closed bus a client may
      // hear only those (auth.ts), not the replies to everybody's requests.
      ...(c.user !== undefined && /^[A-Za-z0-9_-]+$/.test(c.user) ? { inboxPrefix: inboxOf(c.user) } : {}),
    });
  } catch (cause) {
    throw new BusError(`cannot connect to NATS at ${url}: ${(cause as Error).message}`, 'unreachable', { cause });
  }
}

/** The prefix of the reply subjects nats.js (and the memory bus) makes for requests: their inboxes. */
export const INBOX_PREFIX = '_INBOX.';

/** The inbox prefix of a user's connections (a user name that is a subject token). */
export const inboxOf = (user: string) => `${INBOX_PREFIX}${user}`;

/**
 * Whether a message may be answered: it has a reply subject and that subject is an inbox. A reply
 * never goes to a run's subject: a forged request naming one (a results subject, say) would
 * otherwise make its answerer write into the run's stream.
 */
export function answerable(msg: { reply?: string }): msg is { reply: string } {
  return typeof msg.reply === 'string' && msg.reply.startsWith(INBOX_PREFIX);
}

/** Sends `message` and decodes the reply with `schema`; a timeout or no responder is a BusError. */
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
    throw requestFailed(message.type, subject, timeoutMs, cause);
  }
  return decode(subject, reply.data, schema);
}

function requestFailed(type: string, subject: string, timeoutMs: number, cause: unknown): BusError {
  const text = `${(cause as Error).name} ${String(cause)}`;
  const [why, reason]: [string, BusFailure] = /no ?responders/i.test(text)
    ? ['no one is subscribed', 'unreachable']
    : /timeout/i.test(text)
      ? [`no reply within ${timeoutMs} ms`, 'timeout']
      : [(cause as Error).message, 'failed'];
  return new BusError(`request '${type}' on ${subject} failed: ${why}`, reason, { cause });
}

/**
 * A request answered by the first reply that decodes and that `check` accepts (it says why not).
 * Whoever hears a request may answer it (on a closed bus, once each), so the first answer need not
 * be the one asked for: a reply refused goes to `onRefused`, and the request waits on for its own
 * until the timeout.
 */
export async function requestChecked<S extends z.ZodType>(
  nc: NatsConnection,
  subject: string,
  message: { type: string; v: number; [key: string]: unknown },
  schema: S,
  timeoutMs: number,
  check: (reply: z.infer<S>) => string | undefined,
  onRefused: (problem: string) => void,
): Promise<z.infer<S>> {
  const bytes = encode(message);
  const max = nc.info?.max_payload;
  if (max !== undefined && bytes.length > max) {
    throw new BusError(`request '${message.type}' on ${subject} is ${bytes.length} bytes, over the server's max payload of ${max}`, 'too_large');
  }
  let refused = '';
  try {
    for await (const reply of await nc.requestMany(subject, bytes, { strategy: 'timer', maxWait: timeoutMs })) {
      let problem: string | undefined;
      try {
        const decoded = decode(subject, reply.data, schema);
        problem = check(decoded);
        if (problem === undefined) return decoded;
      } catch (e) {
        problem = e instanceof ProtocolError ? e.problem : String(e);
      }
      refused = problem;
      onRefused(problem);
    }
  } catch (cause) {
    throw requestFailed(message.type, subject, timeoutMs, cause);
  }
  throw new BusError(`request '${message.type}' on ${subject} failed: no reply within ${timeoutMs} ms${refused ? ` (replies refused, the last: ${refused})` : ''}`, 'timeout');
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
