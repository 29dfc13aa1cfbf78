// Chunked parameter transfers on the bus. A sender publishes every chunk of a transfer once on
// its own chunk subject, then `sent`. Each receiver checks every chunk (chunks.ts) and drops a bad
// one — bytes that are not a chunk, another transfer's, another sender's, one that names another
// sender than its subject's, a wrong digest — logging it once with its subject, and asks the
// sender on its own receipt subject for that chunk again; a receiver that has the sender's `sent`
// and still lacks chunks (a slow consumer's losses) asks for those. Each chunk is asked for a
// bounded number of times (resend.ts), then the transfer fails naming it, its sender and the
// tries. A receiver that holds everything says `received`; the sender keeps what it sent, or cuts
// it again bit for bit, until every receiver has said so. A chunk sent again racing its first copy
// is placed once.
import { subscribe, type Bus } from '../bus/bus.ts';
import { encode } from '../messages/codec.ts';
import { Assembler, BadChunkError, TransferError, chunkAt, chunkElements, chunksOf, partyName, timed, type Expected, type NamedTensor, type Place, type TransferTimes } from './chunks.ts';
import { PROTOCOL_VERSION, Receipt, TransferMessage, type Party } from '../messages/protocol.ts';
import { RESEND, Resends, type ResendPolicy } from './resend.ts';
import { FramePool } from './frames.ts';
import { senderOf, type Subjects } from '../bus/subjects.ts';

export * from './chunks.ts';

/** Where transfers say what they dropped or sent again, unless told otherwise. */
const stderr = (line: string) => void process.stderr.write(`${new Date().toISOString()} ${line}\n`);

/** Lines one side of a transfer logs about bad messages; past these it only counts them. */
const LOGGED = 10;

function limited(warn: (line: string) => void, subject: string): (line: string) => void {
  let n = 0;
  return (line) => {
    n += 1;
    if (n <= LOGGED) warn(line);
    if (n === LOGGED) warn(`further lines about ${subject} are not logged`);
  };
}

/** Chunks a sender publishes between two flushes. */
export const FLUSH_EVERY = 8;

/**
 * Flow control for a stream of publishes: after every FLUSH_EVERY of them, wait until the server
 * has the window before the last, then flush this one. The client never buffers more than two
 * windows, and the sender builds the next window (reads, hashes, encodes) while the bus carries
 * the last one, instead of stopping until each is through. The frames a window's publishes were
 * taken from `frames` go back to it once the server has that window.
 */
export function pacer(nc: Bus, every = FLUSH_EVERY, frames?: FramePool) {
  let n = 0;
  let pending: Promise<void> | undefined;
  let window: Uint8Array[] = [];
  const flush = () => {
    const sent = window;
    window = [];
    const p = nc.flush();
    if (frames)
      p.then(
        () => frames.give(sent),
        () => {},
      );
    return p;
  };
  return {
    /** Call after each publish, with the frame it published when that came from `frames`. */
    async published(frame?: Uint8Array): Promise<void> {
      if (frame) window.push(frame);
      if (++n % every !== 0) return;
      await pending;
      pending = flush();
      // Awaited at the next window or at the end; a failure meanwhile must not count as unhandled.
      pending.catch(() => {});
    },
    /** Resolves once the server has every publish. */
    async end(): Promise<void> {
      await pending;
      await flush();
    },
  };
}

/**
 * The frames this process's senders reuse. A sender has at most three windows' frames out (two
 * flushing, one being built); the pool keeps two windows' worth while none is needed.
 */
export const FRAMES = new FramePool(2 * FLUSH_EVERY);

/**
 * Several receivers of one publish ask at once for a chunk they all lost or were all sent a bad
 * copy of; one answer reaches them all, so a sender answers a chunk at most once in this window.
 */
const ANSWERED_MS = 250;

export interface Offer {
  transfer: string;
  from: Party;
  /** Its receivers: only their requests are answered, and each must say `received`. */
  to: readonly Party[];
  /** The tensors in order, for the first publish (they may be cut as they are needed). */
  tensors: () => Iterable<NamedTensor>;
  /** One tensor again, bit for bit, when a receiver asks for one of its chunks. */
  tensor: (name: string) => NamedTensor | undefined;
}

export interface Outgoing {
  /** Publishes every chunk once, then `sent`; resolves once the server has them. */
  send(): Promise<{ bytes: number; chunks: number }>;
  /** Resolves once every receiver has said `received`; rejects if they have not `timeoutMs` after `send`. */
  received: Promise<void>;
  /** Chunks published again because a receiver asked. */
  resent(): number;
  close(): void;
}

/**
 * The sending side of one transfer. It listens for receipts at once, so call it before saying
 * ready; it answers requests to resend a chunk until `close`.
 */
export function offerTensors(nc: Bus, subj: Subjects, offer: Offer, chunkBytes: number, options: { times?: TransferTimes; timeoutMs?: number; warn?: (line: string) => void } = {}): Outgoing {
  const { transfer, from } = offer;
  const { times } = options;
  const subject = subj.chunks(transfer, from);
  const bytesPer = Math.min(chunkBytes, nc.info?.max_payload ?? chunkBytes);
  const per = chunkElements(bytesPer);
  const warn = limited(options.warn ?? stderr, subj.transferReceipts(transfer));
  const who = partyName(from);
  /** Tensor digests from the first publish, so an answer need not hash a whole tensor again. */
  const wholes = new Map<string, string>();
  const answered = new Map<string, number>();
  const waiting = new Set(offer.to);
  let resent = 0;
  let timer: NodeJS.Timeout | undefined;
  let settle!: () => void;
  let fail!: (e: Error) => void;
  const received = new Promise<void>((resolve, reject) => {
    settle = resolve;
    fail = reject;
  });
  // Whoever awaits `received` sees a failure; one nobody awaits must not count as unhandled.
  received.catch(() => {});
  if (waiting.size === 0) settle();
  const stop = subscribe(
    nc,
    subj.transferReceipts(transfer),
    Receipt,
    (r, msg) => {
      if (r.transfer !== transfer || !offer.to.includes(r.from)) {
        warn(`${who} ignored a '${r.type}' on ${msg.subject} for transfer ${r.transfer} from ${partyName(r.from)}: not a receiver of transfer ${transfer}`);
        return;
      }
      if (senderOf(msg.subject) !== r.from) {
        warn(`${who} ignored a '${r.type}' on ${msg.subject}: it says it comes from ${partyName(r.from)}, on another party's subject`);
        return;
      }
      if (r.type === 'received') {
        waiting.delete(r.from);
        if (waiting.size === 0) {
          clearTimeout(timer);
          settle();
        }
        return;
      }
      const t = offer.tensor(r.tensor);
      const chunk = t && chunkAt(transfer, from, t, r.offset, per, wholes.get(t.name));
      if (!chunk) {
        warn(`${who} ignored a request from ${partyName(r.from)} for tensor '${r.tensor}' at offset ${r.offset}: no such chunk in transfer ${transfer}`);
        return;
      }
      const key = `${chunk.offset}:${chunk.tensor}`;
      const now = performance.now();
      if (now - (answered.get(key) ?? Number.NEGATIVE_INFINITY) < ANSWERED_MS) return;
      answered.set(key, now);
      nc.publish(subject, encode(chunk));
      resent += 1;
      warn(`${who} sent again the chunk of tensor '${chunk.tensor}' at offset ${chunk.offset} of transfer ${transfer} (${partyName(r.from)}'s request ${r.attempt})`);
    },
    (e) => warn(`${who} dropped ${e.message}`),
  );
  return {
    async send() {
      let bytes = 0;
      let chunks = 0;
      const pace = pacer(nc, FLUSH_EVERY, FRAMES);
      const wait = async (p: Promise<void>) => {
        const t0 = performance.now();
        await p;
        if (times) times.publish += performance.now() - t0;
      };
      for (const chunk of chunksOf(transfer, offer.tensors(), bytesPer, { from, times })) {
        wholes.set(chunk.tensor, chunk.whole);
        const message = timed(times, 'encode', () => encode(chunk, FRAMES.take));
        timed(times, 'publish', () => nc.publish(subject, message));
        bytes += chunk.data.byteLength;
        chunks += 1;
        await wait(pace.published(message));
      }
      nc.publish(subject, encode({ type: 'sent', v: PROTOCOL_VERSION, transfer, from, chunks, elements: per }));
      await wait(pace.end());
      if (waiting.size > 0 && options.timeoutMs !== undefined) {
        const left = () => [...waiting].map(partyName).join(', ');
        timer = setTimeout(() => fail(new TransferError(`transfer ${transfer}: ${left()} did not say received within ${options.timeoutMs} ms of ${who} sending it`)), options.timeoutMs);
      }
      return { bytes, chunks };
    },
    received,
    resent: () => resent,
    close: () => {
      clearTimeout(timer);
      stop();
    },
  };
}

export interface Incoming {
  /** Resolves once every expected tensor has arrived, verified, or rejects with what went wrong. */
  done: Promise<void>;
  /** Starts the timeout and the requests to resend: call it when the senders have been told to send. */
  arm(): void;
  bytes(): number;
  chunks(): number;
  /** Messages dropped: bytes that are not a chunk, another transfer's or sender's, a bad digest. */
  dropped(): number;
  /** Requests to resend a chunk, sent. */
  requests(): number;
  close(): void;
}

export interface ReceiveOptions {
  times?: TransferTimes;
  /** Who this receiver is, as its senders know it (the supervisor unless said). */
  me?: Party;
  resend?: ResendPolicy;
  warn?: (line: string) => void;
}

/**
 * Subscribes to the chunks of several transfers at once and hands each tensor to `onTensor` as
 * soon as it is complete and matches its digest, or, with a `Place` function instead, each chunk
 * as soon as it is checked (the tensor's digest is still checked once it is complete). A bad chunk
 * is dropped and asked for again (see the top of this file). `from`: a transfer's sender, whose
 * chunks alone count. `done` settles when all have arrived, or at the first error that asking
 * again cannot mend. Call `close` when done.
 */
export function receiveTensors(
  nc: Bus,
  subj: Subjects,
  transfers: ReadonlyArray<{ transfer: string; expected: readonly Expected[]; from?: Party }>,
  timeoutMs: number,
  deliver: ((t: NamedTensor) => void) | { place: Place },
  options: ReceiveOptions = {},
): Incoming {
  const { times, me = 'supervisor', resend = RESEND } = options;
  const place = typeof deliver === 'function' ? undefined : deliver.place;
  const onTensor = typeof deliver === 'function' ? deliver : () => {};
  const lanes = transfers.map((t) => ({
    ...t,
    asm: new Assembler(t.transfer, t.expected, { from: t.from, place, times }),
    asks: new Resends(resend),
    /** Whether this receiver has said `received`. */
    said: false,
  }));
  type Lane = (typeof lanes)[number];
  const warn = limited(options.warn ?? stderr, transfers.length === 1 ? subj.transferChunks(transfers[0]!.transfer) : `${transfers.length} transfers`);
  const stops: Array<() => void> = [];
  let timer: NodeJS.Timeout | undefined;
  let ticker: NodeJS.Timeout | undefined;
  let armed = false;
  let dropped = 0;
  let requests = 0;
  let lastProblem = '';
  let arm = () => {};
  const done = new Promise<void>((resolve, reject) => {
    const stopTimers = () => {
      clearTimeout(timer);
      clearInterval(ticker);
    };
    const fail = (e: Error) => {
      stopTimers();
      reject(e);
    };
    const sender = (lane: Lane) => (lane.from === undefined ? 'its sender' : partyName(lane.from));
    const ask = (lane: Lane) => {
      if (!armed) return;
      const { send, exhausted } = lane.asks.due(performance.now(), (t, o) => lane.asm.lacks(t, o));
      if (exhausted) {
        const { tensor, offset, tries, problem } = exhausted;
        fail(
          new TransferError(
            `transfer ${lane.transfer}: the chunk of tensor '${tensor}' at offset ${offset} from ${sender(lane)} did not come intact after ${tries} requests to send it again (the last problem: ${problem})`,
          ),
        );
        return;
      }
      for (const r of send) {
        nc.publish(subj.receipts(lane.transfer, me), encode({ type: 'resend', v: PROTOCOL_VERSION, transfer: lane.transfer, from: me, tensor: r.tensor, offset: r.offset, attempt: r.tries }));
        requests += 1;
      }
    };
    const drop = (lane: Lane, subject: string, problem: string, at?: { tensor: string; offset: number }) => {
      dropped += 1;
      lastProblem = problem;
      const again = at !== undefined && lane.asm.lacks(at.tensor, at.offset);
      warn(`${partyName(me)} dropped a message on ${subject}: ${problem}${again ? `; asking ${sender(lane)} to send that chunk again` : ''}`);
      if (!again) return;
      lane.asks.want(at.tensor, at.offset, problem);
      ask(lane);
    };
    const check = () => {
      for (const lane of lanes) {
        if (!armed || lane.said || !lane.asm.complete) continue;
        lane.said = true;
        nc.publish(subj.receipts(lane.transfer, me), encode({ type: 'received', v: PROTOCOL_VERSION, transfer: lane.transfer, from: me }));
      }
      if (lanes.every((l) => l.asm.complete)) {
        stopTimers();
        resolve();
      }
    };
    arm = () => {
      if (armed) return;
      armed = true;
      timer = setTimeout(() => {
        const got = lanes.reduce((n, l) => n + l.asm.chunks, 0);
        const bad = dropped ? `; ${dropped} bad messages dropped, the last: ${lastProblem}` : '';
        fail(new TransferError(`transfers ${transfers.map((t) => t.transfer).join(', ')}: incomplete ${timeoutMs} ms after they began (${got} chunks${bad})`));
      }, timeoutMs);
      ticker = setInterval(() => lanes.forEach(ask), resend.afterMs / 4);
      lanes.forEach(ask);
      check();
    };
    for (const lane of lanes) {
      stops.push(
        subscribe(
          nc,
          subj.transferChunks(lane.transfer),
          TransferMessage,
          (m, msg) => {
            // Each party publishes on its own subject, as itself only (the server sees to it).
            if (senderOf(msg.subject) !== m.from) {
              drop(lane, msg.subject, `a '${m.type}' that says it comes from ${partyName(m.from)}, on another party's subject`, m.type === 'chunk' ? m : undefined);
              return;
            }
            if (m.type === 'sent') {
              if (m.transfer !== lane.transfer || (lane.from !== undefined && m.from !== lane.from)) {
                drop(lane, msg.subject, `'sent' for transfer ${m.transfer} from ${partyName(m.from)}; this is transfer ${lane.transfer} from ${sender(lane)}`);
                return;
              }
              lane.asks.progress(performance.now());
              // A chunk already asked for keeps the reason it was (a bad copy says more than none).
              for (const at of lane.asm.missing(m.elements)) {
                if (!lane.asks.has(at.tensor, at.offset)) lane.asks.want(at.tensor, at.offset, `it never came, though ${partyName(m.from)} says it sent all ${m.chunks} chunks`);
              }
              ask(lane);
              return;
            }
            let t: NamedTensor | undefined;
            try {
              t = lane.asm.take(m);
            } catch (e) {
              if (e instanceof BadChunkError) drop(lane, msg.subject, e.message, m);
              else fail(e as Error);
              return;
            }
            lane.asks.progress(performance.now());
            if (t) onTensor(t);
            check();
          },
          (e) => drop(lane, e.subject, e.problem),
          { onDecoded: times && ((ms) => (times.decode += ms)) },
        ),
      );
    }
    check();
  });
  // Whoever awaits `done` sees a failure; an early one must not count as unhandled meanwhile.
  done.catch(() => {});
  return {
    done,
    arm: () => arm(),
    bytes: () => lanes.reduce((n, l) => n + l.asm.bytes, 0),
    chunks: () => lanes.reduce((n, l) => n + l.asm.chunks, 0),
    dropped: () => dropped,
    requests: () => requests,
    close: () => {
      clearTimeout(timer);
      clearInterval(ticker);
      stops.forEach((stop) => stop());
    },
  };
}
