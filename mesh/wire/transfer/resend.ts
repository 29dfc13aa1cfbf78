// A receiver's requests to send chunks again: which it has asked for, how often, and when to ask
// again. Pure bookkeeping over a clock the caller passes in, so the retry policy is testable
// without a bus and without sleeping.
//
// This is NAK-based recovery, as in reliable multicast (PGM, RFC 3208): the sender publishes once
// to every receiver, and a receiver that lacks a chunk asks for it. A request waits for its answer
// while its transfer is quiet: chunks still flowing from the sender mean it is alive and the
// answer is queued behind them, so only quiet time counts against a request.

export interface ResendPolicy {
  /** How long a request may go unanswered, with its transfer quiet, before the receiver asks again. */
  afterMs: number;
  /** Requests per chunk: when the last goes unanswered too, the transfer fails. */
  tries: number;
}

/**
 * A sender answers from its event loop in milliseconds; two quiet seconds mean the request or its
 * answer was lost. Four requests give a sender that does not answer 8 s before the transfer
 * fails with its name, well inside a transfer's own timeout.
 */
export const RESEND: ResendPolicy = { afterMs: 2000, tries: 4 };

export interface ResendRequest {
  tensor: string;
  offset: number;
  /** Requests sent so far (0: noted, not yet sent). */
  tries: number;
  /** When the last request was sent. */
  asked: number;
  /** Why the chunk is wanted, the latest reason: what the error says if it never comes right. */
  problem: string;
}

export class Resends {
  private readonly open = new Map<string, ResendRequest>();
  private quietSince = Number.NEGATIVE_INFINITY;

  constructor(readonly policy: ResendPolicy = RESEND) {}

  /** Notes that the chunk holding `offset` of `tensor` is wanted again; it is sent at the next `due`. */
  want(tensor: string, offset: number, problem: string): void {
    const key = `${offset}:${tensor}`;
    const r = this.open.get(key);
    if (r) r.problem = problem;
    else this.open.set(key, { tensor, offset, tries: 0, asked: 0, problem });
  }

  /** Whether a request for the chunk holding `offset` of `tensor` is open. */
  has(tensor: string, offset: number): boolean {
    return this.open.has(`${offset}:${tensor}`);
  }

  /** The transfer moved (a good chunk, its `sent`): open requests wait from now. */
  progress(now: number): void {
    this.quietSince = now;
  }

  get size(): number {
    return this.open.size;
  }

  /**
   * The requests to send now — new ones, and those unanswered for the policy's quiet time — with
   * their tries counted; or the first that has been asked for as often as the policy allows and is
   * still unanswered. `lacks` says whether a chunk is still wanted: those that came are forgotten.
   */
  due(now: number, lacks: (tensor: string, offset: number) => boolean): { send: ResendRequest[]; exhausted?: ResendRequest } {
    const send: ResendRequest[] = [];
    for (const [key, r] of this.open) {
      if (!lacks(r.tensor, r.offset)) {
        this.open.delete(key);
        continue;
      }
      if (r.tries > 0 && now - Math.max(r.asked, this.quietSince) < this.policy.afterMs) continue;
      if (r.tries >= this.policy.tries) return { send: [], exhausted: r };
      r.tries += 1;
      r.asked = now;
      send.push(r);
    }
    return { send };
  }
}
