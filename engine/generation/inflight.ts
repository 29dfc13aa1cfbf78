// In-flight weight updates on a device: when a newer version of the policy reaches the rollout
// devices (a view's other copy, filled beside the running generation), the continuous generation
// running there goes on with it from one of its passes, instead of finishing on the old one.
//
// Which pass is a decision written ahead, so that a run can be replayed: the supervisor asks the
// device to switch (`switch` without `at`); the generation stops before its next pass and the reply
// names that pass; the supervisor writes the decision to the run's store and tells the device again
// with `at`, and only then does the generation go on, with the new version. A replay knows its
// decisions before the generation starts (the generate call's `inflight.switches`): the generation
// stops before each planned pass until the supervisor says the version is there (`at`), and a
// decision that arrives before its generation has started waits for it. The tensor ranks of one
// replica stop at the same pass: before each, they say to each other whether one of them has a
// switch to take there (`agree`), and all stop where one does.
import type { DecodingRank } from '../model/index.ts';
import type { Inflight, SwitchTo } from './continuous.ts';

/** Where a generation runs on a device: its call's iteration and the model it generates with. */
export interface GenerationKey {
  iteration: number;
  model: string;
}

const keyOf = (g: GenerationKey) => `${g.iteration}\u0000${g.model}`;

interface Decided {
  step: number;
  version: number;
  model: string;
}

interface Session {
  /** Asked to switch at the next pass (not decided yet): told the pass it stops before. */
  asked?: { version: number; model: string; answer: (step: number | undefined) => void };
  /** Passes with a decision it waits for (planned, a replay), by step: the version. */
  planned: Map<number, number>;
  /** Stopped before `step`, until its decision comes. */
  waiting?: { step: number; go: (d: Decided) => void; fail: (e: Error) => void };
}

/** A device's running in-flight generations, and the switches decided for them. */
export class Switchboard {
  private readonly sessions = new Map<string, Session>();
  /** Decisions (`at`) for generations not running here yet, or not yet at their pass. */
  private readonly decided = new Map<string, Decided[]>();

  /**
   * A generation starting: its gate (continuous.ts's Inflight). `planned`: the passes decided
   * before (a replay), each with its version; `rankOf`: a model's passes on this device, for the
   * version it switches to. Close it when the generation ends.
   */
  open(
    g: GenerationKey,
    o: {
      version: number;
      kv: Inflight['kv'];
      planned?: ReadonlyArray<{ step: number; version: number }>;
      rankOf: (model: string) => Promise<DecodingRank>;
      /** The replica's tensor ranks, each saying whether it has a switch at `step`: whether any has (absent: one rank). */
      agree?: (step: number, mine: boolean) => Promise<boolean>;
    },
  ): Inflight & { close(): void } {
    const key = keyOf(g);
    if (this.sessions.has(key)) throw new Error(`a generation of iteration ${g.iteration} on '${g.model}' is already running on this device`);
    const session: Session = { planned: new Map((o.planned ?? []).map((p) => [p.step, p.version])) };
    this.sessions.set(key, session);
    const to = (d: Decided): SwitchTo => ({ version: d.version, rank: () => o.rankOf(d.model) });
    return {
      version: o.version,
      kv: o.kv,
      at: (step) => {
        const ready = this.take(key, step);
        // Asked: this is the pass it stops before, until the decision is written.
        const asked = session.asked;
        if (asked && !ready) {
          session.asked = undefined;
          session.planned.set(step, asked.version);
          asked.answer(step);
        }
        const mine = ready !== undefined || session.planned.has(step);
        const stop = (): Promise<SwitchTo> | SwitchTo =>
          ready
            ? to(ready)
            : new Promise<SwitchTo>((resolve, reject) => {
                session.waiting = { step, go: (d) => resolve(to(d)), fail: reject };
                // Asked while its replica agreed to stop here: this is its pass too.
                session.asked?.answer(step);
                session.asked = undefined;
              });
        if (!o.agree) return mine ? stop() : undefined;
        // A tensor rank stops wherever another of its replica does (asked there, or not yet).
        return o.agree(step, mine).then((any) => (any ? stop() : undefined));
      },
      close: () => {
        session.asked?.answer(undefined);
        this.sessions.delete(key);
        this.decided.delete(key);
      },
    };
  }

  /**
   * Asks the generation `g` to switch to `model` (which holds `version`) from its next pass: the
   * pass it stops before, or undefined where no such generation runs here.
   */
  ask(g: GenerationKey, model: string, version: number): Promise<number | undefined> {
    const session = this.sessions.get(keyOf(g));
    if (!session) return Promise.resolve(undefined);
    // Already stopped before a pass (with the other tensor ranks of its replica): that one.
    if (session.waiting) return Promise.resolve(session.waiting.step);
    if (session.asked) return Promise.reject(new Error(`the generation of iteration ${g.iteration} on '${g.model}' is already asked to switch to version ${session.asked.version}`));
    return new Promise((answer) => (session.asked = { version, model, answer }));
  }

  /** The decision: `g` goes on with `model` (version `version`) from pass `step`, now or when it gets there. */
  decide(g: GenerationKey, model: string, version: number, step: number): void {
    const key = keyOf(g);
    const d = { step, version, model };
    const waiting = this.sessions.get(key)?.waiting;
    if (waiting && waiting.step === step) {
      this.sessions.get(key)!.waiting = undefined;
      this.sessions.get(key)!.planned.delete(step);
      waiting.go(d);
      return;
    }
    this.decided.set(key, [...(this.decided.get(key) ?? []), d]);
  }

  /** Forgets every generation (a device's reset): one stopped before a pass fails with `why`. */
  clear(why: string): void {
    for (const s of this.sessions.values()) {
      s.asked?.answer(undefined);
      s.waiting?.fail(new Error(why));
    }
    this.sessions.clear();
    this.decided.clear();
  }

  private take(key: string, step: number): Decided | undefined {
    const all = this.decided.get(key);
    const i = all?.findIndex((d) => d.step === step) ?? -1;
    if (i < 0) return undefined;
    const [d] = all!.splice(i, 1);
    this.sessions.get(key)?.planned.delete(step);
    return d;
  }
}
