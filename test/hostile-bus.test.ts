// A hostile bus. During a run on the default (closed) bus, a client holds each role's credential
// in turn — the launcher's, the supervisor's, a worker's (device 0's), the reward role's, the environment role's — and
// publishes on every subject that credential may publish: random bytes, msgpack that is not a
// message, another subject's message, this subject's message with the wrong protocol version, and
// well-formed forgeries; a client with no credential, or a wrong password, is refused. The run
// ends as a clean run of the same scenario ends: the same digests, rewards and tokens per
// iteration, the same rollouts (none lost or duplicated), the same checkpoint bytes, and no
// recovery.
//
// What a credential may legitimately say, no listener can tell from the real thing, and it is not
// sent here. The launcher's and the supervisor's credentials are the run's own (credentials.json,
// mode 0600): holding them is holding the run.
//   - launcher: `done` once the supervisor is silent (the workers leave); an escalation, a log at
//     level error from the launcher (the supervisor stops the run).
//   - supervisor: well-formed calls (reset, train, shutdown, …); go or abort for an exchange under
//     way, `received` for a transfer it receives; JetStream API requests that purge or delete the
//     run's stream, bucket or snapshots, a progress record; `lost` naming a live worker (it
//     leaves); phase 'stopping' or 'finished' (the launcher stops restarting processes).
//   - a worker's: it is its device, and the worker process that is the device may answer its
//     calls wrongly as a faulty one could; heartbeats, chunks and collectives as its own device.
//   - reward: scores for the requests it receives (a reward service is trusted to score).
import { randomBytes } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { errors, headers, type NatsConnection } from '@nats-io/transport-node';
import { Packr } from 'msgpackr';
import { beforeAll, describe, expect, it } from 'vitest';
import { launch, type LaunchResult } from '../engine/cli/launch.ts';
import { loadScenario } from '../engine/runtime/scenario/scenario.ts';
import { EVENTS_BY_ROLE, permissions, type RunCredentials } from '../mesh/wire/bus/auth.ts';
import { connectBus } from '../mesh/wire/bus/bus.ts';
import { subjectMatches } from '../mesh/wire/bus/memory-bus.ts';
import { encode } from '../mesh/wire/messages/codec.ts';
import { Call, Heartbeat, PROTOCOL_VERSION } from '../mesh/wire/messages/protocol.ts';
import { subjects, type Subjects } from '../mesh/wire/bus/subjects.ts';
import { smallScenario, tempDir } from './helpers.ts';

/**
 * Enough iterations for every credential's turn to fall inside the run, and for the run to go on
 * past a worker's wait on a forged `done` (4 s) after the last turn: an iteration takes 0.1 to 0.5 s
 * here, with snapshots written by the devices.
 */
const ITERATIONS = 40;
/**
 * The device whose worker credential the hostile client holds: the actor's, whose generate and
 * train calls take long enough that a forged reply always comes before the device's own.
 */
const DEVICE = 0;
/** The stages an iteration of PPO keeps in the run's results stream. */
const STAGES = ['actor__generate', 'reference__inference', 'reward__inference', 'critic__inference'];
/** Exchange ids as they were before they carried random bits. */
const GUESSED = ['ckpt-0-actor-7', 'ckpt-1-critic-9', 'init-critic-e0', 'rstr-1-critic-3'];

type Who = 'none' | 'launcher' | 'supervisor' | 'worker' | 'reward' | 'environment';

/**
 * Every kind of message tried, per credential, and what becomes of it. "refused by the server":
 * the credential may not publish there; otherwise its listeners drop or ignore it.
 */
const TRIED: Record<Who, Record<string, string>> = {
  none: {
    'connect without credentials': 'refused by the server (Authorization Violation)',
    "connect with the supervisor's user and a wrong password": 'refused by the server (Authorization Violation)',
  },
  launcher: {
    'random bytes': 'dropped: not msgpack',
    'msgpack, not a message': 'dropped: not a map with type and v',
    "another subject's message": 'dropped: not a run event',
    'wrong protocol version': 'dropped: v=2',
    "an event of another type on this type's subject": "dropped: an event travels on its own type's subject",
    'done while the supervisor beats': 'ignored by the workers: the supervisor still beats',
    "exit of a live worker's pid": "ignored by the supervisor: that worker's process is alive",
    'exit of a pid the run never had': 'ignored: no worker has that pid',
    'a log line': 'printed by the launcher',
    'a request to cordon a device of a run that is not elastic': 'refused by the supervisor, which says so: a device lost for good ends a run that is not elastic',
  },
  supervisor: {
    'random bytes':
      "dropped: not msgpack; on the JetStream API, an error reply to no one; in the KV bucket, not a sealed progress record: passed over by a take-over, replaced by the supervisor's next record",
    'msgpack, not a message': 'dropped: not a map with type and v',
    "another subject's message": "dropped: not this subject's schema",
    'wrong protocol version': 'dropped: v=2 (a call: the device says so on its heartbeat)',
    'JSON of the wrong shape':
      "an error from the JetStream API; in the KV bucket, not sealed: passed over by a take-over, replaced by the next progress record; an object-store entry that is not a snapshot's is left alone",
    'go for a guessed exchange id': 'ignored: exchange ids carry 64 random bits',
    'go-abort for a guessed exchange id': 'ignored: exchange ids carry 64 random bits',
    'a results record for this iteration and the next': 'ignored: a supervisor that started the run reads back only the records it wrote (by sequence and digest)',
    'a results record for a later iteration, under the message id the supervisor will use':
      'ignored: the supervisor, told its record is a duplicate of one it never wrote, stores its own without the id',
    'a beat with another pid': "ignored by the launcher's watchdog until the real supervisor beats again",
    'a chaos request for a kill point the run does not have': 'answered spare by the launcher',
    "lost naming a live worker's pid, for a worker the run does not have": 'ignored by the launcher (that pid beats as another worker) and by the workers (not their name)',
    'progress and recovered events with made-up figures': "shown by the launcher only; metrics.jsonl is the supervisor's own",
    'reward request to a service that does not exist': 'no one answers',
    'demonstration request to an environment that does not exist': 'no one answers',
  },
  worker: {
    'random bytes': 'dropped: not msgpack',
    'msgpack, not a message': 'dropped: not a map with type and v',
    "another subject's message": "dropped: not this subject's schema",
    'wrong protocol version': 'dropped: v=2',
    'hello for its own device, another, and any':
      "refused by the supervisor: its own device has a worker, and on its device's join subject a hello is for that device only (another device's join, and the generic one, the server refuses it)",
    'heartbeat of a worker the run does not have, saying reconnected': 'ignored: not the worker of that device',
    'ready for a guessed exchange id': 'ignored: exchange ids carry 64 random bits',
    'a chaos request for a kill point the run does not have': 'answered spare by the launcher',
    'presence of a reward service': 'ignored: the run asks no reward service',
    'request to an environment that does not exist': 'no one answers',
    'answers of an environment on its own subject, in a run that plays no episodes': 'ignored: no generation of the run keeps a ledger of answers',
    "answers of an environment on another device's subject": 'refused by the server: a device sends its answers as itself',
    'a generated row on its own subject, in a run that generates nothing continuously': 'ignored: no generation of the run keeps a ledger of rows',
    "a generated row on another device's subject": 'refused by the server: a device sends its rows as itself',
    "collective to another device, claiming a third, on the third's subject": 'refused by the server: a device sends collectives as itself',
    'collective to another device, claiming a third, on its own subject': "dropped: it names another sender than its subject's",
    "requests about its own device's bucket that are not JSON": 'an error from the JetStream API, to no one',
    "read requests about any device's bucket that are not JSON": 'an error from the JetStream API, to no one',
    "entries in its own device's bucket under names no manifest holds":
      "stored, and never read: a snapshot is read by its manifest's names and digests (an object a manifest names, replaced by someone with this credential, is refused when read, naming it)",
    "writes to another device's bucket": 'refused by the server: a device writes its own snapshot bucket only',
    'creating or changing a bucket, its own included': 'refused by the server: the supervisor creates every device’s bucket (a stream’s subjects are its creator’s to choose)',
    "an entry in the snapshot manifests' bucket": 'refused by the server: only the supervisor writes manifests',
    'a second reply to an observed call': 'refused by the server: a request heard is answered once',
    'reply to an observed call: random bytes': 'dropped by the supervisor, which waits for the device',
    'reply to an observed call: wrong protocol version': 'dropped by the supervisor, which waits for the device',
    'reply to an observed call: a result for another call': 'dropped by the supervisor, which waits for the device',
    'reply to an observed call: a result that does not fit the call': 'dropped by the supervisor, which waits for the device',
    "reply to an observed call: a well-formed result without the worker process's seal": 'dropped by the supervisor, which waits for the device',
  },
  reward: {
    'random bytes': 'dropped: not msgpack',
    'msgpack, not a message': 'dropped: not a map',
    "another subject's message": 'dropped: not a presence',
    'wrong protocol version': 'dropped: v=2',
    'presence of a reward service': 'ignored: the run asks no reward service',
  },
  environment: {
    'random bytes': 'dropped: not msgpack',
    'msgpack, not a message': 'dropped: not a map',
    "another subject's message": 'dropped: not a presence',
    'wrong protocol version': 'dropped: v=2',
    'presence of an environment': 'ignored: the run plays no episodes',
  },
};

const v = PROTOCOL_VERSION;
const packr = new Packr({ useRecords: false, moreTypes: true });
const HELLO = { type: 'hello', v, worker: 'hostile', pid: 1, host: 'elsewhere', backend: 'wasm' };
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const until = async (what: () => boolean, ms: number) => {
  const end = Date.now() + ms;
  while (!what() && Date.now() < end) await sleep(25);
  return what();
};

/** One credential's client: what it sent, by kind and subject, and what the server refused it. */
class Hostile {
  readonly sent: Array<{ kind: string; subject: string }> = [];
  readonly refused: string[] = [];
  /** Calls it answered first, or tried to (a worker's credential): by the kind of its reply. */
  readonly answered: Array<{ kind: string; call: string }> = [];

  /** More connections with the same credential. */
  private readonly more: NatsConnection[] = [];

  private constructor(
    readonly nc: NatsConnection,
    private readonly connect: () => Promise<NatsConnection>,
  ) {
    this.watch(nc);
  }

  private watch(nc: NatsConnection): void {
    void (async () => {
      for await (const s of nc.status()) if (s.type === 'error' && s.error instanceof errors.PermissionViolationError) this.refused.push(`${s.error.operation} ${s.error.subject}`);
    })();
  }

  static async as(who: Who, url: string, credential: { user: string; pass: string }): Promise<Hostile> {
    const connect = () => connectBus(url, `hostile-${who}`, credential);
    return new Hostile(await connect(), connect);
  }

  /** Another connection with the same credential, closed with this one. */
  async another(): Promise<NatsConnection> {
    const nc = await this.connect();
    this.watch(nc);
    this.more.push(nc);
    return nc;
  }

  send(kind: string, subject: string, data: Uint8Array, reply?: string, msgId?: string): void {
    const h = msgId === undefined ? undefined : headers();
    h?.set('Nats-Msg-Id', msgId!);
    this.nc.publish(subject, data, { ...(reply ? { reply } : {}), ...(h ? { headers: h } : {}) });
    this.sent.push({ kind, subject });
  }

  /** A request whose answer does not matter (an error, a refusal, none at all). */
  ask(kind: string, subject: string, message: Record<string, unknown>): Promise<unknown> {
    this.sent.push({ kind, subject });
    return this.nc.request(subject, encode(message as never), { timeout: 2000 }).then(
      (m) => m.data,
      () => undefined,
    );
  }

  /** Random bytes and msgpack that is not a message; with the subject's own message, another's and its own at v=2. */
  malformed(subject: string, own?: Record<string, unknown>, other: Record<string, unknown> = HELLO): void {
    this.send('random bytes', subject, randomBytes(64 + Math.floor(Math.random() * 512)));
    this.send('msgpack, not a message', subject, packr.pack([1, 2, 3, 'not a message']));
    if (!own) return;
    this.send("another subject's message", subject, encode(other as never));
    this.send('wrong protocol version', subject, encode({ ...own, v: 2 } as never));
  }

  /** Closes once the server's refusals of what it sent have come. */
  async close(): Promise<void> {
    // A refusal is heard a turn after the flush's answer. The run's server may be gone already.
    await Promise.all([this.nc, ...this.more].map((nc) => nc.flush().catch(() => {})));
    await sleep(100);
    await Promise.all([this.nc, ...this.more].map((nc) => nc.close()));
  }
}

/** Worker pids by device, from their heartbeats (the launcher's and the supervisor's credentials may hear them). */
function watchPids(h: Hostile, subj: Subjects): Map<number, number> {
  const pids = new Map<number, number>();
  h.nc.subscribe(subj.heartbeats, {
    callback: (_e, m) => {
      const b = Heartbeat.safeParse(packr.unpack(m.data));
      if (b.success && b.data.pid !== undefined) pids.set(b.data.device, b.data.pid);
    },
  });
  return pids;
}

/** The launcher's credential: its three event subjects. */
async function asLauncher(url: string, subj: Subjects, creds: RunCredentials): Promise<Hostile> {
  const h = await Hostile.as('launcher', url, creds.launcher);
  const pids = watchPids(h, subj);
  await until(() => pids.has(1), 5000);
  const events = {
    done: { type: 'done', v, status: 'failed', message: 'forged' },
    exit: { type: 'exit', v, kind: 'worker', pid: pids.get(1)!, code: 1, signal: null, restart: false },
    log: { type: 'log', v, level: 'warn', source: 'hostile', message: 'forged' },
  } as const;
  for (const t of EVENTS_BY_ROLE.launcher) {
    h.malformed(subj.event(t), events[t]);
    h.send("an event of another type on this type's subject", subj.event(t), encode(t === 'done' ? events.log : events.done));
  }
  h.send('done while the supervisor beats', subj.event('done'), encode(events.done));
  h.send("exit of a live worker's pid", subj.event('exit'), encode(events.exit));
  h.send('exit of a pid the run never had', subj.event('exit'), encode({ ...events.exit, pid: 4_000_017 }));
  h.send('a log line', subj.event('log'), encode(events.log));
  // A cordon takes a device out of an elastic run (the launcher's and the operator's to ask, with this credential).
  const cordon = { type: 'cordon', v, device: 1, trigger: 'cordon', reason: 'hostile' };
  h.malformed(subj.cordon, cordon);
  await h.ask('a request to cordon a device of a run that is not elastic', subj.cordon, cordon);
  await h.close();
  return h;
}

/** The supervisor's credential: calls, go, chunks, receipts, results, its beat, chaos, its events, JetStream, reward requests. */
async function asSupervisor(url: string, subj: Subjects, run: string, creds: RunCredentials, devices: number[], iteration: number): Promise<Hostile> {
  const h = await Hostile.as('supervisor', url, creds.supervisor);
  const pids = watchPids(h, subj);
  await until(() => pids.has(1), 10_000);
  for (const d of devices) h.malformed(subj.call(d), { type: 'call', v, id: 'hostile', model: 'actor', iteration, epoch: 0, body: { fn: 'manifest' } });
  for (const id of GUESSED) {
    h.malformed(subj.go(id), { type: 'go', v, realloc: id });
    h.send('go for a guessed exchange id', subj.go(id), encode({ type: 'go', v, realloc: id }));
    h.send('go-abort for a guessed exchange id', subj.go(id), encode({ type: 'go', v, realloc: id, abort: true }));
  }
  for (const id of GUESSED.slice(0, 1)) {
    const resend = { type: 'resend', v, transfer: id, from: 'supervisor', tensor: 'w:wte', offset: 0, attempt: 1 };
    h.malformed(subj.chunks(id, 'supervisor'), { type: 'sent', v, transfer: id, from: 'supervisor', chunks: 1, elements: 16384 });
    h.malformed(subj.receipts(id, 'supervisor'), resend, { type: 'received', v: 2, transfer: id });
  }
  for (const i of [iteration, iteration + 1]) {
    for (const stage of STAGES) {
      const record = { type: 'stage', v, iteration: i, stage, value: { ports: { scores: new Float32Array(16).fill(1) }, generated: 0 } };
      h.malformed(subj.results(i, stage), record);
      h.send('a results record for this iteration and the next', subj.results(i, stage), encode(record));
    }
  }
  // Under the id the supervisor will store its own record with: a publish of it would be a duplicate.
  for (const stage of STAGES) {
    const i = iteration + 2;
    const record = { type: 'stage', v, iteration: i, stage, value: { ports: { scores: new Float32Array(16).fill(1) }, generated: 0 } };
    h.send('a results record for a later iteration, under the message id the supervisor will use', subj.results(i, stage), encode(record), undefined, `${run}.${i}.${stage}`);
  }
  const beat = { type: 'beat', v, pid: 4_000_019, at: Date.now() };
  h.malformed(subj.supervisorBeat, beat);
  h.send('a beat with another pid', subj.supervisorBeat, encode(beat));
  const ask = { type: 'chaos', v, target: 'hostile', pid: 4_000_023, where: 'nowhere' };
  h.malformed(subj.chaos, ask);
  await h.ask('a chaos request for a kill point the run does not have', subj.chaos, ask);
  const events: Record<(typeof EVENTS_BY_ROLE.supervisor)[number], Record<string, unknown>> = {
    phase: { type: 'phase', v, phase: 'iterating', detail: 'forged' },
    progress: { type: 'progress', v, iterations: 99, metrics: { iteration: 42, reward_mean: 1, seconds: 1, tokens: 1, tokens_per_second: 1, realloc_seconds: 0, realloc_bytes: 0 } },
    log: { type: 'log', v, level: 'warn', source: 'hostile', message: 'forged' },
    recovered: { type: 'recovered', v, epoch: 7, iteration: 3, snapshot: 2, seconds: 1, reason: 'forged' },
    lost: { type: 'lost', v, device: 1, worker: 'hostile-worker', pid: pids.get(1)!, reason: 'forged: no heartbeat' },
    cordoned: { type: 'cordoned', v, device: 1, trigger: 'cordon', reason: 'forged' },
  };
  for (const [type, event] of Object.entries(events)) h.malformed(subj.event(type), event);
  h.send("lost naming a live worker's pid, for a worker the run does not have", subj.event('lost'), encode(events.lost as never));
  h.send('progress and recovered events with made-up figures', subj.event('progress'), encode(events.progress as never));
  h.send('progress and recovered events with made-up figures', subj.event('recovered'), encode(events.recovered as never));
  // JetStream: requests that are not JSON, or JSON of the wrong shape; a KV value and object-store
  // entries that are not records (the supervisor's next write replaces the progress record).
  const stream = `FERRY-${run}`;
  const json = new TextEncoder().encode(JSON.stringify({ name: 5, subjects: 'none', seq: 'x' }));
  for (const subject of [
    `$JS.API.STREAM.INFO.${stream}`,
    `$JS.API.STREAM.MSG.GET.${stream}`,
    `$JS.API.CONSUMER.CREATE.${stream}`,
    `$KV.ferry-${run}.progress`,
    `$O.ferry-${run}-snapshots.M.${Buffer.from('snapshot-99').toString('base64url')}`,
    `$O.ferry-${run}-snapshots.C.hostile`,
    // The devices' buckets, which it reads and prunes: entries under names no manifest holds.
    ...devices.map((d) => `$O.ferry-${run}-d${d}.C.hostile`),
    `$JS.ACK.${stream}.hostile.1.1.1.1.1`,
    `$JS.FC.${stream}.hostile`,
  ]) {
    h.malformed(subject);
    h.send('JSON of the wrong shape', subject, json);
  }
  const request = { type: 'reward.request', v: 1, id: 'hostile', run, iteration, items: [] };
  for (const subject of ['ferry.reward.hostile', 'ferry.reward.hostile.i.hostile']) h.malformed(subject, request);
  h.send('reward request to a service that does not exist', 'ferry.reward.hostile', encode(request));
  // A warm-up from an environment's expert is the supervisor's to ask for: of one that does not exist.
  const demo = { type: 'env.demo', v: 1, id: 'hostile', run, episode: 'warmup-0', task: { prompt_text: '', seed: 1 }, max_turns: 1 };
  h.malformed('ferry.env.hostile.i.hostile', demo);
  h.send('demonstration request to an environment that does not exist', 'ferry.env.hostile.i.hostile', encode(demo));
  await h.close();
  return h;
}

/**
 * A worker's credential (device 0's). Until the run ends, it answers the generate and train calls
 * it hears for its device before the device does (once each, as the server allows: the forged
 * replies in turn); meanwhile, its one-off messages, and what it may and may not do to snapshot
 * buckets.
 */
async function asWorker(url: string, subj: Subjects, run: string, creds: RunCredentials, devices: number[]): Promise<Hostile> {
  const h = await Hostile.as('worker', url, creds.workers[DEVICE]!);
  const replies: Array<[string, (c: Call) => Uint8Array]> = [
    ['reply to an observed call: random bytes', () => randomBytes(200)],
    ['reply to an observed call: wrong protocol version', (c) => encode({ type: 'result', v: 2, id: c.id, body: {} })],
    ['reply to an observed call: a result for another call', (c) => encode({ type: 'result', v, id: `${c.id}-other`, body: fitting(c) })],
    ['reply to an observed call: a result that does not fit the call', (c) => encode({ type: 'result', v, id: c.id, body: { nonsense: 1 } })],
    ["reply to an observed call: a well-formed result without the worker process's seal", (c) => encode({ type: 'result', v, id: c.id, body: fitting(c), ms: 1 })],
  ];
  // On a connection of its own, which nothing else keeps busy.
  const { answered } = h;
  const calls = await h.another();
  calls.subscribe(subj.call(DEVICE), {
    callback: (_e, m) => {
      const call = Call.safeParse(packr.unpack(m.data));
      if (!call.success || (call.data.body.fn !== 'generate' && call.data.body.fn !== 'train') || !m.reply) return;
      const [kind, make] = replies[answered.length % replies.length]!;
      m.respond(make(call.data));
      h.sent.push({ kind, subject: m.reply });
      answered.push({ kind, call: call.data.id });
      if (answered.length > 1) return;
      calls.publish(m.reply, make(call.data));
      h.sent.push({ kind: 'a second reply to an observed call', subject: m.reply });
    },
  });
  await until(() => answered.length >= 2 * replies.length, 20_000);

  const hello = { ...HELLO, device: DEVICE };
  h.malformed(subj.joinAs(DEVICE), hello, { type: 'heartbeat', v, device: DEVICE, worker: 'hostile', state: 'serving', at: Date.now() });
  await Promise.all([hello, { ...hello, device: devices.find((d) => d !== DEVICE)! }, { ...HELLO }].map((m) => h.ask('hello for its own device, another, and any', subj.joinAs(DEVICE), m)));
  const beat = { type: 'heartbeat', v, device: DEVICE, worker: 'hostile-1-deadbeef', state: 'reconnected', at: Date.now(), pid: 4_000_029, warning: 'forged' };
  h.malformed(subj.heartbeat(DEVICE), beat);
  h.send('heartbeat of a worker the run does not have, saying reconnected', subj.heartbeat(DEVICE), encode(beat));
  const ask = { type: 'chaos', v, target: 'hostile', pid: 4_000_031, where: 'nowhere' };
  h.malformed(subj.chaos, ask);
  await h.ask('a chaos request for a kill point the run does not have', subj.chaos, ask);
  for (const id of GUESSED) {
    h.malformed(subj.ready(id), { type: 'ready', v, realloc: id, device: DEVICE });
    for (const device of devices) h.send('ready for a guessed exchange id', subj.ready(id), encode({ type: 'ready', v, realloc: id, device }));
  }
  for (const id of GUESSED.slice(0, 1)) {
    h.malformed(subj.chunks(id, DEVICE), { type: 'sent', v, transfer: id, from: DEVICE, chunks: 1, elements: 16384 });
    h.malformed(subj.receipts(id, DEVICE), { type: 'resend', v, transfer: id, from: DEVICE, tensor: 'w:wte', offset: 0, attempt: 1 });
  }
  // Snapshots: its own device's bucket it may write (its worker does, each snapshot), any other not.
  const own = `OBJ_ferry-${run}-d${DEVICE}`;
  const other = devices.find((d) => d !== DEVICE)!;
  for (const subject of ['$JS.API.INFO', `$JS.API.STREAM.PURGE.${own}`]) h.send("requests about its own device's bucket that are not JSON", subject, packr.pack([1, 2, 3, 'not json']));
  // Reading any device's bucket (a rank is reloaded from a replica's object).
  for (const d of devices)
    for (const api of ['STREAM.INFO', 'STREAM.MSG.GET', 'DIRECT.GET'])
      h.send("read requests about any device's bucket that are not JSON", `$JS.API.${api}.OBJ_ferry-${run}-d${d}`, packr.pack([1, 2, 3, 'not json']));
  for (const subject of [`$O.ferry-${run}-d${DEVICE}.C.hostile`, `$O.ferry-${run}-d${DEVICE}.M.${Buffer.from('hostile').toString('base64url')}`])
    h.send("entries in its own device's bucket under names no manifest holds", subject, randomBytes(64));
  for (const subject of [`$O.ferry-${run}-d${other}.C.hostile`, `$JS.API.STREAM.PURGE.OBJ_ferry-${run}-d${other}`]) h.send("writes to another device's bucket", subject, randomBytes(64));
  // A stream of its own making (its subjects could be another device's calls): not even for its own bucket.
  for (const d of [DEVICE, other]) h.send('creating or changing a bucket, its own included', `$JS.API.STREAM.CREATE.OBJ_ferry-${run}-d${d}`, randomBytes(64));
  h.send('creating or changing a bucket, its own included', `$JS.API.STREAM.UPDATE.OBJ_ferry-${run}-d${DEVICE}`, randomBytes(64));
  h.send("an entry in the snapshot manifests' bucket", `$O.ferry-${run}-snapshots.M.${Buffer.from('snapshot-99').toString('base64url')}`, randomBytes(64));
  for (const d of devices.filter((d) => d !== DEVICE)) {
    const third = devices.find((x) => x !== d && x !== DEVICE)!;
    const coll = { type: 'coll', v, group: 'g0-5-[actor.train]-0', tag: 'fwd', from: third, part: 0, parts: 1, data: new Float32Array(8) };
    h.malformed(subj.collective(d, DEVICE), coll);
    h.send("collective to another device, claiming a third, on the third's subject", subj.collective(d, third), encode(coll));
    h.send('collective to another device, claiming a third, on its own subject', subj.collective(d, DEVICE), encode(coll));
  }
  const presence = { type: 'reward.hello', v: 1, name: 'hostile', instance: 'hostile-1' };
  h.malformed('ferry.reward.hostile.hb', presence);
  h.send('presence of a reward service', 'ferry.reward.hostile.hb', encode(presence));
  // A generating worker may call environments: one that does not exist.
  const reset = { type: 'env.reset', v: 1, id: 'hostile', run: 'x', episode: '0-0', task: { prompt_text: '', seed: 1 }, max_turns: 1 };
  h.malformed('ferry.env.hostile.i.hostile', reset);
  h.send('request to an environment that does not exist', 'ferry.env.hostile.i.hostile', encode(reset));
  // An environment's answers, as a generating device sends them: a recovery would read them.
  const turns = {
    type: 'turns',
    v,
    epoch: 0,
    iteration: 0,
    stage: 'actor__generate',
    answers: [{ episode: '0-0', k: 0, observation: 'forged', reward: 1, done: true, instance: 'hostile', seconds: 0 }],
  };
  h.malformed(subj.turns(DEVICE), turns);
  h.send('answers of an environment on its own subject, in a run that plays no episodes', subj.turns(DEVICE), encode(turns));
  h.send("answers of an environment on another device's subject", subj.turns(devices.find((d) => d !== DEVICE)!), encode(turns));
  // A row of a continuous generation, as a generating device sends it: a recovery would keep it.
  const sample = { type: 'sample', v, epoch: 0, iteration: 0, stage: 'actor__generate', row: 0, tokens: new Int32Array(4), logprobs: new Float32Array(2) };
  h.malformed(subj.samples(DEVICE), sample);
  h.send('a generated row on its own subject, in a run that generates nothing continuously', subj.samples(DEVICE), encode(sample));
  h.send("a generated row on another device's subject", subj.samples(devices.find((d) => d !== DEVICE)!), encode(sample));
  await h.nc.flush();
  return h;
}

/** A result body that fits a generate or a train call (its schema in protocol.ts), with other numbers. */
function fitting(c: Call): Record<string, unknown> {
  if (c.body.fn !== 'generate') return { loss: 1, clipfrac: 0, grad_norm: 1 };
  const { batch, promptLen, responseLen } = c.body;
  return { tokens: new Int32Array(batch * (promptLen + responseLen)).fill(1), logprobs: new Float32Array(batch * responseLen).fill(-1) };
}

/** The reward role's credential: presence, and nothing else. */
async function asReward(url: string, creds: RunCredentials): Promise<Hostile> {
  const h = await Hostile.as('reward', url, creds.reward);
  const presence = { type: 'reward.hello', v: 1, name: 'hostile', instance: 'hostile-1' };
  h.malformed('ferry.reward.hostile.hb', presence, { type: 'reward.request', v: 1, id: 'x', run: 'x', iteration: 0, items: [] });
  h.send('presence of a reward service', 'ferry.reward.hostile.hb', encode(presence));
  await h.close();
  return h;
}

/** The environment role's credential: presence, and nothing else. */
async function asEnvironment(url: string, creds: RunCredentials): Promise<Hostile> {
  const h = await Hostile.as('environment', url, creds.environment);
  const presence = { type: 'env.hello', v: 1, name: 'hostile', instance: 'hostile-1' };
  h.malformed('ferry.env.hostile.hb', presence, { type: 'env.reset', v: 1, id: 'x', run: 'x', episode: 'x', task: { prompt_text: '', seed: 0 }, max_turns: 1 });
  h.send('presence of an environment', 'ferry.env.hostile.hb', encode(presence));
  await h.close();
  return h;
}

const quiet = { phase() {}, iteration() {}, stop() {} };

/** Per iteration: its number, the tokens it generated and its mean reward. */
function metrics(dir: string): Array<[number, number, number]> {
  return readFileSync(join(dir, 'metrics.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as { iteration: number; tokens: number; reward_mean: number })
    .map((m) => [m.iteration, m.tokens, m.reward_mean]);
}

const ROLES = ['launcher', 'supervisor', 'worker', 'reward', 'environment'] as const;

describe('a run on the closed bus with a hostile client beside it', () => {
  let dir: string;
  let out: string;
  let clean: LaunchResult;
  let r: LaunchResult;
  let said: string[];
  let subj: Subjects;
  let devices: number[];
  let run: string;
  const none: string[] = [];
  const by: Partial<Record<Who, Hostile>> = {};

  beforeAll(async () => {
    dir = tempDir();
    const file = smallScenario(dir, '', 'hostile');
    writeFileSync(file, readFileSync(file, 'utf8').replace('iterations: 3', `iterations: ${ITERATIONS}`));
    clean = await launch({ scenario: loadScenario(file), run: `clean${Date.now()}`, out: join(dir, 'clean'), progress: quiet, say: () => {} });

    run = `hostile${Date.now()}`;
    out = join(dir, 'hostile');
    subj = subjects(run);
    let iteration = 0;
    let iterating!: () => void;
    const started = new Promise<void>((resolve) => (iterating = resolve));
    said = [];
    const running = launch({
      scenario: loadScenario(file),
      run,
      out,
      progress: { phase: (p) => p === 'iterating' && iterating(), iteration: (m) => (iteration = Math.max(iteration, m.iteration + 1)), stop() {} },
      say: (l) => said.push(l),
    });
    let ended = false;
    void running.finally(() => (ended = true));
    await Promise.race([started, running]);
    const creds = JSON.parse(readFileSync(join(out, 'credentials.json'), 'utf8')) as RunCredentials;
    const url = said.map((l) => l.match(/^nats-server on (\S+)/)?.[1]).find(Boolean)!;
    devices = Object.keys(creds.workers).map(Number);

    // Each credential in turn, while the run iterates.
    for (const [kind, credential] of [
      ['connect without credentials', {}],
      ["connect with the supervisor's user and a wrong password", { user: creds.supervisor.user, pass: 'guess' }],
    ] as const) {
      await connectBus(url, 'hostile-none', credential).then(
        (nc) => nc.close(),
        (e: Error) => none.push(`${kind}: ${/Authorization Violation/i.test(e.message) ? 'refused' : e.message}`),
      );
    }
    by.launcher = await asLauncher(url, subj, creds);
    by.supervisor = await asSupervisor(url, subj, run, creds, devices, iteration);
    by.worker = await asWorker(url, subj, run, creds, devices);
    by.reward = await asReward(url, creds);
    by.environment = await asEnvironment(url, creds);
    // Every turn came while the run was iterating (a run too short to hold them fails here, not later).
    expect(ended).toBe(false);
    r = await running;
    await by.worker.close();
  }, 150_000);

  it('ends as the clean run ends: the same digests, rewards and tokens per iteration, rollouts and checkpoint, and no recovery', () => {
    expect(clean.code).toBe(0);
    expect(r.summary?.error).toBeUndefined();
    expect(r.code).toBe(0);
    expect(r.summary!.digests).toEqual(clean.summary!.digests);
    expect(r.summary!.rollouts).toEqual(clean.summary!.rollouts);
    expect(r.summary!.rollouts).toMatchObject({ lost: 0, duplicated: 0 });
    expect(metrics(out)).toEqual(metrics(join(dir, 'clean')));
    expect(r.summary!.recoveries).toEqual([]);
    expect(readFileSync(join(out, 'checkpoint.msgpack')).equals(readFileSync(join(dir, 'clean', 'checkpoint.msgpack')))).toBe(true);
  });

  it('refuses a client with no credential, or a wrong password', () => {
    expect(none).toEqual(Object.keys(TRIED.none).map((k) => `${k}: refused`));
  });

  it.each(ROLES)("with the %s's credential, tried every kind in the table on every subject it may publish; the server refused what the table says", (who) => {
    const h = by[who]!;
    expect([...new Set(h.sent.map((s) => s.kind))].sort()).toEqual(Object.keys(TRIED[who]).sort());
    // Every pattern the credential may publish on, on at least one subject it matches.
    const perms = permissions(run, devices);
    const allowed = who === 'worker' ? perms.workers[DEVICE]!.publish : perms[who].publish;
    expect(allowed.filter((p) => !h.sent.some((s) => subjectMatches(p, s.subject)))).toEqual([]);
    const refusedKinds = new Set(Object.entries(TRIED[who]).flatMap(([k, outcome]) => (outcome.startsWith('refused by the server') ? [k] : [])));
    expect(new Set(h.refused)).toEqual(new Set(h.sent.flatMap((s) => (refusedKinds.has(s.kind) ? [`publish ${s.subject}`] : []))));
  });

  it('the forgeries reached their listeners, and were judged as the table says', () => {
    const log = (name: string) => readFileSync(join(out, 'logs', name), 'utf8');
    const supervisorLog = log('supervisor.log');
    for (const d of devices) expect(log(`worker-${d}.log`)).toMatch(/ignored a 'done' \(failed: forged\): the supervisor still beats/);
    expect(supervisorLog).toMatch(/ignored an exit of pid \d+ \(device 1, worker \S+\): that process is alive on this machine/);
    expect(supervisorLog).toMatch(/refused to run on without device 1 \(cordon: hostile\): this run is not elastic/);
    expect(said.join('\n')).toMatch(/ignored a 'lost' of device 1 \(forged: no heartbeat\): it names worker hostile-worker, but pid \d+ beats as worker \S+/);
    // Each kind of forged reply came first at least once, and was dropped.
    const dropped = new Set(by.worker!.answered.filter((a) => supervisorLog.includes(`dropped a reply to call ${a.call} `)).map((a) => a.kind));
    expect([...dropped].sort()).toEqual(
      Object.keys(TRIED.worker)
        .filter((k) => k.startsWith('reply to an observed call'))
        .sort(),
    );
    // Its own device's hello: that device has a worker; another device's, or any, on its own device's join subject: not its to ask.
    expect(supervisorLog.match(/refused worker hostile: device \d already has/g)).toHaveLength(1);
    expect(supervisorLog.match(/worker hostile: a hello on \S+\.join\.\d is for device \d; this one asks for (\d|any device)/g)).toHaveLength(2);
  });
});
