// The rows of a continuous generation, kept by the supervisor as they end: each generating device
// sends a row the moment its response ends (its `samples` subject), the ledger keeps it, tells
// whoever scores rows as they come, and writes what it holds to the run's store. A generation
// called again after a fault asks only for the rows the ledger lacks: a row is the same bit for
// bit whatever else was generated with it (continuous.ts), so the rows kept and those generated
// again make the rollout an uninterrupted call would have made. The store holds them under the
// stage's own name, so that a supervisor that takes the run over finds them too.
//
// Only rows of the current epoch's call are taken (a device a recovery abandoned decodes on in its
// own world), and only rows of the right shape.
import type { SampleLog } from '../../mesh/wire/index.ts';

/** Where the ledger keeps what it heard (the run's store: RunStore's stages). */
export interface SampleStore {
  saveStage(iteration: number, stage: string, value: unknown): Promise<void>;
  loadStage<T>(iteration: number, stage: string): Promise<T | undefined>;
}

/** The stage a generation's rows are stored under while it runs, beside its result. */
export const samplesStage = (stage: string) => `samples-${stage}`;

interface Stored {
  rows: number[];
  tokens: Int32Array;
  logprobs: Float32Array;
  /** In flight: each token's version [rows, responseLen]. */
  versions?: Int32Array;
}

/** A row as kept: its tokens [width], log-probabilities [responseLen] and, in flight, each token's version [responseLen]. */
interface Kept {
  tokens: Int32Array;
  logprobs: Float32Array;
  versions?: Int32Array;
}

export class SampleLedger {
  /** Each row of the batch as kept. */
  private readonly kept = new Map<number, Kept>();
  /** The call now running: its rows, in the order of the batch it was sent (its row i is this batch's row asked[i]). */
  private asked: number[] = [];
  private written = 0;
  private writing: Promise<void> = Promise.resolve();
  private timer: ReturnType<typeof setTimeout> | undefined;
  private stop: () => void = () => {};
  /** Told of each row as it is kept, by its row in the whole batch (listen). */
  private onRow?: (row: number, tokens: Int32Array, logprobs: Float32Array) => void;

  private constructor(
    private readonly store: SampleStore,
    private readonly o: { iteration: number; stage: string; epoch: number; rows: number; width: number; responseLen: number; flushMs: number; say?: (line: string) => void; whole?: boolean },
  ) {}

  /**
   * The ledger of a generation of `rows` rows about to be sent in `epoch`: what the store holds
   * for it (rows that do not read are generated again), listening on `listen`.
   */
  static async open(
    store: SampleStore,
    listen: ((listener: (log: SampleLog) => void) => () => void) | undefined,
    o: { iteration: number; stage: string; epoch: number; rows: number; width: number; responseLen: number; flushMs?: number; say?: (line: string) => void; whole?: boolean },
  ): Promise<SampleLedger> {
    const ledger = new SampleLedger(store, { flushMs: 200, ...o });
    // `whole`: every row is made again, whatever was kept before (a generation in flight: the rows
    // kept came with switches of their own, which a replay could not make beside the new call's).
    const stored = o.whole ? undefined : await store.loadStage<Stored>(o.iteration, samplesStage(o.stage));
    if (stored && Array.isArray(stored.rows) && stored.tokens instanceof Int32Array && stored.logprobs instanceof Float32Array) {
      const { width, responseLen: R } = o;
      const versions = stored.versions instanceof Int32Array && stored.versions.length === stored.rows.length * R ? stored.versions : undefined;
      if (stored.tokens.length === stored.rows.length * width && stored.logprobs.length === stored.rows.length * R) {
        stored.rows.forEach((row, j) => ledger.take(row, stored.tokens.subarray(j * width, (j + 1) * width), stored.logprobs.subarray(j * R, (j + 1) * R), versions?.subarray(j * R, (j + 1) * R)));
      }
    }
    ledger.written = ledger.kept.size;
    if (listen) ledger.stop = listen((log) => ledger.hear(log));
    return ledger;
  }

  /** The rows of the batch not kept, ascending: what the next call asks for (it becomes the call now running). */
  ask(): number[] {
    this.asked = Array.from({ length: this.o.rows }, (_, i) => i).filter((i) => !this.kept.has(i));
    return this.asked;
  }

  /** A device's message: its row is kept when it is of the call now running and of the right shape. */
  hear(log: SampleLog): void {
    const { iteration, stage, epoch, width, responseLen } = this.o;
    if (log.iteration !== iteration || log.stage !== stage || log.epoch !== epoch) return;
    const row = this.asked[log.row];
    if (row === undefined || log.tokens.length !== width || log.logprobs.length !== responseLen || (log.versions && log.versions.length !== responseLen)) return;
    if (this.take(row, log.tokens, log.logprobs, log.versions)) this.schedule();
  }

  /** Tells `f` of every row kept so far, then of each as it is kept from the bus. */
  listen(f: (row: number, tokens: Int32Array, logprobs: Float32Array) => void): void {
    this.onRow = f;
    for (const [row, k] of this.kept) f(row, k.tokens, k.logprobs);
  }

  /** Rows kept so far. */
  get size(): number {
    return this.kept.size;
  }

  /**
   * The whole batch: the rows kept, and the rows the call now running answered (its reply, in the
   * order of ask()), which are kept too. Throws where a row is in neither.
   */
  rollout(reply?: { tokens: Int32Array; logprobs: Float32Array; versions?: Int32Array }): { tokens: Int32Array; logprobs: Float32Array; versions?: Int32Array } {
    const { rows, width, responseLen: R } = this.o;
    if (reply)
      this.asked.forEach((row, i) =>
        this.take(row, reply.tokens.subarray(i * width, (i + 1) * width), reply.logprobs.subarray(i * R, (i + 1) * R), reply.versions?.subarray(i * R, (i + 1) * R), true),
      );
    const tokens = new Int32Array(rows * width);
    const logprobs = new Float32Array(rows * R);
    // In flight, every row names its tokens' versions.
    const versions = [...this.kept.values()].some((k) => k.versions) ? new Int32Array(rows * R).fill(-1) : undefined;
    for (let row = 0; row < rows; row++) {
      const k = this.kept.get(row);
      if (!k) throw new Error(`the generation of iteration ${this.o.iteration}, ${this.o.stage}, has no row ${row}: neither kept nor in the reply`);
      tokens.set(k.tokens, row * width);
      logprobs.set(k.logprobs, row * R);
      if (versions && k.versions) versions.set(k.versions, row * R);
    }
    return { tokens, logprobs, ...(versions ? { versions } : {}) };
  }

  /** Stops listening and writes what is left; resolves when the store has it. */
  async close(): Promise<void> {
    this.stop();
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    this.write();
    await this.writing;
  }

  private take(row: number, tokens: Int32Array, logprobs: Float32Array, versions?: Int32Array, quiet = false): boolean {
    if (this.kept.has(row)) return false;
    const k: Kept = { tokens: tokens.slice(), logprobs: logprobs.slice(), ...(versions ? { versions: versions.slice() } : {}) };
    this.kept.set(row, k);
    if (!quiet) this.onRow?.(row, k.tokens, k.logprobs);
    return true;
  }

  private schedule(): void {
    this.timer ??= setTimeout(() => {
      this.timer = undefined;
      this.write();
    }, this.o.flushMs);
  }

  /** One write at a time, each of everything so far: the last one written holds the most. */
  private write(): void {
    const count = this.kept.size;
    if (count === this.written) return;
    const { width, responseLen: R, iteration, stage } = this.o;
    const rows = [...this.kept.keys()];
    const tokens = new Int32Array(rows.length * width);
    const logprobs = new Float32Array(rows.length * R);
    const versions = rows.every((row) => this.kept.get(row)!.versions) ? new Int32Array(rows.length * R) : undefined;
    rows.forEach((row, j) => {
      tokens.set(this.kept.get(row)!.tokens, j * width);
      logprobs.set(this.kept.get(row)!.logprobs, j * R);
      versions?.set(this.kept.get(row)!.versions!, j * R);
    });
    this.writing = this.writing
      .then(() => this.store.saveStage(iteration, samplesStage(stage), { rows, tokens, logprobs, ...(versions ? { versions } : {}) }))
      .then(
        () => {
          this.written = Math.max(this.written, count);
        },
        (e: unknown) => {
          // A write that fails loses no work: after a fault those rows are generated again, the same.
          this.o.say?.(`could not store the generated rows of iteration ${iteration}, ${stage}: ${(e as Error).message}; after a fault they would be generated again`);
        },
      );
  }
}
