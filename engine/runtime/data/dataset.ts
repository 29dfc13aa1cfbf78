// A prompt dataset in a JSONL file: one JSON object per line, the prompt and the reference answer
// under the fields the scenario names. The file is read once in chunks when it is opened — every
// line is checked then, so a bad line is refused before a run starts, with its number — and only
// each line's byte range is kept; rows are read back from the file as iterations ask for them.
// Blank lines are skipped. The order is a permutation drawn from the seed, a new one each epoch.
import { closeSync, openSync, readSync } from 'node:fs';
import { Rng, seedOf } from '../../model/index.ts';

export class DatasetError extends Error {
  override name = 'DatasetError';
}

export interface DatasetRow {
  /** The line's number in the file, from 1. */
  line: number;
  prompt: string;
  answer: string;
  /** A worked answer to warm a model up on, when the dataset names a field for one. */
  demo?: string;
}

export interface DatasetFields {
  prompt: string;
  answer: string;
  /** The field of a worked answer (a demonstration), if any. */
  demo?: string;
}

/** The seed stream of the dataset's order (apart from sampling's and initialisation's). */
const DATASET_STREAM = 0xda7a;

/** Bytes read per chunk while indexing. */
const CHUNK = 1 << 20;

/** A field's value as text: strings as they are, numbers as JSON writes them; else undefined. */
function text(value: unknown): string | undefined {
  if (typeof value === 'string') return value;
  if (typeof value === 'number' && Number.isFinite(value)) return String(value);
  return undefined;
}

function rowOf(file: string, line: number, bytes: Uint8Array, fields: DatasetFields): DatasetRow {
  const at = `${file}:${line}`;
  let parsed: unknown;
  try {
    parsed = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(bytes));
  } catch (e) {
    throw new DatasetError(`${at}: expected a JSON object on each line, got text that is not JSON (${(e as Error).message})`);
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) throw new DatasetError(`${at}: expected a JSON object, got ${JSON.stringify(parsed).slice(0, 60)}`);
  const o = parsed as Record<string, unknown>;
  const field = (name: string, what: string) => {
    if (!(name in o))
      throw new DatasetError(
        `${at}: expected the ${what} field "${name}", the line has ${
          Object.keys(o)
            .map((k) => `"${k}"`)
            .join(', ') || 'no fields'
        }`,
      );
    const t = text(o[name]);
    if (t === undefined) throw new DatasetError(`${at}: expected the ${what} field "${name}" to be text or a number, got ${JSON.stringify(o[name]).slice(0, 60)}`);
    return t;
  };
  const row: DatasetRow = { line, prompt: field(fields.prompt, 'prompt'), answer: field(fields.answer, 'answer') };
  return fields.demo === undefined ? row : { ...row, demo: field(fields.demo, 'demonstration') };
}

export class JsonlDataset {
  private constructor(
    readonly file: string,
    private readonly fields: DatasetFields,
    /** Per row: its line's byte offset, byte length and line number. */
    private readonly starts: Float64Array,
    private readonly lengths: Uint32Array,
    private readonly lines: Uint32Array,
  ) {}

  /** Indexes `file`, checking every line; refuses a file with no rows. */
  static open(file: string, fields: DatasetFields): JsonlDataset {
    let fd: number;
    try {
      fd = openSync(file, 'r');
    } catch (e) {
      throw new DatasetError(`cannot read the dataset ${file}: ${(e as Error).message}`);
    }
    const starts: number[] = [];
    const lengths: number[] = [];
    const lineNumbers: number[] = [];
    try {
      const buf = new Uint8Array(CHUNK);
      let carry = new Uint8Array(0); // a line begun in an earlier chunk
      let carryStart = 0;
      let offset = 0;
      let line = 0;
      const take = (bytes: Uint8Array, start: number) => {
        line++;
        let end = bytes.length;
        if (end > 0 && bytes[end - 1] === 0x0d) end--; // CRLF
        let first = 0;
        while (first < end && (bytes[first] === 0x20 || bytes[first] === 0x09)) first++;
        if (first === end) return; // blank
        rowOf(file, line, bytes.subarray(0, end), fields);
        starts.push(start);
        lengths.push(end);
        lineNumbers.push(line);
      };
      for (;;) {
        const n = readSync(fd, buf, 0, CHUNK, offset);
        if (n === 0) break;
        let from = 0;
        for (let i = 0; i < n; i++) {
          if (buf[i] !== 0x0a) continue;
          const piece = buf.subarray(from, i);
          if (carry.length) {
            const whole = new Uint8Array(carry.length + piece.length);
            whole.set(carry);
            whole.set(piece, carry.length);
            take(whole, carryStart);
            carry = new Uint8Array(0);
          } else {
            take(piece, offset + from);
          }
          from = i + 1;
        }
        if (from < n) {
          if (!carry.length) carryStart = offset + from;
          const rest = buf.subarray(from, n);
          const grown = new Uint8Array(carry.length + rest.length);
          grown.set(carry);
          grown.set(rest, carry.length);
          carry = grown;
        }
        offset += n;
      }
      if (carry.length) take(carry, carryStart);
    } finally {
      closeSync(fd);
    }
    if (starts.length === 0) throw new DatasetError(`${file}: expected at least one line with a JSON object, the file has none`);
    return new JsonlDataset(file, fields, Float64Array.from(starts), Uint32Array.from(lengths), Uint32Array.from(lineNumbers));
  }

  get size(): number {
    return this.starts.length;
  }

  /** Row i in file order (blank lines skipped), read from the file. */
  row(i: number): DatasetRow {
    return this.rows([i])[0]!;
  }

  /** Rows by index, read from the file opened once for all of them. */
  private rows(indices: readonly number[]): DatasetRow[] {
    for (const i of indices) if (!(Number.isInteger(i) && i >= 0 && i < this.size)) throw new DatasetError(`${this.file}: no row ${i}; it has ${this.size}`);
    const fd = openSync(this.file, 'r');
    try {
      return indices.map((i) => {
        const bytes = new Uint8Array(this.lengths[i]!);
        readSync(fd, bytes, 0, bytes.length, this.starts[i]!);
        return rowOf(this.file, this.lines[i]!, bytes, this.fields);
      });
    } finally {
      closeSync(fd);
    }
  }

  private cached?: { seed: number; epoch: number; order: Uint32Array };

  /** Epoch e's order: a permutation of the rows drawn from (seed, e); the last one is kept. */
  order(seed: number, epoch: number): Uint32Array {
    const c = this.cached;
    if (c && c.seed === seed && c.epoch === epoch) return c.order;
    const order = Uint32Array.from(new Rng(seedOf(seed, DATASET_STREAM, epoch)).permutation(this.size));
    this.cached = { seed, epoch, order };
    return order;
  }

  /**
   * The `count` rows of one iteration: the iteration's slice of the endless sequence of epochs,
   * each in its own order. The same seed and iteration always give the same rows.
   */
  batch(seed: number, iteration: number, count: number): DatasetRow[] {
    const indices = Array.from({ length: count }, (_, k) => {
      const position = iteration * count + k;
      return this.order(seed, Math.floor(position / this.size))[position % this.size]!;
    });
    return this.rows(indices);
  }
}
