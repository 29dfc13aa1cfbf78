import { describe, expect, it } from 'vitest';
import { PROTOCOL_VERSION, type EnvAnswer, type TurnLog } from '../../mesh/wire/index.ts';
import { answersStage, TurnLedger, type LedgerStore } from './ledger.ts';

class Store implements LedgerStore {
  readonly values = new Map<string, unknown>();
  writes = 0;
  fail = false;
  async saveStage(iteration: number, stage: string, value: unknown): Promise<void> {
    if (this.fail) throw new Error('the stream is full');
    this.writes += 1;
    this.values.set(`${iteration}.${stage}`, structuredClone(value));
  }
  async loadStage<T>(iteration: number, stage: string): Promise<T | undefined> {
    return this.values.get(`${iteration}.${stage}`) as T | undefined;
  }
}

const answer = (episode: string, k: number, observation = `o${k}`): EnvAnswer => ({
  episode,
  k,
  ...(k > 0 ? { action: `a${k}` } : {}),
  observation,
  reward: k === 2 ? 1 : 0,
  done: k === 2,
  instance: 'i0',
  seconds: 0.01,
});
const log = (answers: EnvAnswer[], o: Partial<TurnLog> = {}): TurnLog => ({ type: 'turns', v: PROTOCOL_VERSION, epoch: 0, iteration: 3, stage: 'actor_gen', answers, ...o });

describe('the ledger of a generation’s environment answers', () => {
  it('keeps each episode’s answers in order from its reset, only those of its call and epoch, and writes them where a later ledger of the call finds them', async () => {
    const store = new Store();
    let listener: ((l: TurnLog) => void) | undefined;
    let listening = false;
    const listen = (l: (log: TurnLog) => void) => {
      listener = l;
      listening = true;
      return () => {
        listening = false;
      };
    };
    const a = await TurnLedger.open(store, listen, { iteration: 3, stage: 'actor_gen', epoch: 0, flushMs: 5 });
    listener!(log([answer('3-0', 0), answer('3-1', 0)]));
    listener!(log([answer('3-0', 1)]));
    listener!(log([answer('3-0', 1)])); // again: a duplicate
    listener!(log([answer('3-1', 2)])); // a gap: 3-1's step 1 never came
    listener!(log([answer('3-0', 2)], { epoch: 1 })); // another epoch's device
    listener!(log([answer('3-0', 2)], { iteration: 4 }));
    listener!(log([answer('3-0', 2)], { stage: 'other' }));
    listener!(log([{ ...answer('3-1', 1), action: undefined } as EnvAnswer])); // a step without its action
    expect(a.size).toBe(3);
    await a.close();
    expect(listening).toBe(false);
    const stored = store.values.get(`3.${answersStage('actor_gen')}`) as { answers: EnvAnswer[] };
    expect(stored.answers.map((x) => `${x.episode}/${x.k}`)).toEqual(['3-0/0', '3-0/1', '3-1/0']);
    // The call played again (next epoch) starts from the stored answers and extends them.
    const b = await TurnLedger.open(store, listen, { iteration: 3, stage: 'actor_gen', epoch: 1, flushMs: 5 });
    expect(b.recorded()).toEqual({ answers: { '3-0': [answer('3-0', 0), answer('3-0', 1)], '3-1': [answer('3-1', 0)] }, left: 0 });
    listener!(log([answer('3-0', 2)], { epoch: 1 }));
    listener!(log([answer('3-1', 1)], { epoch: 0 })); // the abandoned epoch's: not taken
    await b.close();
    expect((store.values.get(`3.${answersStage('actor_gen')}`) as { answers: EnvAnswer[] }).answers).toHaveLength(4);
  });

  it('writes at most once per flush period while answers come, and nothing when nothing came', async () => {
    const store = new Store();
    let listener!: (l: TurnLog) => void;
    const l = await TurnLedger.open(store, (f) => ((listener = f), () => {}), { iteration: 3, stage: 'actor_gen', epoch: 0, flushMs: 50 });
    for (let e = 0; e < 20; e++) listener(log([answer(`3-${e}`, 0)]));
    await new Promise((r) => setTimeout(r, 120));
    expect(store.writes).toBe(1);
    await l.close();
    expect(store.writes).toBe(1);
    const empty = await TurnLedger.open(new Store(), undefined, { iteration: 0, stage: 's', epoch: 0 });
    await empty.close();
    expect(empty.size).toBe(0);
  });

  it('carries back only what fits in the call: the first episode cut short and those after it are asked again', async () => {
    const store = new Store();
    const answers = ['3-0', '3-1', '3-2'].flatMap((e) => [answer(e, 0, 'x'.repeat(100)), answer(e, 1, 'y'.repeat(100)), answer(e, 2, 'z'.repeat(100))]);
    await store.saveStage(3, answersStage('actor_gen'), { answers });
    const l = await TurnLedger.open(store, undefined, { iteration: 3, stage: 'actor_gen', epoch: 1 });
    expect(l.size).toBe(9);
    const all = l.recorded();
    expect(Object.values(all.answers).flat()).toHaveLength(9);
    const cut = l.recorded(4 * 180);
    expect(Object.keys(cut.answers)).toEqual(['3-0', '3-1']);
    expect(cut.answers['3-1']!.map((a) => a.k)).toEqual([0]);
    expect(cut.left).toBe(5);
  });

  it('a stored record that does not read is not used, and a write that fails is said, losing nothing else', async () => {
    const store = new Store();
    store.values.set(`3.${answersStage('actor_gen')}`, { answers: [{ episode: '3-0', k: 'zero' }] });
    const said: string[] = [];
    let listener!: (l: TurnLog) => void;
    const l = await TurnLedger.open(store, (f) => ((listener = f), () => {}), { iteration: 3, stage: 'actor_gen', epoch: 0, say: (x) => said.push(x) });
    expect(l.size).toBe(0);
    store.fail = true;
    listener(log([answer('3-0', 0)]));
    await l.close();
    expect(l.recorded().answers['3-0']).toHaveLength(1);
    expect(said.join('\n')).toMatch(/could not store the environment's answers of iteration 3, actor_gen: the stream is full; after a fault they would be asked again/);
  });
});
