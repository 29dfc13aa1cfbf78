// Point-to-point messages and all-reduce between the ranks of one call, over any bus. Each device
// listens on its own collective subject from the moment it exists, so nothing a peer sends early
// is lost: messages wait in a mailbox until the program asks for them. Sums run in rank order, so
// every rank gets the same bits.
import { subscribe, type Bus } from '../wire/index.ts';
import { encode } from '../wire/index.ts';
import { Collective, PROTOCOL_VERSION } from '../wire/index.ts';
import { senderOf, type Subjects } from '../wire/index.ts';

export class CommError extends Error {
  override name = 'CommError';
}

type Data = Float32Array | Int32Array;

interface Slot {
  parts: Data[];
  received: number;
  total?: number;
  waiter?: { resolve: (d: Data) => void; reject: (e: Error) => void; timer: NodeJS.Timeout };
}

/** The tag of the message a failing rank sends its peers. */
const ABORT = '!abort';

export class Comm {
  private readonly mailbox = new Map<string, Slot>();
  /** Calls that have ended (well or badly): their late messages are dropped. */
  private readonly ended = new Map<string, string>();
  private readonly stop: () => void;

  constructor(
    private readonly bus: Bus,
    private readonly subj: Subjects,
    readonly device: number,
    private readonly timeoutMs = 300_000,
  ) {
    this.stop = subscribe(
      bus,
      subj.collectivesTo(device),
      Collective,
      (m, msg) => {
        // Each device sends on its own subject, as itself only (the server sees to it on a closed bus).
        if (senderOf(msg.subject) === m.from) this.deliver(m);
      },
      () => {},
    );
  }

  private key(group: string, tag: string, from: number) {
    return `${group}|${tag}|${from}`;
  }

  private slot(key: string): Slot {
    let s = this.mailbox.get(key);
    if (!s) this.mailbox.set(key, (s = { parts: [], received: 0 }));
    return s;
  }

  private deliver(m: Collective) {
    if (this.ended.has(m.group)) return;
    if (m.tag === ABORT) {
      this.end(m.group, `device ${m.from} failed during call ${m.group}`);
      return;
    }
    const key = this.key(m.group, m.tag, m.from);
    const s = this.slot(key);
    if (s.parts[m.part]) return; // a repeat
    s.parts[m.part] = m.data;
    s.total = m.parts;
    s.received += 1;
    this.settle(key, s);
  }

  private settle(key: string, s: Slot) {
    if (!s.waiter || s.total === undefined || s.received < s.total) return;
    this.mailbox.delete(key);
    clearTimeout(s.waiter.timer);
    const first = s.parts[0]!;
    if (s.total === 1) return s.waiter.resolve(first);
    const length = s.parts.reduce((n, p) => n + p!.length, 0);
    const out = first instanceof Float32Array ? new Float32Array(length) : new Int32Array(length);
    let at = 0;
    for (const p of s.parts) {
      out.set(p!, at);
      at += p!.length;
    }
    s.waiter.resolve(out);
  }

  /** Sends `data` to `device` under `tag` within `group`; large arrays go in parts. */
  send(group: string, device: number, tag: string, data: Data): void {
    const max = Math.max(1, Math.floor(((this.bus.info?.max_payload ?? 1 << 20) - 1024) / 4));
    const parts = Math.max(1, Math.ceil(data.length / max));
    for (let part = 0; part < parts; part++) {
      const piece = data.subarray(part * max, Math.min(data.length, (part + 1) * max));
      this.bus.publish(this.subj.collective(device, this.device), encode({ type: 'coll', v: PROTOCOL_VERSION, group, tag, from: this.device, part, parts, data: piece }));
    }
  }

  /** What `device` sent under `tag` within `group`. */
  recv(group: string, device: number, tag: string): Promise<Data> {
    const why = this.ended.get(group);
    if (why !== undefined) return Promise.reject(new CommError(why));
    const key = this.key(group, tag, device);
    const s = this.slot(key);
    return new Promise<Data>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.mailbox.delete(key);
        reject(new CommError(`no '${tag}' from device ${device} within ${this.timeoutMs} ms (call ${group})`));
      }, this.timeoutMs);
      s.waiter = { resolve, reject, timer };
      this.settle(key, s);
    });
  }

  /** Tells the other ranks of a call that this one failed, so that none waits for it. */
  abort(group: string, members: readonly number[]): void {
    for (const d of members) if (d !== this.device) this.send(group, d, ABORT, new Float32Array(0));
    this.end(group, `call ${group} failed on this device`);
  }

  /** Sum over `group` (devices in rank order) of every member's `data`, summed in that order. */
  async allReduce(group: string, members: readonly number[], tag: string, data: Float32Array): Promise<Float32Array> {
    if (members.length === 1) return data;
    for (const d of members) if (d !== this.device) this.send(group, d, tag, data);
    const parts = await Promise.all(members.map((d) => (d === this.device ? Promise.resolve(data) : this.recv(group, d, tag))));
    const out = new Float32Array(parts[0]!);
    for (let k = 1; k < parts.length; k++) {
      const p = parts[k]!;
      if (p.length !== out.length) throw new CommError(`all-reduce '${tag}': device ${members[k]} sent ${p.length} values, expected ${out.length}`);
      for (let i = 0; i < out.length; i++) out[i]! += p[i]!;
    }
    return out;
  }

  /** Ends every call in flight on this device (a reset): their waits fail with `why`. */
  endAll(why: string): void {
    const groups = new Set([...this.mailbox.keys()].map((key) => key.slice(0, key.indexOf('|'))));
    for (const group of groups) this.end(group, why);
  }

  /** Drops what is left of a call's messages (after it ends, well or badly), and any that come later. */
  forget(group: string): void {
    this.end(group, `call ${group} ended`);
  }

  private end(group: string, why: string): void {
    if (!this.ended.has(group)) this.ended.set(group, why);
    if (this.ended.size > 1024) this.ended.delete(this.ended.keys().next().value!);
    for (const [key, s] of this.mailbox) {
      if (!key.startsWith(`${group}|`)) continue;
      if (s.waiter) {
        clearTimeout(s.waiter.timer);
        s.waiter.reject(new CommError(why));
      }
      this.mailbox.delete(key);
    }
  }

  close(): void {
    this.stop();
  }
}
