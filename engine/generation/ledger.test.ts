import { describe, expect, it } from 'vitest';
import { PROTOCOL_VERSION, type SampleLog } from '../../mesh/wire/index.ts';
import { SampleLedger, samplesStage, type SampleStore } from './ledger.ts';

/** A run store's stages, in memory (what the ledger writes and reads back). */
function memoryStore(): SampleStore & { saved: Map<string, unknown> } {
  const saved = new Map<string, unknown>();
  return {
    saved,
    saveStage: async (i, stage, value) => void saved.set(`${i}/${stage}`, structuredClone(value)),
    loadStage: async <T>(i: number, stage: string) => saved.get(`${i}/${stage}`) as T | undefined,
  };
}

const [W, R] = [5, 3];
const rowOf = (n: number) => ({ tokens: Int32Array.from({ length: W }, (_, i) => n * 10 + i), logprobs: Float32Array.from({ length: R }, (_, i) => -(n + i / 10)) });
const log = (row: number, n: number, o: Partial<SampleLog> = {}): SampleLog => ({ type: 'sample', v: PROTOCOL_VERSION, epoch: 1, iteration: 4, stage: 'actor__generate', row, ...rowOf(n), ...o });

describe('the sample ledger', () => {
  it('keeps the rows of the call now running as they come, writes them, and after a fault asks only for the rows it lacks', async () => {
    const store = memoryStore();
    let hear!: (l: SampleLog) => void;
    const o = { iteration: 4, stage: 'actor__generate', epoch: 1, rows: 5, width: W, responseLen: R, flushMs: 1 };
    const first = await SampleLedger.open(store, (f) => ((hear = f), () => {}), o);
    const heard: number[] = [];
    first.listen((row) => heard.push(row));
    expect(first.ask()).toEqual([0, 1, 2, 3, 4]);
    hear(log(3, 3));
    hear(log(1, 1));
    // Not this call's: another epoch, iteration or stage, a row the call does not have, a wrong shape.
    hear(log(0, 0, { epoch: 0 }));
    hear(log(0, 0, { iteration: 5 }));
    hear(log(0, 0, { stage: 'other' }));
    hear(log(7, 0));
    hear(log(0, 0, { tokens: new Int32Array(2) }));
    // A row heard twice is kept once.
    hear(log(1, 9));
    expect(heard).toEqual([3, 1]);
    expect(first.size).toBe(2);
    await first.close();
    expect((store.saved.get(`4/${samplesStage('actor__generate')}`) as { rows: number[] }).rows).toEqual([3, 1]);

    // After a fault: the rows kept are told at once, and the call asks for the three others; its
    // row i is the batch's row asked[i].
    const again = await SampleLedger.open(store, (f) => ((hear = f), () => {}), { ...o, epoch: 2 });
    const told: number[] = [];
    again.listen((row) => told.push(row));
    expect(told).toEqual([3, 1]);
    expect(again.ask()).toEqual([0, 2, 4]);
    hear(log(1, 2, { epoch: 2 })); // the call's row 1: the batch's row 2
    expect(told).toEqual([3, 1, 2]);
    const reply = { tokens: new Int32Array(3 * W), logprobs: new Float32Array(3 * R) };
    [0, 2, 4].forEach((n, i) => {
      reply.tokens.set(rowOf(n).tokens, i * W);
      reply.logprobs.set(rowOf(n).logprobs, i * R);
    });
    const whole = again.rollout(reply);
    for (let n = 0; n < 5; n++) {
      expect(Array.from(whole.tokens.subarray(n * W, (n + 1) * W))).toEqual(Array.from(rowOf(n).tokens));
      expect(Array.from(whole.logprobs.subarray(n * R, (n + 1) * R))).toEqual(Array.from(rowOf(n).logprobs));
    }
    await again.close();
  });

  it('says which row it lacks when neither kept nor in the reply, and reads a stored record of the wrong shape as nothing', async () => {
    const store = memoryStore();
    const o = { iteration: 0, stage: 's', epoch: 0, rows: 2, width: W, responseLen: R };
    await store.saveStage(0, samplesStage('s'), { rows: [0], tokens: new Int32Array(3), logprobs: new Float32Array(R) });
    const ledger = await SampleLedger.open(store, undefined, o);
    expect(ledger.ask()).toEqual([0, 1]);
    expect(() => ledger.rollout()).toThrow('the generation of iteration 0, s, has no row 0: neither kept nor in the reply');
    await ledger.close();
  });
});
