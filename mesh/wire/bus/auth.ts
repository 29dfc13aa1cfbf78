// A closed bus: the launcher runs nats-server with one user per role, and one per device for
// workers, each allowed only the subjects its part of the protocol needs. A credential's
// permissions are enforced by the server: a publish or subscription outside them is refused (and
// reported to that client), whatever the client does.
import { randomBytes } from 'node:crypto';
import { inboxOf } from './bus.ts';
import type { RunEvent } from '../messages/protocol.ts';
import { subjects, token } from './subjects.ts';
import { deviceBucket } from '../transfer/shelf.ts';

export const ROLES = ['launcher', 'supervisor', 'worker', 'reward', 'environment'] as const;
export type Role = (typeof ROLES)[number];
export interface Credential {
  user: string;
  pass: string;
}
/** A run's credentials: one per role, and for workers one per device of the plan. */
export interface RunCredentials {
  launcher: Credential;
  supervisor: Credential;
  reward: Credential;
  /** Environments (env-protocol.ts): they hear episode requests and answer them. */
  environment: Credential;
  /** By device: a worker beats, hears calls and answers as its own device only. */
  workers: Record<number, Credential>;
}

export interface Permissions {
  publish: string[];
  subscribe: string[];
  /** Whether it may answer requests it received (once each, to their reply subjects only). */
  responses: boolean;
}

/** Which run events each role may publish; nobody else publishes any. */
export const EVENTS_BY_ROLE = {
  launcher: ['done', 'exit', 'log'],
  supervisor: ['phase', 'progress', 'log', 'recovered', 'lost', 'cordoned'],
} as const satisfies Partial<Record<Role, ReadonlyArray<RunEvent['type']>>>;

const workerUser = (run: string, device: number) => `worker${token('device', device)}-${run}`;

/** The device a worker credential is for, from its user name; undefined for any other user. */
export function deviceOfUser(run: string, user: string | undefined): number | undefined {
  const m = user?.match(/^worker(\d+)-(.+)$/);
  return m && m[2] === run ? Number(m[1]) : undefined;
}

export function makeCredentials(run: string, devices: readonly number[]): RunCredentials {
  token('run id', run);
  const secret = () => randomBytes(18).toString('base64url');
  const role = (r: Role) => ({ user: `${r}-${run}`, pass: secret() });
  return {
    launcher: role('launcher'),
    supervisor: role('supervisor'),
    reward: role('reward'),
    environment: role('environment'),
    workers: Object.fromEntries(devices.map((d) => [d, { user: workerUser(run, d), pass: secret() }])),
  };
}

/**
 * What each role may publish and subscribe to, for one run. Every reply travels as a response
 * (to the reply subject of a request that reached this client, once), and every client hears
 * replies on its own inbox prefix only (bus.ts's `inboxOf`): nobody can answer for another, or
 * read another's answers.
 */
export function permissions(run: string, devices: readonly number[]): Omit<Record<Role, Permissions>, 'worker'> & { workers: Record<number, Permissions> } {
  const s = subjects(run);
  // Every reward service's subjects (reward-protocol.ts): requests, one instance's requests, presence.
  const rewards = { all: 'ferry.reward.>', request: 'ferry.reward.*', instance: 'ferry.reward.*.i.*', presence: 'ferry.reward.*.hb' };
  // Every environment's (env-protocol.ts): a generating worker plays episodes on one instance's subject.
  const envs = { all: 'ferry.env.>', instance: 'ferry.env.*.i.*', presence: 'ferry.env.*.hb' };
  const inbox = (r: Role) => `${inboxOf(`${r}-${run}`)}.>`;
  return {
    // It hears the run, kills processes at chaos points, and says when processes exit and the run is done.
    launcher: {
      publish: [...EVENTS_BY_ROLE.launcher.map((t) => s.event(t)), s.cordon],
      subscribe: [s.events, s.chaos, s.supervisorBeat, s.heartbeats, inbox('launcher')],
      responses: true,
    },
    // It alone writes the run's JetStream stream, KV bucket and snapshots, sends calls and go, and
    // asks reward actors; its chunks and receipts, as the supervisor.
    supervisor: {
      publish: [
        s.calls,
        s.allGo,
        s.chunksFrom('supervisor'),
        s.receiptsFrom('supervisor'),
        s.allResults,
        s.supervisorBeat,
        s.chaos,
        ...EVENTS_BY_ROLE.supervisor.map((t) => s.event(t)),
        '$JS.API.>',
        `$KV.ferry-${run}.>`,
        `$O.ferry-${run}-snapshots.>`,
        // The devices' snapshot buckets: it reads them, and deletes the objects of snapshots it dropped.
        ...devices.map((d) => `$O.${deviceBucket(run, d)}.>`),
        '$JS.ACK.>',
        '$JS.FC.>',
        rewards.request,
        rewards.instance,
        // A warm-up from an environment's expert asks one of its instances.
        envs.instance,
      ],
      subscribe: [s.join, s.joins, s.cordon, s.heartbeats, s.events, s.allReady, s.allChunks, s.allReceipts, s.allTurns, s.allSamples, inbox('supervisor'), rewards.presence, envs.presence],
      responses: true,
    },
    // Its own heartbeats and calls, the chunks, receipts and collectives it sends (as its device
    // only: each names its sender in its subject), its own snapshot bucket (and reading the
    // others'), and nothing on results, events, go or the run's state. It hears the supervisor beat (a `done` while it beats is not the run's end). A
    // worker hosting a learned reward model serves it as a reward actor; a generating one plays episodes against environments.
    workers: Object.fromEntries(
      devices.map((d) => [
        d,
        {
          publish: [
            s.joinAs(d),
            s.heartbeat(d),
            s.turns(d),
            s.samples(d),
            s.chaos,
            s.allReady,
            s.chunksFrom(d),
            s.receiptsFrom(d),
            s.collectivesFrom(d),
            rewards.presence,
            envs.instance,
            ...bucketRights(run, d, devices),
          ],
          subscribe: [s.call(d), s.events, s.supervisorBeat, s.allGo, s.allChunks, s.allReceipts, s.collectivesTo(d), `${inboxOf(workerUser(run, d))}.>`, rewards.all, envs.presence],
          responses: true,
        },
      ]),
    ),
    // A reward actor hears reward requests, says it is there, and answers: nothing else.
    reward: { publish: [rewards.presence], subscribe: [rewards.all], responses: true },
    // An environment hears episode requests, says it is there, and answers: nothing else.
    environment: { publish: [envs.presence], subscribe: [envs.all], responses: true },
  };
}

/**
 * What a worker needs of the snapshot buckets (mesh/wire/transfer/shelf.ts): to write its own device's —
 * read its metadata (an object's, before it is replaced), purge it (the chunks of an object
 * replaced), publish its chunks and metadata — and to read any device's (look up its stream, read
 * a message by subject, and chunks by direct get), to reload a rank from the snapshot. It may not
 * create a bucket: the supervisor creates every device's (a stream's subjects are its creator's
 * to choose, and could be anyone's). Acknowledgements come to its own inbox.
 */
function bucketRights(run: string, device: number, devices: readonly number[]): string[] {
  const own = `OBJ_${deviceBucket(run, device)}`;
  return [
    '$JS.API.INFO',
    `$JS.API.STREAM.PURGE.${own}`,
    `$O.${deviceBucket(run, device)}.>`,
    ...devices.flatMap((d) => {
      const stream = `OBJ_${deviceBucket(run, d)}`;
      return [`$JS.API.STREAM.INFO.${stream}`, `$JS.API.STREAM.MSG.GET.${stream}`, `$JS.API.DIRECT.GET.${stream}`];
    }),
  ];
}

/**
 * The nats-server configuration block for a run's credentials. `replySeconds`: how long after a
 * request its answer may still come (a call's longest time): the server forgets a reply subject
 * after that.
 */
export function authConfig(run: string, creds: RunCredentials, o: { replySeconds?: number } = {}): string {
  const devices = Object.keys(creds.workers).map(Number);
  const perms = permissions(run, devices);
  const list = (xs: string[]) => `[${xs.map((x) => JSON.stringify(x)).join(', ')}]`;
  const expires = `${Math.ceil(o.replySeconds ?? 3600)}s`;
  const user = (c: Credential, p: Permissions) =>
    `    { user: ${JSON.stringify(c.user)}, password: ${JSON.stringify(c.pass)}, permissions: { publish: { allow: ${list(p.publish)} }, subscribe: { allow: ${list(p.subscribe)} }${p.responses ? `, allow_responses: { max: 1, expires: "${expires}" }` : ''} } }`;
  const users = [
    user(creds.launcher, perms.launcher),
    user(creds.supervisor, perms.supervisor),
    user(creds.reward, perms.reward),
    user(creds.environment, perms.environment),
    ...devices.map((d) => user(creds.workers[d]!, perms.workers[d]!)),
  ];
  return `authorization {\n  users: [\n${users.join('\n')}\n  ]\n}`;
}
