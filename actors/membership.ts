// Who is which device: answers workers' join requests with a free device of the run, and counts a
// worker as joined once its first heartbeat arrives (it sends that after subscribing to its call
// subject, and the server keeps one connection's messages in order, so calls cannot race it).
import { subscribe, type Bus } from '../mesh/bus.ts';
import { encode } from '../mesh/codec.ts';
import { Heartbeat, Hello, PROTOCOL_VERSION } from '../mesh/protocol.ts';
import type { Subjects } from '../mesh/subjects.ts';

export interface Joined {
  device: number;
  worker: string;
  backend: string;
}

export function serveJoins(
  nc: Bus,
  subj: Subjects,
  run: string,
  need: readonly number[],
  onJoined: (j: Joined) => void,
  log: (line: string) => void,
  onRejected: (problem: string) => void = () => {},
): () => void {
  const taken = new Map<number, string>();
  const backends = new Map<number, string>();
  const announced = new Set<number>();
  const stopBeats = subscribe(
    nc,
    subj.heartbeats,
    Heartbeat,
    (beat) => {
      if (announced.has(beat.device) || taken.get(beat.device) !== beat.worker) return;
      announced.add(beat.device);
      onJoined({ device: beat.device, worker: beat.worker, backend: backends.get(beat.device) ?? 'unknown' });
    },
    (error) => {
      log(`rejected: ${error.message}`);
      onRejected(error.message);
    },
  );
  const stopJoin = subscribe(
    nc,
    subj.join,
    Hello,
    (hello, msg) => {
      const free = need.filter((d) => !taken.has(d) || taken.get(d) === hello.worker);
      let refusal: string | undefined;
      if (hello.device !== undefined && !need.includes(hello.device)) {
        refusal = `device ${hello.device} is not in this run's plan (devices ${need.join(', ')})`;
      } else if (hello.device !== undefined && !free.includes(hello.device)) {
        refusal = `device ${hello.device} already has worker ${taken.get(hello.device)}`;
      } else if (free.length === 0) {
        refusal = `every device of this run (${need.join(', ')}) already has a worker`;
      }
      if (refusal) {
        log(`refused worker ${hello.worker}: ${refusal}`);
        msg.respond(encode({ type: 'error', v: PROTOCOL_VERSION, code: 'invalid_state', message: refusal, subject: msg.subject }));
        return;
      }
      const device = hello.device ?? free[0]!;
      taken.set(device, hello.worker);
      backends.set(device, hello.backend);
      log(`worker ${hello.worker} (pid ${hello.pid} on ${hello.host}, ${hello.backend}) is device ${device}`);
      msg.respond(encode({ type: 'welcome', v: PROTOCOL_VERSION, device, run }));
    },
    (error, msg) => {
      log(`rejected: ${error.message}`);
      onRejected(error.message);
      if (msg.reply) msg.respond(encode({ type: 'error', v: PROTOCOL_VERSION, code: 'malformed', message: error.problem, subject: error.subject }));
    },
  );
  return () => {
    stopBeats();
    stopJoin();
  };
}
