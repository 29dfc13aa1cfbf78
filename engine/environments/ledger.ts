// The answers a generation's episodes received from their environment, kept by the supervisor
// while the generation runs: each generating device sends them as they come (its `turns`
// subject), the ledger keeps every episode's answers in order from its reset and writes them to
// the run's store, and a generation played again after a fault carries them to the device, which
// reads them instead of asking the environment again. The store holds them under the stage's own
// name, so that a supervisor that takes the run over finds them too.
//
// Only a gapless prefix of each episode is kept: an answer is taken when it is the next one of its
// episode (a message lost while no supervisor listened ends that episode's record there), and only
// from calls of the current epoch (a device a recovery abandoned plays on in its own world).
import { EnvAnswer, type TurnLog } from '../../mesh/wire/index.ts';
import { z } from 'zod';

/** Where the ledger keeps what it heard (the run's store: RunStore's stages). */
export interface LedgerStore {
  saveStage(iteration: number, stage: string, value: unknown): Promise<void>;
  loadStage<T>(iteration: number, stage: string): Promise<T | undefined>;
}

/** The stage a generation's answers are stored under, beside its result. */
export const answersStage = (stage: string) => `turns-${stage}`;

const Stored = z.strictObject({ answers: z.array(EnvAnswer) });

/** Bytes of answers a call carries back, at most: its message must stay within the server's payload. */
export const RECORDED_BYTES = 256 * 1024;

export class TurnLedger {
  private readonly answers = new Map<string, EnvAnswer[]>();
  private count = 0;
  private written = 0;
  private writing: Promise<void> = Promise.resolve();
  private timer: ReturnType<typeof setTimeout> | undefined;
  private stop: () => void = () => {};

  private constructor(
    private readonly store: LedgerStore,
    private readonly iteration: number,
    private readonly stage: string,
    private readonly epoch: number,
    private readonly flushMs: number,
    private readonly say?: (line: string) => void,
  ) {}

  /**
   * The ledger of a generate call about to be sent in `epoch`: what the store holds for it (a
   * record that does not read is not used: those episodes are asked again), listening on `listen`.
   */
  static async open(
    store: LedgerStore,
    listen: ((listener: (log: TurnLog) => void) => () => void) | undefined,
    o: { iteration: number; stage: string; epoch: number; flushMs?: number; say?: (line: string) => void },
  ): Promise<TurnLedger> {
    const ledger = new TurnLedger(store, o.iteration, o.stage, o.epoch, o.flushMs ?? 200, o.say);
    const stored = Stored.safeParse(await store.loadStage(o.iteration, answersStage(o.stage)));
    if (stored.success) for (const a of stored.data.answers) ledger.take(a);
    ledger.written = ledger.count;
    if (listen) ledger.stop = listen((log) => ledger.hear(log));
    return ledger;
  }

  /** A device's message: its answers are kept when they are of this call and extend their episode's record. */
  hear(log: TurnLog): void {
    if (log.iteration !== this.iteration || log.stage !== this.stage || log.epoch !== this.epoch) return;
    let took = false;
    for (const a of log.answers) took = this.take(a) || took;
    if (took) this.schedule();
  }

  /** Answers heard so far, over every episode. */
  get size(): number {
    return this.count;
  }

  /**
   * What the call carries: each episode's answers in order, as many as fit in `bytes` (episodes in
   * the order of their ids' rows; past the budget, an episode's tail and the episodes after it are
   * asked again). `left` counts the answers left out.
   */
  recorded(bytes = RECORDED_BYTES): { answers: Record<string, EnvAnswer[]>; left: number } {
    const out: Record<string, EnvAnswer[]> = {};
    let used = 0;
    let left = 0;
    for (const [episode, list] of this.answers) {
      const kept: EnvAnswer[] = [];
      for (const a of list) {
        const size = 64 + a.episode.length + a.observation.length + (a.action?.length ?? 0) + a.instance.length + 24 * Object.keys(a.info ?? {}).length;
        if (used + size > bytes) break;
        used += size;
        kept.push(a);
      }
      left += list.length - kept.length;
      if (kept.length) out[episode] = kept;
      if (kept.length < list.length) bytes = used; // nothing more after the first episode cut short
    }
    return { answers: out, left };
  }

  /** Stops listening and writes what is left; resolves when the store has it. */
  async close(): Promise<void> {
    this.stop();
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    this.write();
    await this.writing;
  }

  private take(a: EnvAnswer): boolean {
    const list = this.answers.get(a.episode) ?? [];
    if (a.k !== list.length) return false;
    // A step's answer needs its action: it is what a replay is checked against.
    if (a.k > 0 && a.action === undefined) return false;
    list.push(a);
    this.answers.set(a.episode, list);
    this.count += 1;
    return true;
  }

  private schedule(): void {
    this.timer ??= setTimeout(() => {
      this.timer = undefined;
      this.write();
    }, this.flushMs);
  }

  /** One write at a time, each of everything so far: the last one written holds the most. */
  private write(): void {
    if (this.count === this.written) return;
    const count = this.count;
    const answers = [...this.answers.values()].flat();
    this.writing = this.writing
      .then(() => this.store.saveStage(this.iteration, answersStage(this.stage), { answers }))
      .then(
        () => {
          this.written = Math.max(this.written, count);
        },
        (e: unknown) => {
          // A write that fails loses no work: after a fault those answers are asked again.
          this.say?.(`could not store the environment's answers of iteration ${this.iteration}, ${this.stage}: ${(e as Error).message}; after a fault they would be asked again`);
        },
      );
  }
}
