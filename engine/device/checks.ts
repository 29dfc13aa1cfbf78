// What a device refuses in a call before anything runs: a loss it cannot run as planned, per-token
// arrays that do not fit the loss, arrays that do not fit the model.
import type { CallBody, CallOf, ErrorCode } from '../../mesh/wire/index.ts';
import { lossOf, lossParams, lossSource, type Loss } from '../model/index.ts';

/** A call refused, with its error code. */
export class CallRejected extends Error {
  override name = 'CallRejected';
  constructor(
    readonly code: ErrorCode,
    message: string,
  ) {
    super(message);
  }
}

/**
 * What is wrong with a train call's loss: unknown here, from another copy of its file than the
 * one the supervisor planned with, or parameters its schema refuses. Refused with code `loss`:
 * it would fail the same way after any recovery.
 */
export function lossProblem(body: CallOf<'train'>): string | undefined {
  try {
    const fn = lossOf(body.loss.name);
    const source = lossSource(fn.name);
    const want = body.loss.module;
    if (want && source?.sha256 !== want.sha256) {
      return `the loss '${fn.name}' of ${want.file} (SHA-256 ${want.sha256}) is not loaded on this device${source ? `: it has the loss from ${source.file} (SHA-256 ${source.sha256})` : ' (the shard was loaded without its module)'}`;
    }
    if (!want && source) return `the loss '${fn.name}' here is ${source.file}'s, but the call names the built-in one`;
    lossParams(fn, body.loss.params);
    return undefined;
  } catch (e) {
    return (e as Error).message;
  }
}

/** What is wrong with a train call's per-token arrays, given its loss; undefined when nothing is. */
export function dataProblem(body: CallOf<'train'>): string | undefined {
  const fn: Loss = lossOf(body.loss.name);
  if (body.batch % fn.rowsPerItem !== 0) return `the loss '${body.loss.name}' takes rows in groups of ${fn.rowsPerItem}; the batch has ${body.batch}`;
  for (const port of fn.ports(lossParams(fn, body.loss.params))) {
    const a = body.data[port];
    if (!a) return `the loss '${body.loss.name}' reads '${port}'; the call's data has ${Object.keys(body.data).join(', ') || 'nothing'}`;
    if (a.length !== body.batch * body.responseLen) return `data.${port} has ${a.length} values, expected ${body.batch * body.responseLen}`;
  }
  const mask = body.data.mask;
  if (mask) {
    if (mask.length !== body.batch * body.responseLen) return `data.mask has ${mask.length} values, expected ${body.batch * body.responseLen}`;
    for (let i = 0; i < mask.length; i++) {
      if (mask[i] !== 0 && mask[i] !== 1) return `data.mask[${i}] = ${mask[i]}; a response mask holds 1 (a token the response has) or 0 (padding)`;
    }
  }
  return undefined;
}

/** What is wrong with a call's arrays, given the model's shape; undefined when nothing is. */
export function shapeProblem(body: CallBody, spec: { vocab: number; context: number } | undefined): string | undefined {
  const expect = (what: string, got: number, want: number) => (got === want ? undefined : `${what} has ${got} values, expected ${want}`);
  const tokensIn = (what: string, t: Int32Array) => {
    if (!spec) return undefined;
    for (let i = 0; i < t.length; i++) {
      if (t[i]! < 0 || t[i]! >= spec.vocab) return `${what}[${i}] = ${t[i]} is not a token of a vocabulary of ${spec.vocab}`;
    }
    return undefined;
  };
  const fits = (len: number) => (spec && len > spec.context ? `sequences of ${len} tokens exceed the model's context of ${spec.context}` : undefined);
  switch (body.fn) {
    case 'generate':
      return (
        expect('prompts', body.prompts.length, body.batch * body.promptLen) ??
        expect('seeds', body.seeds.length, body.batch) ??
        fits(body.promptLen + body.responseLen) ??
        (body.episodes
          ? (expect('episodes.ids', body.episodes.ids.length, body.batch) ??
            expect('episodes.tasks', body.episodes.tasks.length, body.batch) ??
            (body.episodes.stop.length ? tokensIn('episodes.stop', Int32Array.from(body.episodes.stop)) : undefined))
          : undefined) ??
        tokensIn('prompts', body.prompts) ??
        (body.eos !== undefined ? tokensIn('eos', Int32Array.of(body.eos)) : undefined) ??
        (body.slots !== undefined && body.episodes ? `slots (${body.slots}) with episodes: episodes play in groups of their own (episodes.group_size), not in slots` : undefined) ??
        (body.samples !== undefined && body.slots === undefined
          ? `samples ('${body.samples}') without slots: a generation sends its rows as they end only when it generates continuously`
          : undefined) ??
        (body.inflight !== undefined && body.slots === undefined ? 'inflight without slots: a generation takes new versions in flight only when it generates continuously' : undefined)
      );
    case 'inference':
    case 'sft':
    case 'train': {
      const width = body.promptLen + body.responseLen;
      return (
        expect('tokens', body.tokens.length, body.batch * width) ??
        (body.fn === 'train' ? dataProblem(body) : undefined) ??
        (body.fn === 'sft' && body.mask ? expect('mask', body.mask.length, body.batch * body.responseLen) : undefined) ??
        fits(width) ??
        tokensIn('tokens', body.tokens)
      );
    }
    default:
      return undefined;
  }
}
