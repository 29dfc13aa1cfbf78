// The player's side of the environment protocol (env-protocol.ts): it keeps track of the instances
// serving an environment, starts each episode on one of them and sends its steps there, and holds
// every reply to the contract. An instance that fails a request (gone, too slow, a malformed or
// error reply, an unknown episode) is left for another: the episode is reset there and its
// recorded actions replayed (their observations are not used: the record is what the policy saw),
// then the request is sent again. After `retries` such moves the call fails naming the service,
// the instance and the problem. Nothing is made up: every observation comes from an environment.
import { randomUUID } from 'node:crypto';
import { unpack } from 'msgpackr';
import type { Bus } from '../bus/bus.ts';
import { decode, encode, ProtocolError } from '../messages/codec.ts';
import { ENV_PROTOCOL_VERSION, EnvPresence, EnvReply, envSubjects, type EnvDemonstration, type EnvObservation, type EnvTask } from './env-protocol.ts';
import { describeRequestError, isGone, Presence } from './presence.ts';

export class EnvCallError extends Error {
  override name = 'EnvCallError';
  /** No instance came within the wait: trying again would not bring one, so the run stops. */
  readonly fatal: boolean;
  constructor(message: string, options: { fatal?: boolean } = {}) {
    super(message);
    this.fatal = options.fatal ?? false;
  }
}

export interface EnvClientOptions {
  /** The run asking (for the environment's logs). */
  run: string;
  /** How long one request may take. */
  timeoutMs: number;
  /** Further attempts after the first, each on another instance where there is one. */
  retries: number;
  /** How long to wait for an instance to appear before giving up. */
  waitMs: number;
  presenceMs?: number;
  say?: (line: string) => void;
}

/** One reply of the environment: what the policy reads next, and the step's reward. */
export interface EnvTurn {
  observation: string;
  reward: number;
  done: boolean;
  info?: Record<string, number>;
  /** The instance that answered. */
  instance: string;
}

interface Episode {
  task: EnvTask;
  maxTurns: number;
  /** The actions sent so far (a move to another instance replays them). */
  actions: string[];
  /** Where it lives; undefined before its reset and after its instance failed. */
  instance?: string;
}

export class EnvClient {
  readonly subj;
  private readonly presence: Presence;
  private readonly episodes = new Map<string, Episode>();
  private turn = 0;

  constructor(
    private readonly nc: Bus,
    readonly name: string,
    private readonly o: EnvClientOptions,
  ) {
    this.subj = envSubjects(name);
    this.presence = new Presence(nc, this.subj.presence, EnvPresence, ENV_PROTOCOL_VERSION, `environment '${name}'`, o);
  }

  /** Instances heard from recently, in a fixed order. */
  instances(): string[] {
    return this.presence.live();
  }

  /** Waits until an instance is present; EnvCallError (fatal) after `waitMs`. */
  async ready(): Promise<void> {
    await this.someInstance(new Set(), []);
  }

  close(): void {
    this.presence.close();
  }

  /** Starts `episode` on an instance: its first observation. */
  async reset(episode: string, task: EnvTask, maxTurns: number): Promise<EnvTurn> {
    const ep: Episode = { task, maxTurns, actions: [] };
    this.episodes.set(episode, ep);
    return this.withRetries(episode, ep, 'reset', (instance) => this.send(instance, episode, { type: 'env.reset', task, max_turns: maxTurns }));
  }

  /**
   * Takes up an episode whose first `actions` were answered earlier (a generation played again
   * after a fault reads those answers from its record): its next step goes to an instance that is
   * first brought there by a reset and the actions, replayed.
   */
  resume(episode: string, task: EnvTask, maxTurns: number, actions: readonly string[]): void {
    this.episodes.set(episode, { task, maxTurns, actions: [...actions] });
  }

  /** The episode's next action: the environment's answer. */
  async step(episode: string, action: string): Promise<EnvTurn> {
    const ep = this.episodes.get(episode);
    if (!ep) throw new EnvCallError(`environment '${this.name}': episode ${episode} was never reset`);
    const turn = ep.actions.length + 1;
    const out = await this.withRetries(episode, ep, `step ${turn}`, (instance) => this.send(instance, episode, { type: 'env.step', turn, action }));
    ep.actions.push(action);
    return out;
  }

  /**
   * An episode the environment's expert plays (`env.demo`), for a warm-up: on any instance, moved
   * to another when one fails, as a step is. An environment without an expert answers an error,
   * which fails the call at once (no instance would do better).
   */
  async demonstrate(episode: string, task: EnvTask, maxTurns: number): Promise<Omit<EnvDemonstration, 'type' | 'v' | 'id'>> {
    const failures: string[] = [];
    const failed = new Set<string>();
    for (let attempt = 0; attempt <= this.o.retries; attempt++) {
      const instance = await this.someInstance(failed, failures);
      try {
        const d = (await this.exchange(instance, episode, { type: 'env.demo', task, max_turns: maxTurns }, 'env.demonstration')) as EnvDemonstration;
        if (d.turns.length > maxTurns)
          throw new EnvCallError(`environment '${this.name}' (instance ${instance}) demonstrated ${d.turns.length} turns of episode ${episode}; its budget is ${maxTurns}`);
        return { instance: d.instance, episode: d.episode, observation: d.observation, turns: d.turns };
      } catch (e) {
        if (e instanceof EnvCallError && /could not answer env\.demo/.test(e.message)) throw e;
        const why = e instanceof EnvCallError ? e.message : `environment '${this.name}' (instance ${instance}): ${describeRequestError(e, this.o.timeoutMs)}`;
        failures.push(`demonstration of episode ${episode}: ${why}`);
        this.o.say?.(why);
        failed.add(instance);
        if (!(e instanceof EnvCallError) && isGone(e)) this.presence.forget(instance);
      }
    }
    throw new EnvCallError(`environment '${this.name}': ${failures.length} attempt(s) failed: ${failures.join('; ')}`);
  }

  /** Ends the episode where it lives; a failure to close loses nothing and is only said. */
  async end(episode: string): Promise<void> {
    const ep = this.episodes.get(episode);
    this.episodes.delete(episode);
    if (!ep?.instance) return;
    try {
      await this.send(ep.instance, episode, { type: 'env.close' }, 'env.closed');
    } catch (e) {
      this.o.say?.(`environment '${this.name}' (instance ${ep.instance}): closing episode ${episode}: ${(e as Error).message}`);
    }
  }

  /** Closes every episode still open (the end of a generate call, also on failure). */
  async endAll(): Promise<void> {
    await Promise.all([...this.episodes.keys()].map((e) => this.end(e)));
  }

  private async withRetries(episode: string, ep: Episode, what: string, request: (instance: string) => Promise<EnvTurn>): Promise<EnvTurn> {
    const failures: string[] = [];
    const failed = new Set<string>();
    for (let attempt = 0; attempt <= this.o.retries; attempt++) {
      let instance = ep.instance;
      try {
        if (instance === undefined || failed.has(instance)) {
          instance = await this.someInstance(failed, failures);
          ep.instance = instance;
          // A step on a new instance: bring it to where the episode is, from the record.
          if (what !== 'reset') await this.replay(instance, episode, ep);
        }
        return await request(instance);
      } catch (e) {
        if (e instanceof EnvCallError && e.fatal) throw e;
        const where = instance ?? '?';
        const why = e instanceof EnvCallError ? e.message : `environment '${this.name}' (instance ${where}): ${describeRequestError(e, this.o.timeoutMs)}`;
        failures.push(`${what} of episode ${episode}: ${why}`);
        this.o.say?.(`${why}${attempt < this.o.retries ? `; trying ${what} of episode ${episode} again` : ''}`);
        if (instance !== undefined) failed.add(instance);
        if (instance !== undefined && !(e instanceof EnvCallError) && isGone(e)) this.presence.forget(instance);
        ep.instance = undefined;
      }
    }
    throw new EnvCallError(`environment '${this.name}': ${failures.length} attempt(s) failed: ${failures.join('; ')}`);
  }

  private async replay(instance: string, episode: string, ep: Episode): Promise<void> {
    await this.send(instance, episode, { type: 'env.reset', task: ep.task, max_turns: ep.maxTurns });
    for (let i = 0; i < ep.actions.length; i++) await this.send(instance, episode, { type: 'env.step', turn: i + 1, action: ep.actions[i]!, replay: true });
  }

  /** A present instance, preferring ones that have not failed this request; waits up to `waitMs` for one. */
  private async someInstance(failed: Set<string>, failures: string[]): Promise<string> {
    const since = Date.now();
    let said = false;
    for (;;) {
      const live = this.presence.live();
      if (live.length) {
        const fresh = live.filter((i) => !failed.has(i));
        const pool = fresh.length ? fresh : live;
        return pool[this.turn++ % pool.length]!;
      }
      if (Date.now() - since > this.o.waitMs) {
        throw new EnvCallError(
          `no environment '${this.name}' appeared on ${this.subj.presence} within ${this.o.waitMs / 1000} s (its wait_seconds)${failures.length ? `; earlier attempts: ${failures.join('; ')}` : ''}`,
          { fatal: true },
        );
      }
      if (!said) this.o.say?.(`waiting for an environment '${this.name}' (none is serving ${this.subj.request}); giving up in ${this.o.waitMs / 1000} s`);
      said = true;
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  private async send(instance: string, episode: string, body: Record<string, unknown> & { type: string }, expect: 'env.observation' | 'env.closed' = 'env.observation'): Promise<EnvTurn> {
    const reply = await this.exchange(instance, episode, body, expect);
    if (reply.type === 'env.closed') return { observation: '', reward: 0, done: true, instance };
    const obs = reply as EnvObservation;
    return { observation: obs.observation, reward: obs.reward, done: obs.done, ...(obs.info ? { info: obs.info } : {}), instance };
  }

  /** A request to one instance and its reply, held to the contract: of the expected type, for this request and episode. */
  private async exchange(instance: string, episode: string, body: Record<string, unknown> & { type: string }, expect: 'env.observation' | 'env.closed' | 'env.demonstration'): Promise<EnvReply> {
    const id = randomUUID().slice(0, 12);
    const msg = await this.nc.request(this.subj.instance(instance), encode({ ...body, v: ENV_PROTOCOL_VERSION, id, run: this.o.run, episode }), { timeout: this.o.timeoutMs });
    const who = `environment '${this.name}' (instance ${instance})`;
    let reply: EnvReply;
    try {
      reply = decode(this.subj.instance(instance), msg.data, EnvReply, ENV_PROTOCOL_VERSION);
    } catch (e) {
      let theirs = '';
      try {
        const raw = unpack(msg.data) as { type?: unknown; message?: unknown };
        if (raw?.type === 'env.error' && typeof raw.message === 'string') theirs = `; it said: ${raw.message}`;
      } catch {
        // not msgpack at all: the problem says so
      }
      throw new EnvCallError(`${who} sent a malformed reply to ${body.type}: ${e instanceof ProtocolError ? e.problem : (e as Error).message}${theirs}`);
    }
    if (reply.type === 'env.error') throw new EnvCallError(`${who} could not answer ${body.type} of episode ${episode}: ${reply.message}`);
    if (reply.id !== id) throw new EnvCallError(`${who} answered request ${reply.id}, expected ${id}`);
    if (reply.episode !== episode) throw new EnvCallError(`${who} answered for episode ${reply.episode}, expected ${episode}`);
    if (reply.type !== expect) throw new EnvCallError(`${who} answered ${body.type} with ${reply.type}, expected ${expect}`);
    return reply;
  }
}
