// serveEnvironment: a multi-turn environment in a few lines of TypeScript. It answers the
// environment protocol (docs/environment-protocol.md) for the service `name`: requests on the
// shared subject in its queue group and on its own instance subject, a presence beat every second,
// one state per episode, typed error replies for requests it cannot read or answer.
//
//   const env = await serveEnvironment({ nats: 'nats://127.0.0.1:4222', name: 'guess',
//     reset: (task) => ({ state: { secret: 1 + (task.seed % 10) }, observation: 'Guess 1..10.' }),
//     step: (s, action) => ({ observation: +action === s.secret ? 'yes' : 'no', reward: +(+action === s.secret), done: +action === s.secret }) });
//   ...
//   await env.stop();
import { randomUUID } from 'node:crypto';
import { answerable, type Bus, type Msg } from '../bus/bus.ts';
import { serveInstance } from './service.ts';
import { decode, encode, ProtocolError } from '../messages/codec.ts';
import { ENV_PROTOCOL_VERSION, EnvRequest, envSubjects, type EnvTask } from './env-protocol.ts';

/** What a step answers; `reward` defaults to 0. */
export interface EnvStepResult {
  observation: string;
  reward?: number;
  done: boolean;
  info?: Record<string, number>;
}

export interface ServeEnvironmentOptions<S> {
  /** A connection (any ferry Bus), or a server URL to connect to (with the credentials in `user`/`pass`). */
  nats: Bus | string;
  user?: string;
  pass?: string;
  name: string;
  /** A new episode: its state (kept by this instance until the episode closes) and first observation. */
  reset: (task: EnvTask, episode: { id: string; maxTurns: number }) => { state: S; observation: string } | Promise<{ state: S; observation: string }>;
  /** One action of the policy: what it sees next. May change `state` in place. */
  step: (state: S, action: string, turn: { turn: number; episode: string; replay: boolean }) => EnvStepResult | Promise<EnvStepResult>;
  /**
   * Optional: how an expert plays, for a warm-up to learn from (`env.demo`). It sees what the
   * policy would see — the first observation and the turns so far — never the state, and gives
   * the next action; the helper plays the episode with `reset` and `step` on a state of its own.
   */
  expert?: (seen: { observation: string; turns: ReadonlyArray<{ action: string; observation: string }> }) => string;
  /** This instance's id (letters, digits, '-', '_'); random by default. */
  instance?: string;
  log?: (line: string) => void;
}

export interface EnvironmentServer {
  name: string;
  instance: string;
  /** Episodes open on this instance. */
  readonly open: number;
  /** Requests answered so far. */
  readonly answered: number;
  stop(): Promise<void>;
}

export async function serveEnvironment<S>(o: ServeEnvironmentOptions<S>): Promise<EnvironmentServer> {
  const subj = envSubjects(o.name);
  const instance = o.instance ?? randomUUID().slice(0, 8);
  const log = o.log ?? (() => {});
  const episodes = new Map<string, S>();
  let answered = 0;
  const reply = (msg: Msg, body: Record<string, unknown> & { type: string }) => {
    if (answerable(msg)) msg.respond(encode({ ...body, v: ENV_PROTOCOL_VERSION, instance }));
  };
  const handle = async (msg: Msg) => {
    let r: EnvRequest;
    try {
      r = decode(msg.subject, msg.data, EnvRequest, ENV_PROTOCOL_VERSION);
    } catch (e) {
      const message = e instanceof ProtocolError ? e.problem : String(e);
      log(`refused a request: ${message}`);
      reply(msg, { type: 'env.error', message: `environment '${o.name}' (${instance}) cannot read the request: ${message}` });
      return;
    }
    try {
      if (r.type === 'env.reset') {
        const { state, observation } = await o.reset(r.task, { id: r.episode, maxTurns: r.max_turns });
        episodes.set(r.episode, state);
        reply(msg, { type: 'env.observation', id: r.id, episode: r.episode, observation, reward: 0, done: false });
      } else if (r.type === 'env.step') {
        if (!episodes.has(r.episode)) throw new Error(`unknown episode ${r.episode} (never reset here, or closed)`);
        const out = await o.step(episodes.get(r.episode)!, r.action, { turn: r.turn, episode: r.episode, replay: r.replay ?? false });
        reply(msg, { type: 'env.observation', id: r.id, episode: r.episode, observation: out.observation, reward: out.reward ?? 0, done: out.done, ...(out.info ? { info: out.info } : {}) });
      } else if (r.type === 'env.demo') {
        if (!o.expert) throw new Error('this environment has no expert to demonstrate with (serveEnvironment without `expert`)');
        const first = await o.reset(r.task, { id: r.episode, maxTurns: r.max_turns });
        const turns: Array<{ action: string; observation: string }> = [];
        for (let turn = 1; turn <= r.max_turns; turn++) {
          const action = o.expert({ observation: first.observation, turns });
          const out = await o.step(first.state, action, { turn, episode: r.episode, replay: false });
          turns.push({ action, observation: out.done ? '' : out.observation });
          if (out.done) break;
        }
        reply(msg, { type: 'env.demonstration', id: r.id, episode: r.episode, observation: first.observation, turns });
      } else {
        episodes.delete(r.episode);
        reply(msg, { type: 'env.closed', id: r.id, episode: r.episode });
      }
      answered += 1;
    } catch (e) {
      log(`could not answer ${r.type} of episode ${r.episode}: ${(e as Error).message}`);
      reply(msg, { type: 'env.error', id: r.id, message: `environment '${o.name}' (${instance}): ${(e as Error).message}` });
    }
  };
  const service = await serveInstance(o.nats, {
    client: `ferry-env-${o.name}-${instance}`,
    user: o.user,
    pass: o.pass,
    subjects: subj,
    instance,
    hello: () => encode({ type: 'env.hello', v: ENV_PROTOCOL_VERSION, name: o.name, instance }),
    handle: (m) => void handle(m),
  });
  log(`serving environment '${o.name}' as instance ${instance}`);
  return {
    name: o.name,
    instance,
    get open() {
      return episodes.size;
    },
    get answered() {
      return answered;
    },
    stop: () => service.stop(),
  };
}
