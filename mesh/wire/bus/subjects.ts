// Every NATS subject ferry uses is built here, from typed parts. Nothing else concatenates
// subject strings, so a rename or a permission rule (issue 6) has one place to look.
import type { Party } from '../messages/protocol.ts';

/** A subject token: letters, digits, `-` and `_` only (no `.`, `*`, `>` or white space). */
const TOKEN = /^[A-Za-z0-9_-]+$/;

export class SubjectError extends Error {
  override name = 'SubjectError';
}

export function token(kind: string, value: string | number): string {
  const s = String(value);
  if (!TOKEN.test(s)) {
    throw new SubjectError(`${kind} must be letters, digits, '-' or '_' to fit in a NATS subject; got ${JSON.stringify(s)}`);
  }
  return s;
}

/** The subjects of one run. `run` isolates concurrent runs that share a server. */
export function subjects(run: string) {
  const root = `ferry.${token('run id', run)}`;
  return {
    root,
    /**
     * Workers announce themselves (request/reply); the supervisor answers with a device. A worker
     * that knows its device asks on its own subject, the only one its credential may use on a
     * closed bus, so that no other can say hello as it (while it is recovered, say); `join` is
     * for one that takes any free device (an open bus), `joins` hears them all.
     */
    join: `${root}.join`,
    joinAs: (device: number) => `${root}.join.${token('device', device)}`,
    joins: `${root}.join.*`,
    /** Calls to one device (request/reply). */
    call: (device: number) => `${root}.dev.${token('device', device)}.call`,
    calls: `${root}.dev.*.call`,
    /** Liveness beacons of one device; `heartbeats` matches them all. */
    heartbeat: (device: number) => `${root}.hb.${token('device', device)}`,
    heartbeats: `${root}.hb.*`,
    /** The supervisor's liveness beacon: the launcher kills a supervisor that goes silent. */
    supervisorBeat: `${root}.supervisor.hb`,
    /**
     * Parameter chunks of one transfer, from its sender; and what a receiver tells the sender
     * (resend a chunk, or everything arrived). Each party publishes on its own subjects, and the
     * server lets a device publish only as itself (auth.ts): a chunk or a receipt that names
     * another party than its subject's is forged. `transferChunks` and `transferReceipts` match
     * every party's.
     */
    chunks: (transfer: string, from: Party) => `${root}.xfer.${token('transfer id', transfer)}.chunk.${party(from)}`,
    receipts: (transfer: string, from: Party) => `${root}.xfer.${token('transfer id', transfer)}.receipt.${party(from)}`,
    transferChunks: (transfer: string) => `${root}.xfer.${token('transfer id', transfer)}.chunk.*`,
    transferReceipts: (transfer: string) => `${root}.xfer.${token('transfer id', transfer)}.receipt.*`,
    allChunks: `${root}.xfer.*.chunk.*`,
    allReceipts: `${root}.xfer.*.receipt.*`,
    /** Every transfer's chunks, or receipts, from one party: what it may publish. */
    chunksFrom: (from: Party) => `${root}.xfer.*.chunk.${party(from)}`,
    receiptsFrom: (from: Party) => `${root}.xfer.*.receipt.${party(from)}`,
    /** A reallocation's devices say they are subscribed; then the supervisor says go. */
    ready: (realloc: string) => `${root}.realloc.${token('reallocation id', realloc)}.ready`,
    go: (realloc: string) => `${root}.realloc.${token('reallocation id', realloc)}.go`,
    allReady: `${root}.realloc.*.ready`,
    allGo: `${root}.realloc.*.go`,
    /**
     * Activations, gradients and partial sums to one device from another (collectives), on the
     * sender's own subject as chunks are; `collectivesTo` matches every sender's.
     */
    collective: (to: number, from: number) => `${root}.coll.${token('device', to)}.${token('device', from)}`,
    collectivesTo: (to: number) => `${root}.coll.${token('device', to)}.*`,
    collectivesFrom: (from: number) => `${root}.coll.*.${token('device', from)}`,
    collectives: `${root}.coll.*.*`,
    /**
     * Run events (progress, warnings, errors) for launchers and observers, each on its own type's
     * subject, so that the server's permissions can say which role may publish which (auth.ts);
     * `events` matches them all.
     */
    event: (type: string) => `${root}.events.${token('event type', type)}`,
    events: `${root}.events.>`,
    /** A generating device's answers from environments, as they come (TurnLog); `allTurns` matches every device's. */
    turns: (device: number) => `${root}.turns.${token('device', device)}`,
    allTurns: `${root}.turns.*`,
    /** A device's samples of continuous generation, each as it ends (SampleLog); `allSamples` matches every device's. */
    samples: (device: number) => `${root}.samples.${token('device', device)}`,
    allSamples: `${root}.samples.*`,
    /** Chaos testing: scheduled kill points ask the launcher to kill them (request/reply). */
    chaos: `${root}.chaos`,
    /** A device lost for good (npm run cordon, or the launcher): the supervisor answers whether it re-plans without it (request/reply). */
    cordon: `${root}.cordon`,
    /** The run's JetStream stream of stage results (rollouts, scores), one subject per iteration and stage. */
    results: (iteration: number, stage: string) => `${root}.results.${token('iteration', iteration)}.${token('stage', stage)}`,
    allResults: `${root}.results.>`,
  } as const;
}

export type Subjects = ReturnType<typeof subjects>;

const party = (p: Party) => (p === 'supervisor' ? p : token('device', p));

/** The party whose own subject this is (a chunk's, a receipt's, a collective's: its last token). */
export function senderOf(subject: string): Party | undefined {
  const last = subject.slice(subject.lastIndexOf('.') + 1);
  return last === 'supervisor' ? last : /^\d+$/.test(last) ? Number(last) : undefined;
}

/** A run id from a scenario name and a time, safe as a subject token. */
export function runId(name: string, at: Date = new Date()): string {
  const stamp = at.toISOString().replace(/[-:]/g, '').replace(/\..*$/, '').replace('T', '-');
  const base = name.replace(/[^A-Za-z0-9_-]+/g, '-').replace(/^-+|-+$/g, '') || 'run';
  return `${base}-${stamp}`;
}
