import { beforeAll, describe, expect, it } from 'vitest';
import * as tf from '@tensorflow/tfjs';
import { Comm } from '../../mesh/parallel/index.ts';
import { MemoryBus, subjects, type EnvAnswer, type EnvTask, type EnvTurn } from '../../mesh/wire/index.ts';
import { GptRank, initBackend } from '../model/index.ts';
import { playEpisodes, type EpisodeEnv, type PlayOptions, type TurnCodec } from './play.ts';
import { playInSlots } from './slots.ts';
import { RecordedEnv } from './recorded.ts';

// Tokens 0-9 are digits, 10 ends a turn, 11 fills a sequence after its end.
const [END, FILL, VOCAB] = [10, 11, 12];
const codec: TurnCodec = {
  action: (toks) => toks.filter((t) => t < 10).join(''),
  observation: (text) => Array.from(text, (c) => Number(c)),
  actionTokens: (text) => Array.from(text, (c) => Number(c)),
};

/** A number game: the secret is the task's seed mod 10; the observation is "1" (higher) or "0" (lower), or `first` ("22") after the first guess. */
class Game implements EpisodeEnv {
  readonly log: string[] = [];
  readonly ended = new Set<string>();
  private readonly secrets = new Map<string, number>();
  private readonly turns = new Map<string, number>();
  constructor(
    private readonly delay: () => number = () => 0,
    private readonly fail?: (episode: string, turn: number) => boolean,
    private readonly first = '22',
  ) {}
  resume(episode: string, task: EnvTask, _maxTurns: number, actions: readonly string[]): void {
    this.secrets.set(episode, task.seed % 10);
    this.turns.set(episode, actions.length);
    this.log.push(`resume ${episode} after ${actions.length}`);
  }
  private wait() {
    return new Promise((r) => setTimeout(r, this.delay()));
  }
  async reset(episode: string, task: EnvTask): Promise<EnvTurn> {
    await this.wait();
    this.secrets.set(episode, task.seed % 10);
    this.log.push(`reset ${episode}`);
    return { observation: String(task.seed % 3), reward: 0, done: false, instance: 'i0' };
  }
  async step(episode: string, action: string): Promise<EnvTurn> {
    await this.wait();
    const turn = (this.turns.get(episode) ?? 0) + 1;
    this.turns.set(episode, turn);
    this.log.push(`step ${episode} ${turn} ${action}`);
    if (this.fail?.(episode, turn)) throw new Error(`environment 'game' (instance i0): it is gone`);
    const secret = this.secrets.get(episode)!;
    const guess = action === '' ? -1 : Number(action.slice(-1));
    if (guess === secret) return { observation: '', reward: 1, done: true, info: { turn }, instance: 'i0' };
    return { observation: turn === 1 ? this.first : guess < secret ? '1' : '0', reward: -0.1, done: false, instance: 'i0' };
  }
  async end(episode: string): Promise<void> {
    this.ended.add(episode);
  }
}

/** `rows` episodes of prompts of 3, up to 4 turns of up to 3 tokens each, in groups of 4, on `rank`. */
function playOptions(rank: GptRank, rows: number, group: string, o: Partial<PlayOptions> = {}): PlayOptions {
  const P = 3;
  return {
    prompts: Int32Array.from({ length: rows * P }, (_, i) => (i * 7) % 10),
    tasks: Array.from({ length: rows }, (_, r) => ({ prompt_text: '', seed: 3 * r + 1 })),
    ids: Array.from({ length: rows }, (_, r) => `0-${r}`),
    seeds: Uint32Array.from({ length: rows }, (_, r) => 100 + r),
    promptLen: P,
    responseLen: 30,
    budget: { maxTurns: 4, turnTokens: 3, stop: [END] },
    groupSize: 4,
    fill: FILL,
    vocab: VOCAB,
    temperature: 1,
    decoder: (n, capacity) => rank.decoder(group, n, capacity),
    ...o,
  };
}

describe('episodes of several turns on the generating device', () => {
  let rank: GptRank;
  beforeAll(async () => {
    await initBackend('wasm');
    const comm = new Comm(new MemoryBus(), subjects('episodes'), 0);
    rank = new GptRank({ kind: 'policy', vocab: VOCAB, context: 48, layers: 2, width: 16, heads: 2 }, { devices: [0], dp: 1, tp: 1, pp: 1 }, 0, 11, undefined, comm);
  });

  const rows = 6;
  const P = 3;
  const options = (o: Partial<PlayOptions> = {}) => playOptions(rank, rows, 'ep', o);

  it('keeps the sampled ids and appends each observation once: prompt, reset, then action and observation by turn; the mask marks the actions, rewards sit on their last tokens', async () => {
    const env = new Game();
    const before = tf.memory().numTensors;
    const out = await playEpisodes(env, codec, options());
    expect(tf.memory().numTensors).toBe(before);
    const W = P + 30;
    let multi = 0;
    for (let r = 0; r < rows; r++) {
      const ep = out.episodes[r]!;
      const row = Array.from(out.tokens.subarray(r * W, (r + 1) * W));
      // What the record says the sequence must be, rebuilt from it alone.
      const want = [...row.slice(0, P), ...codec.observation(ep.reset.observation, true)];
      const mask: number[] = new Array(want.length - P).fill(0);
      const rewards: number[] = new Array(want.length - P).fill(0);
      for (const t of ep.turns) {
        want.push(...t.action);
        mask.push(...t.action.map(() => 1));
        rewards.push(...t.action.map((_, k) => (k === t.action.length - 1 ? t.reward : 0)));
        expect(t.text).toBe(codec.action(t.action));
        expect(t.action.length).toBeLessThanOrEqual(3);
        // An action ends at its end token or its budget.
        expect(t.action.slice(0, -1)).not.toContain(END);
        if (t.observationTokens) {
          want.push(...codec.observation(t.observation, false));
          mask.push(...new Array(t.observationTokens).fill(0));
          rewards.push(...new Array(t.observationTokens).fill(0));
        }
      }
      expect(row.slice(0, want.length)).toEqual(want);
      expect(row.slice(want.length).every((t) => t === FILL)).toBe(true);
      expect(Array.from(out.mask.subarray(r * 30, r * 30 + mask.length))).toEqual(mask);
      expect(Array.from(out.rewards.subarray(r * 30, r * 30 + rewards.length)).map((x) => Math.round(x * 10) / 10)).toEqual(rewards);
      expect(out.mask.subarray(r * 30 + mask.length, (r + 1) * 30).every((m) => m === 0)).toBe(true);
      expect(ep.return).toBeCloseTo(
        ep.turns.reduce((a, t) => a + t.reward, 0),
        6,
      );
      expect(ep.end).toBe(ep.turns.at(-1)?.done ? 'done' : ep.turns.length === 4 ? 'turns' : 'truncated');
      if (ep.turns.length > 1) multi += 1;
    }
    expect(multi).toBeGreaterThan(0);
    expect(env.ended).toEqual(new Set(out.episodes.map((e) => e.id)));
    expect(out.busySeconds).toBeGreaterThan(0);
    expect(out.busySeconds).toBeLessThanOrEqual(out.seconds);
  });

  it('the same episodes bit for bit whatever the environment takes to answer, and in whatever order groups become ready', async () => {
    const a = await playEpisodes(new Game(), codec, options());
    let k = 0;
    const b = await playEpisodes(new Game(() => [30, 0, 7, 15][k++ % 4]!), codec, options());
    expect(Array.from(b.tokens)).toEqual(Array.from(a.tokens));
    expect(b.episodes.map((e) => e.turns.map((t) => t.text))).toEqual(a.episodes.map((e) => e.turns.map((t) => t.text)));
    // Other seeds: other episodes.
    const c = await playEpisodes(new Game(), codec, options({ seeds: Uint32Array.from({ length: rows }, (_, r) => 7 + r) }));
    expect(Array.from(c.tokens)).not.toEqual(Array.from(a.tokens));
  });

  it('ends an episode at the turn budget, and as truncated where an observation does not fit', async () => {
    const few = await playEpisodes(new Game(), codec, options({ budget: { maxTurns: 1, turnTokens: 3, stop: [END] } }));
    for (const ep of few.episodes) {
      expect(ep.turns).toHaveLength(1);
      expect(ep.end).toBe(ep.turns[0]!.done ? 'done' : 'turns');
    }
    // 8 tokens after the prompt: the reset (1), an action (≤ 3), "22" and one more token do not always fit.
    const tight = await playEpisodes(new Game(), codec, options({ responseLen: 6 }));
    expect(tight.episodes.some((e) => e.end === 'truncated')).toBe(true);
    for (const ep of tight.episodes) expect(1 + ep.turns.reduce((n, t) => n + t.action.length + t.observationTokens, 0)).toBeLessThanOrEqual(6);
  });

  it('an environment that fails fails the call, and every episode it opened is ended', async () => {
    const env = new Game(
      () => 0,
      (episode, turn) => episode === '0-4' && turn === 2,
    );
    await expect(playEpisodes(env, codec, options({ budget: { maxTurns: 4, turnTokens: 3, stop: [END] }, seeds: Uint32Array.from({ length: rows }, () => 5) }))).rejects.toThrow(/it is gone/);
    expect(env.ended).toEqual(new Set(options().ids));
  });

  it('played again after a fault, reads what the environment answered before it from the record and asks only what comes after, even of an environment that now answers otherwise', async () => {
    const one = options({ groupSize: rows });
    const clean = await playEpisodes(new RecordedEnv(new Game(), {}, () => {}), codec, one);
    // The first generation dies after its first round of steps; what it heard is kept as it comes.
    const kept: EnvAnswer[] = [];
    const killed = new Game();
    await expect(
      playEpisodes(new RecordedEnv(killed, {}, (a) => kept.push(a)), codec, {
        ...one,
        afterRound: async () => {
          throw new Error('killed mid-episode');
        },
      }),
    ).rejects.toThrow(/killed mid-episode/);
    expect(kept.filter((a) => a.k === 0)).toHaveLength(rows);
    expect(kept.filter((a) => a.k === 1)).toHaveLength(rows);
    const recorded: Record<string, EnvAnswer[]> = {};
    for (const a of kept) (recorded[a.episode] ??= []).push(a);
    // Another instance that answers the first guess otherwise ("3", not "22").
    const other = new Game(() => 0, undefined, '3');
    const heard: EnvAnswer[] = [];
    const again = await playEpisodes(new RecordedEnv(other, recorded, (a) => heard.push(a)), codec, one);
    expect(Array.from(again.tokens)).toEqual(Array.from(clean.tokens));
    expect(Array.from(again.mask)).toEqual(Array.from(clean.mask));
    expect(again.episodes.map((e) => e.turns.map((t) => t.observation))).toEqual(clean.episodes.map((e) => e.turns.map((t) => t.observation)));
    // Nothing recorded was asked again: no reset, no first step; an episode going on was resumed after its recorded action.
    expect(other.log.filter((l) => l.startsWith('reset '))).toEqual([]);
    expect(other.log.filter((l) => / 1 \S*$/.test(l) && l.startsWith('step '))).toEqual([]);
    const live = clean.episodes.filter((e) => e.turns.length > 1).map((e) => e.id);
    expect(live.length).toBeGreaterThan(0);
    expect(other.log.filter((l) => l.startsWith('resume ')).sort()).toEqual(live.map((id) => `resume ${id} after 1`).sort());
    expect(heard.every((a) => a.k >= 2)).toBe(true);
    expect(other.ended).toEqual(new Set(live));
    // Without the record the other instance's answers change the episodes.
    const fresh = await playEpisodes(new RecordedEnv(new Game(() => 0, undefined, '3'), {}, () => {}), codec, one);
    expect(Array.from(fresh.tokens)).not.toEqual(Array.from(clean.tokens));
  });

  it('a record whose action is not the one played again fails the call, saying so', async () => {
    const one = options({ groupSize: rows });
    const kept: EnvAnswer[] = [];
    await playEpisodes(new RecordedEnv(new Game(), {}, (a) => kept.push(a)), codec, one);
    const recorded: Record<string, EnvAnswer[]> = {};
    for (const a of kept) (recorded[a.episode] ??= []).push(a.episode === '0-2' && a.k === 1 ? { ...a, action: `${a.action}9` } : a);
    await expect(playEpisodes(new RecordedEnv(new Game(), recorded, () => {}), codec, one)).rejects.toThrow(
      /episode 0-2, step 1: the action played again after a fault, ".*", is not the one the environment answered before it/,
    );
  });
});

describe('episodes in slots (rl.slots with an environment)', () => {
  let rank: GptRank;
  beforeAll(async () => {
    await initBackend('wasm');
    const comm = new Comm(new MemoryBus(), subjects('episodes-slots'), 0);
    rank = new GptRank({ kind: 'policy', vocab: VOCAB, context: 48, layers: 2, width: 16, heads: 2 }, { devices: [0], dp: 1, tp: 1, pp: 1 }, 0, 11, undefined, comm);
  });
  const rows = 7;
  const options = (o: Partial<PlayOptions> = {}) => playOptions(rank, rows, 'ep-slots', o);
  const same = (a: Awaited<ReturnType<typeof playEpisodes>>, b: Awaited<ReturnType<typeof playEpisodes>>, what: string) => {
    expect(Array.from(b.tokens), what).toEqual(Array.from(a.tokens));
    expect(Array.from(b.mask), what).toEqual(Array.from(a.mask));
    expect(Array.from(b.rewards), what).toEqual(Array.from(a.rewards));
    const strip = (p: typeof a) => p.episodes.map((e) => ({ ...e, reset: { ...e.reset, seconds: 0 }, turns: e.turns.map((t) => ({ ...t, seconds: 0 })) }));
    expect(strip(b), what).toEqual(strip(a));
  };

  it('each episode equals the same episode played in groups, bit for bit, in 1, 2, 3 or 7 slots, whatever the environment takes to answer', async () => {
    const grouped = await playEpisodes(new Game(), codec, options());
    expect(grouped.episodes.filter((e) => e.turns.length > 1).length).toBeGreaterThan(0);
    const before = tf.memory().numTensors;
    for (const slots of [1, 2, 3, 7]) {
      let k = 0;
      const env = new Game(() => [12, 0, 5, 3][k++ % 4]!);
      const slotted = await playInSlots(env, codec, { ...options(), slots });
      same(grouped, slotted, `${slots} slots`);
      expect(env.ended).toEqual(new Set(options().ids));
      expect(slotted.busySeconds).toBeGreaterThan(0);
      expect(slotted.busySeconds).toBeLessThanOrEqual(slotted.seconds);
    }
    expect(tf.memory().numTensors).toBe(before);
    // At the turn budget and truncated, as in groups.
    for (const o of [{ budget: { maxTurns: 1, turnTokens: 3, stop: [END] } }, { responseLen: 6 }]) {
      same(await playEpisodes(new Game(), codec, options(o)), await playInSlots(new Game(), codec, { ...options(o), slots: 3 }), JSON.stringify(o));
    }
  });

  it('an environment that fails fails the call, every episode it opened ended; played again, what was recorded is read, not asked', async () => {
    const env = new Game(
      () => 0,
      (episode, turn) => episode === '0-4' && turn === 2,
    );
    await expect(playInSlots(env, codec, { ...options({ seeds: Uint32Array.from({ length: rows }, () => 5) }), slots: 3 })).rejects.toThrow(/it is gone/);
    expect(env.ended).toEqual(new Set(options().ids));
    const clean = await playInSlots(new RecordedEnv(new Game(), {}, () => {}), codec, { ...options(), slots: 3 });
    const kept: EnvAnswer[] = [];
    let answers = 0;
    await expect(
      playInSlots(new RecordedEnv(new Game(), {}, (a) => kept.push(a)), codec, {
        ...options(),
        slots: 3,
        afterRound: async () => {
          if (++answers === 4) throw new Error('killed mid-episode');
        },
      }),
    ).rejects.toThrow(/killed mid-episode/);
    const recorded: Record<string, EnvAnswer[]> = {};
    for (const a of kept) (recorded[a.episode] ??= []).push(a);
    expect(kept.filter((a) => a.k > 0).length).toBeGreaterThanOrEqual(4);
    const other = new Game();
    const asked: EnvAnswer[] = [];
    const again = await playInSlots(new RecordedEnv(other, recorded, (a) => asked.push(a)), codec, { ...options(), slots: 3 });
    same(clean, again, 'played again');
    // Nothing recorded was asked again.
    expect(other.log.filter((l) => l.startsWith('reset '))).toEqual([]);
    for (const a of asked) expect(recorded[a.episode]?.some((b) => b.k === a.k) ?? false, `${a.episode} k=${a.k}`).toBe(false);
  });
});
