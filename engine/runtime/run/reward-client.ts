// The supervisor's side of the reward protocol: it keeps track of the instances serving a reward
// (their presence beats), sends each request to one of them, and holds the reply to its contract.
// No instance yet: it waits, says so, and gives up after `waitMs`. A slow instance: the request
// times out and goes to the next instance (or the same one again if it is alone). A malformed
// reply (wrong length, wrong ids, a number that is not finite, bytes that are not the protocol,
// another version) is refused with an error that names the instance, and the request goes
// elsewhere. Every item gets a score from an actor, or the call fails: nothing is made up.
import { randomUUID } from 'node:crypto';
import { unpack } from 'msgpackr';
import type { Bus } from '../../../mesh/wire/index.ts';
import { decode, encode, ProtocolError } from '../../../mesh/wire/index.ts';
import { REWARD_PROTOCOL_VERSION, RewardPresence, RewardReply, rewardSubjects, type RewardItem } from '../../../mesh/wire/index.ts';
import { describeRequestError, isGone, Presence } from '../../../mesh/wire/index.ts';

export class RewardCallError extends Error {
  override name = 'RewardCallError';
  /** No instance came within the wait: recovering would not bring one, so the run stops. */
  readonly fatal: boolean;
  constructor(message: string, options: { fatal?: boolean } = {}) {
    super(message);
    this.fatal = options.fatal ?? false;
  }
}

export interface RewardClientOptions {
  /** How long one request may take. */
  timeoutMs: number;
  /** Further attempts after the first, each on the next instance. */
  retries: number;
  /** How long to wait for an instance to appear before giving up. */
  waitMs: number;
  /** An instance silent this long is gone. */
  presenceMs?: number;
  /** Says what it is waiting for, and what it refused. */
  say?: (line: string) => void;
}

export class RewardClient {
  private readonly subj;
  private readonly presence: Presence;
  private turn = 0;

  constructor(
    private readonly nc: Bus,
    readonly name: string,
    private readonly o: RewardClientOptions,
  ) {
    this.subj = rewardSubjects(name);
    this.presence = new Presence(nc, this.subj.presence, RewardPresence, REWARD_PROTOCOL_VERSION, `reward actor '${name}'`, o);
  }

  /** Instances heard from recently, in a fixed order. */
  instances(): string[] {
    return this.presence.live();
  }

  close(): void {
    this.presence.close();
  }

  /** One score per item, from the reward actors; throws RewardCallError when none gives them. */
  async score(run: string, iteration: number, items: RewardItem[]): Promise<number[]> {
    const id = `${run}.${iteration}.${randomUUID().slice(0, 8)}`;
    const body = encode({ type: 'reward.request', v: REWARD_PROTOCOL_VERSION, id, run, iteration, items });
    const failures: string[] = [];
    /** Instances that failed this request: a retry goes elsewhere when anyone else is there. */
    const failed = new Set<string>();
    let waitingSince: number | undefined;
    let waited = false;
    for (let attempt = 0; attempt <= this.o.retries; ) {
      const live = this.instances();
      if (live.length === 0) {
        waitingSince ??= Date.now();
        if (Date.now() - waitingSince > this.o.waitMs) {
          throw new RewardCallError(
            `no reward actor '${this.name}' appeared on ${this.subj.presence} within ${this.o.waitMs / 1000} s (its wait_seconds)` +
              (failures.length ? `; earlier attempts: ${failures.join('; ')}` : '; start one, e.g. node examples/reward-actor/ascending.mjs'),
            { fatal: true },
          );
        }
        if (!waited) this.o.say?.(`waiting for a reward actor '${this.name}' (none is serving ${this.subj.request}); giving up in ${this.o.waitMs / 1000} s`);
        waited = true;
        await new Promise((r) => setTimeout(r, 250));
        continue;
      }
      waitingSince = undefined;
      // Round robin over the live instances, those that failed this request last.
      const fresh = live.filter((i) => !failed.has(i));
      const pool = fresh.length ? fresh : live;
      const instance = pool[this.turn++ % pool.length]!;
      attempt += 1;
      try {
        const msg = await this.nc.request(this.subj.instance(instance), body, { timeout: this.o.timeoutMs });
        return this.check(instance, id, items, msg.data);
      } catch (e) {
        failed.add(instance);
        const why = e instanceof RewardCallError ? e.message : `reward actor '${this.name}' (instance ${instance}): ${describeRequestError(e, this.o.timeoutMs)}`;
        failures.push(why);
        this.o.say?.(`${why}${attempt <= this.o.retries ? '; trying again' : ''}`);
        // Nobody subscribed to its subject: it is gone (its presence would say so within seconds).
        if (!(e instanceof RewardCallError) && isGone(e)) this.presence.forget(instance);
      }
    }
    throw new RewardCallError(`reward '${this.name}': ${failures.length} attempt(s) failed: ${failures.join('; ')}`);
  }

  /** The reply, held to the contract: the request's id, one finite score per item, the items' ids in order. */
  private check(instance: string, id: string, items: RewardItem[], data: Uint8Array): number[] {
    const who = `reward actor '${this.name}' (instance ${instance})`;
    let reply: RewardReply;
    try {
      reply = decode(this.subj.instance(instance), data, RewardReply, REWARD_PROTOCOL_VERSION);
    } catch (e) {
      // An error reply in another version still says what went wrong: keep its words.
      let theirs = '';
      try {
        const raw = unpack(data) as { type?: unknown; message?: unknown };
        if (raw?.type === 'reward.error' && typeof raw.message === 'string') theirs = `; it said: ${raw.message}`;
      } catch {
        // not msgpack at all: the problem below says so
      }
      throw new RewardCallError(`${who} sent a malformed reply: ${e instanceof ProtocolError ? e.problem : (e as Error).message}${theirs}`);
    }
    if (reply.type === 'reward.error') throw new RewardCallError(`${who} could not score: ${reply.message}`);
    if (reply.id !== id) throw new RewardCallError(`${who} answered request ${reply.id}, expected ${id}`);
    if (reply.scores.length !== items.length) throw new RewardCallError(`${who} sent ${reply.scores.length} scores for ${items.length} items`);
    const out: number[] = [];
    for (let i = 0; i < items.length; i++) {
      const s = reply.scores[i]!;
      if (s.id !== items[i]!.id) throw new RewardCallError(`${who} sent score ${i} for item '${s.id}', expected item '${items[i]!.id}'`);
      if (!Number.isFinite(s.score)) throw new RewardCallError(`${who} sent ${s.score} for item '${s.id}'; scores must be finite numbers`);
      out.push(s.score);
    }
    return out;
  }
}
