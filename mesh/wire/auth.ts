// A closed bus: the launcher runs nats-server with one user per role, each allowed only the
// subjects its role needs. A credential's permissions are enforced by the server: a publish or
// subscription outside them is refused (and reported to that client), whatever the client does.
import { randomBytes } from 'node:crypto';
import { subjects, token } from './subjects.ts';

export const ROLES = ['launcher', 'supervisor', 'worker', 'reward'] as const;
export type Role = (typeof ROLES)[number];
export type RunCredentials = Record<Role, { user: string; pass: string }>;

export function makeCredentials(run: string): RunCredentials {
  token('run id', run);
  return Object.fromEntries(ROLES.map((role) => [role, { user: `${role}-${run}`, pass: randomBytes(18).toString('base64url') }])) as RunCredentials;
}

/** What each role may publish and subscribe to, for one run. */
export function permissions(run: string): Record<Role, { publish: string[]; subscribe: string[]; responses: boolean }> {
  const s = subjects(run);
  const runAll = `${s.root}.>`;
  // JetStream, KV and Object Store are reached through these (the supervisor keeps the run's state there).
  const jetstream = ['$JS.API.>', '$KV.>', '$O.>', '$JS.ACK.>', '$JS.FC.>'];
  return {
    launcher: { publish: ['>'], subscribe: ['>'], responses: true },
    supervisor: {
      publish: [runAll, ...jetstream, '_INBOX.>', 'ferry.reward.*', 'ferry.reward.*.i.*'],
      subscribe: [runAll, '_INBOX.>', 'ferry.reward.*.hb'],
      responses: true,
    },
    // Workers talk within their run; a worker hosting a learned reward model serves it as a reward actor.
    worker: { publish: [runAll, '_INBOX.>', 'ferry.reward.*.hb'], subscribe: [runAll, '_INBOX.>', 'ferry.reward.>'], responses: true },
    // A reward actor hears reward requests, says it is there, and answers: nothing else.
    reward: { publish: ['ferry.reward.*.hb'], subscribe: ['ferry.reward.>'], responses: true },
  };
}

/** The nats-server configuration block for a run's credentials. */
export function authConfig(run: string, creds: RunCredentials): string {
  const perms = permissions(run);
  const list = (xs: string[]) => `[${xs.map((x) => JSON.stringify(x)).join(', ')}]`;
  const users = ROLES.map((role) => {
    const p = perms[role];
    return `    { user: ${JSON.stringify(creds[role].user)}, password: ${JSON.stringify(creds[role].pass)}, permissions: { publish: { allow: ${list(p.publish)} }, subscribe: { allow: ${list(p.subscribe)} }${p.responses ? ', allow_responses: true' : ''} } }`;
  });
  return `authorization {\n  users: [\n${users.join('\n')}\n  ]\n}`;
}
