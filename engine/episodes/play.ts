// Episodes of several turns, played on the device that generates: the policy writes an action until
// its end-of-turn token (or a stop string, or the turn's token budget), the action's text goes to
// the environment, and the observation's tokens are appended to the sequence, which goes on
// decoding with the KV cache it already holds. Token in, token out: a sequence keeps the exact ids
// that were sampled; an observation is tokenized once, when it arrives; nothing is decoded and
// encoded again.
//
// The episodes of a call are played in fixed groups, each its own batch and KV cache. A group
// moves in rounds: every live episode writes its action (one pass per token for those still
// writing), the actions go to the environment together, and the observations are appended in one
// pass. While a group waits on its environment the device decodes the others, so latency is hidden
// when there are groups enough. What a group computes depends only on its episodes (never on which
// group was ready first), so a run replays bit for bit.
import type { EnvTask, EnvTurn } from '../../mesh/wire/index.ts';
import { Rng, sampleToken, type RowDecoder, type Sampling } from '../model/index.ts';

/** When an episode's action ends and how long an episode may go on. */
export interface TurnBudget {
  /** Actions per episode, at most. */
  maxTurns: number;
  /** Tokens of one action, at most. */
  turnTokens: number;
  /** Tokens that end an action (kept in it): the end-of-turn token. */
  stop: readonly number[];
  /** An action also ends when its text ends with one of these. */
  stopStrings?: readonly string[];
}

/** Between tokens and text at a turn's edges. */
export interface TurnCodec {
  /** An action's text, for the environment. */
  action(tokens: readonly number[]): string;
  /** The tokens an observation appends (a chat template renders it as its role's message). */
  observation(text: string, first: boolean): number[];
  /** The tokens of an action given as text (a demonstration's), without its end-of-turn token. */
  actionTokens(text: string): number[];
}

/** The environment's side of an episode (EnvClient, or a record being replayed). */
export interface EpisodeEnv {
  /** An answer read from a record carries the seconds it took when it was asked. */
  reset(episode: string, task: EnvTask, maxTurns: number): Promise<EnvTurn & { seconds?: number }>;
  step(episode: string, action: string): Promise<EnvTurn & { seconds?: number }>;
  end(episode: string): Promise<void>;
}

/** One step of an episode as it happened. */
export interface TurnRecord {
  /** The action's tokens, as sampled, and its text as sent. */
  action: number[];
  text: string;
  observation: string;
  /** Tokens the observation appended (0 when the episode ended there). */
  observationTokens: number;
  reward: number;
  done: boolean;
  info?: Record<string, number>;
  instance: string;
  seconds: number;
}

export interface EpisodeRecord {
  id: string;
  /** The reset's observation and who answered it. */
  reset: { observation: string; tokens: number; instance: string; seconds: number };
  turns: TurnRecord[];
  /** The sum of the steps' rewards. */
  return: number;
  /** Why it ended: the environment said done, the turn budget, or no room left in the sequence. */
  end: 'done' | 'turns' | 'truncated';
}

export interface Played {
  /** [rows, promptLen + responseLen]: the prompt, then the reset observation, actions and observations; then `fill`. */
  tokens: Int32Array;
  /** [rows, responseLen]: 1 at the tokens the policy sampled, 0 at observations and after the end. */
  mask: Float32Array;
  /** [rows, responseLen]: each step's reward at the last token of its action. */
  rewards: Float32Array;
  episodes: EpisodeRecord[];
  /** Seconds the device spent decoding, and the call's seconds: its idle share is 1 − busy / seconds. */
  busySeconds: number;
  seconds: number;
}

export interface PlayOptions extends Sampling {
  /** This replica's prompts [rows, promptLen] (left-padded), tasks and episode ids, one per row. */
  prompts: Int32Array;
  tasks: EnvTask[];
  ids: string[];
  /** Each row's sampling stream. */
  seeds: Uint32Array;
  promptLen: number;
  responseLen: number;
  budget: TurnBudget;
  /** Episodes decoded as one batch (default 8). */
  groupSize?: number;
  /** The token after a sequence's end. */
  fill: number;
  /** A decoding session for `rows` sequences of `capacity` positions. */
  decoder(rows: number, capacity: number): Promise<RowDecoder>;
  vocab: number;
  /** Reached after each round's answers are in, before they are appended (chaos: a kill mid-episode). */
  afterRound?: () => Promise<void>;
}

/** What a call's episodes start as: each row its prompt, then `fill`; no mask, rewards or records yet. */
export function playedOf(o: Pick<PlayOptions, 'ids' | 'prompts' | 'promptLen' | 'responseLen' | 'fill'>): Played {
  const rows = o.ids.length;
  const { promptLen: P, responseLen: R } = o;
  const width = P + R;
  const out: Played = {
    tokens: new Int32Array(rows * width).fill(o.fill),
    mask: new Float32Array(rows * R),
    rewards: new Float32Array(rows * R),
    episodes: new Array(rows),
    busySeconds: 0,
    seconds: 0,
  };
  for (let r = 0; r < rows; r++) out.tokens.set(o.prompts.subarray(r * P, (r + 1) * P), r * width);
  return out;
}

export async function playEpisodes(env: EpisodeEnv, codec: TurnCodec, o: PlayOptions): Promise<Played> {
  const started = performance.now();
  const rows = o.ids.length;
  const { promptLen: P, responseLen: R } = o;
  const width = P + R;
  const out = playedOf(o);
  const size = Math.max(1, o.groupSize ?? 8);
  const groups: number[][] = [];
  for (let lo = 0; lo < rows; lo += size) groups.push(Array.from({ length: Math.min(size, rows - lo) }, (_, i) => lo + i));
  const opened = new Set<string>();
  // The device decodes one group's round at a time, first come first served: a group that has its
  // observations writes its whole next action while the others wait on their environment, so
  // rounds stagger instead of moving in step. The order never changes what a group computes.
  let queue: Promise<unknown> = Promise.resolve();
  // The first group that fails stops the others at their next round (the call has failed).
  let failed: unknown;
  const onDevice = <T>(f: () => Promise<T>): Promise<T> => {
    const run = queue.then(async () => {
      if (failed !== undefined) throw failed;
      const t0 = performance.now();
      try {
        return await f();
      } finally {
        out.busySeconds += (performance.now() - t0) / 1000;
      }
    });
    queue = run.catch(() => {});
    return run;
  };
  try {
    await Promise.all(
      groups.map((g) =>
        playGroup(g).catch((e: unknown) => {
          failed ??= e;
          throw e;
        }),
      ),
    );
  } finally {
    await Promise.all([...opened].map((id) => env.end(id).catch(() => {})));
  }
  out.seconds = (performance.now() - started) / 1000;
  return out;

  async function playGroup(members: number[]): Promise<void> {
    const n = members.length;
    // Each sequence's length so far (its next free position), what it feeds next, and its latest logits.
    const len = new Int32Array(n);
    const pending: number[][] = members.map(() => []);
    const logits: Array<Float32Array | undefined> = members.map(() => undefined);
    const rngs = members.map((r) => new Rng(o.seeds[r]!));
    const live = new Uint8Array(n).fill(1);
    const timed = async (f: () => Promise<EnvTurn & { seconds?: number }>): Promise<{ value: EnvTurn; seconds: number }> => {
      const t0 = performance.now();
      const value = await f();
      return { value, seconds: value.seconds ?? (performance.now() - t0) / 1000 };
    };
    // Positions may run past the sequence by one pass's padding (rows sitting a pass out).
    const dec = await o.decoder(n, 2 * width);
    const write = (i: number, toks: readonly number[]) => {
      const r = members[i]!;
      out.tokens.set(toks, r * width + len[i]! + pending[i]!.length);
      pending[i]!.push(...toks);
    };
    const feed = async () => {
      const widest = Math.max(...pending.map((p) => p.length));
      if (widest === 0) return;
      const tokens = new Int32Array(n * widest).fill(o.fill);
      pending.forEach((p, i) => tokens.set(p, i * widest));
      const values = await dec.pass(
        tokens,
        widest,
        len,
        Int32Array.from(pending, (p) => Math.max(p.length - 1, 0)),
      );
      pending.forEach((p, i) => {
        if (!p.length) return;
        logits[i] = values.subarray(i * o.vocab, (i + 1) * o.vocab);
        len[i]! += p.length;
        pending[i] = [];
      });
    };
    const finish = (i: number, end: EpisodeRecord['end']) => {
      live[i] = 0;
      out.episodes[members[i]!]!.end = end;
      const id = o.ids[members[i]!]!;
      opened.delete(id);
      void env.end(id).catch(() => {});
    };
    try {
      // Reset: every episode's first observation follows its prompt, in one pass.
      const resets = await Promise.all(
        members.map((r) => {
          opened.add(o.ids[r]!);
          return timed(() => env.reset(o.ids[r]!, o.tasks[r]!, o.budget.maxTurns));
        }),
      );
      resets.forEach(({ value, seconds }, i) => {
        const r = members[i]!;
        const obs = codec.observation(value.observation, true);
        out.episodes[r] = { id: o.ids[r]!, reset: { observation: value.observation, tokens: obs.length, instance: value.instance, seconds }, turns: [], return: 0, end: 'done' };
        pending[i] = Array.from(o.prompts.subarray(r * P, (r + 1) * P));
        if (obs.length >= R) return finish(i, 'truncated');
        write(i, obs);
        if (value.done) finish(i, 'done');
      });
      for (let turn = 1; live.some((x) => x); turn++) {
        // Actions: one token per pass for every episode still writing.
        const action: number[][] = members.map(() => []);
        const writing = Uint8Array.from(live);
        const sample = () => {
          for (let i = 0; i < n; i++) {
            if (!writing[i]) continue;
            const tok = sampleToken(logits[i]!, o, o.greedy ? 0 : rngs[i]!.uniform());
            action[i]!.push(tok);
            const at = len[i]! + pending[i]!.length; // the token's position
            write(i, [tok]);
            const r = members[i]!;
            out.mask[r * R + at - P] = 1;
            const full = at + 1 >= width;
            if (full || o.budget.stop.includes(tok) || action[i]!.length >= o.budget.turnTokens || endsWithStop(codec, action[i]!, o.budget.stopStrings)) {
              writing[i] = 0;
              // The action's last token is fed with the observation that follows it.
              if (full) finish(i, 'truncated');
            }
          }
        };
        // The observations (or the prompts) first, then the actions, token by token.
        await onDevice(async () => {
          await feed();
          while (writing.some((x) => x)) {
            sample();
            // Those still writing feed their new token; those done wait for the observation.
            const hold = pending.map((p, i) => (writing[i] ? undefined : p));
            hold.forEach((_, i) => {
              if (!writing[i]) pending[i] = [];
            });
            await feed();
            hold.forEach((p, i) => {
              if (p) pending[i] = p;
            });
          }
        });
        // The environment answers every action of the round.
        const acting = members.map((_, i) => i).filter((i) => live[i]);
        const replies = await Promise.all(acting.map((i) => timed(() => env.step(o.ids[members[i]!]!, codec.action(action[i]!)))));
        await o.afterRound?.();
        acting.forEach((i, k) => {
          const { value, seconds } = replies[k]!;
          const next = answered(out, codec, o, { row: members[i]!, lastAt: len[i]! + pending[i]!.length - 1, action: action[i]!, turn }, value, seconds);
          if (Array.isArray(next)) write(i, next);
          else finish(i, next);
        });
        // Episodes that ended do not feed their last token.
        pending.forEach((_, i) => {
          if (!live[i]) pending[i] = [];
        });
      }
    } finally {
      dec.dispose();
    }
  }
}

/**
 * The environment's answer to an episode's action, taken into the call's record: its reward on the
 * action's last token (at position `lastAt`) and in the return, the turn's record; then how the
 * episode ends there (done, at the turn budget, or with no room for the observation and one more
 * token), or the observation's tokens it goes on with.
 */
export function answered(
  out: Played,
  codec: TurnCodec,
  o: Pick<PlayOptions, 'promptLen' | 'responseLen' | 'budget'>,
  at: { row: number; lastAt: number; action: number[]; turn: number },
  value: EnvTurn,
  seconds: number,
): EpisodeRecord['end'] | number[] {
  const { promptLen: P, responseLen: R } = o;
  const ep = out.episodes[at.row]!;
  out.rewards[at.row * R + at.lastAt - P]! += value.reward;
  ep.return += value.reward;
  const record: TurnRecord = {
    action: at.action,
    text: codec.action(at.action),
    observation: value.observation,
    observationTokens: 0,
    reward: value.reward,
    done: value.done,
    instance: value.instance,
    seconds,
    ...(value.info ? { info: value.info } : {}),
  };
  ep.turns.push(record);
  if (value.done) return 'done';
  if (at.turn >= o.budget.maxTurns) return 'turns';
  const obs = codec.observation(value.observation, false);
  // The observation and at least one token of the next action must fit.
  if (at.lastAt + 1 + obs.length >= P + R) return 'truncated';
  record.observationTokens = obs.length;
  return obs;
}

/** Whether an action's text ends with one of the stop strings. */
export function endsWithStop(codec: TurnCodec, action: readonly number[], stops: readonly string[] | undefined): boolean {
  if (!stops?.length) return false;
  const text = codec.action(action);
  return stops.some((s) => text.endsWith(s));
}
