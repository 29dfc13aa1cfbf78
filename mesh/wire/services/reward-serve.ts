// serveReward: a reward actor in a few lines of TypeScript. It answers the reward protocol
// (docs/reward-protocol.md) for the service `name`: requests on the shared subject in its queue
// group and on its own instance subject, a presence beat every second, typed error replies for
// requests it cannot read or score. Any number of instances may serve one name; they may join
// and leave while runs are going.
//
//   const rewards = await serveReward({ nats: 'nats://127.0.0.1:4222', name: 'length',
//     score: (items) => items.map((it) => it.response.length / 10) });
//   ...
//   await rewards.stop();
import { randomUUID } from 'node:crypto';
import { answerable, type Bus, type Msg } from '../bus/bus.ts';
import { serveInstance } from './service.ts';
import { decode, encode, ProtocolError } from '../messages/codec.ts';
import { REWARD_PROTOCOL_VERSION, RewardRequest, rewardSubjects, type RewardItem } from './reward-protocol.ts';

export interface ServeRewardOptions {
  /** A connection (any ferry Bus), or a server URL to connect to (with the credentials in `user`/`pass`). */
  nats: Bus | string;
  user?: string;
  pass?: string;
  name: string;
  /** One score per item, in order: finite numbers. May be async. */
  score: (items: RewardItem[], request: { run: string; iteration: number }) => number[] | Promise<number[]>;
  /** This instance's id (letters, digits, '-', '_'); random by default. */
  instance?: string;
  log?: (line: string) => void;
}

export interface RewardActor {
  name: string;
  instance: string;
  /** Requests answered with scores so far. */
  readonly answered: number;
  stop(): Promise<void>;
}

export async function serveReward(o: ServeRewardOptions): Promise<RewardActor> {
  const subj = rewardSubjects(o.name);
  const instance = o.instance ?? randomUUID().slice(0, 8);
  const log = o.log ?? (() => {});
  let answered = 0;
  const reply = (msg: Msg, body: Record<string, unknown> & { type: string }) => {
    if (answerable(msg)) msg.respond(encode({ ...body, v: REWARD_PROTOCOL_VERSION }));
  };
  const handle = async (msg: Msg) => {
    let request: RewardRequest;
    try {
      request = decode(msg.subject, msg.data, RewardRequest, REWARD_PROTOCOL_VERSION);
    } catch (e) {
      const message = e instanceof ProtocolError ? e.problem : String(e);
      log(`refused a request: ${message}`);
      reply(msg, { type: 'reward.error', instance, message: `reward actor '${o.name}' (${instance}) cannot read the request: ${message}` });
      return;
    }
    try {
      const scores = await o.score(request.items, { run: request.run, iteration: request.iteration });
      if (scores.length !== request.items.length) throw new Error(`the score function returned ${scores.length} scores for ${request.items.length} items`);
      const bad = scores.findIndex((s) => typeof s !== 'number' || !Number.isFinite(s));
      if (bad >= 0) throw new Error(`the score function returned ${scores[bad]} for item ${request.items[bad]!.id}; scores must be finite numbers`);
      reply(msg, { type: 'reward.reply', id: request.id, instance, scores: request.items.map((it, i) => ({ id: it.id, score: scores[i]! })) });
      answered += 1;
    } catch (e) {
      log(`could not score request ${request.id}: ${(e as Error).message}`);
      reply(msg, { type: 'reward.error', id: request.id, instance, message: `reward actor '${o.name}' (${instance}): ${(e as Error).message}` });
    }
  };
  const service = await serveInstance(o.nats, {
    client: `ferry-reward-${o.name}-${instance}`,
    user: o.user,
    pass: o.pass,
    subjects: subj,
    instance,
    hello: () => encode({ type: 'reward.hello', v: REWARD_PROTOCOL_VERSION, name: o.name, instance }),
    handle: (m) => void handle(m),
  });
  log(`serving reward '${o.name}' as instance ${instance}`);
  return {
    name: o.name,
    instance,
    get answered() {
      return answered;
    },
    stop: () => service.stop(),
  };
}
