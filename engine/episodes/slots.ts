// Episodes in slots (rl.slots with an environment): the device decodes a fixed number of episodes
// at once, its slots, and an episode waiting on its environment gives its slot to another. When an
// action ends, the action goes to the environment and the episode's keys and values are copied out
// of its slot (RowDecoder.stash); the slot takes the next episode that has something to decode (a
// new one's prompt and first observation, or an observation that came back, its keys and values
// put back where they were). So the device decodes while any episode is ready, not only when a
// whole group is: its idle time is what no episode has to give it.
//
// What an episode becomes depends only on its own prompt, seed and answers: its randomness is its
// own stream, a row's arithmetic is the same in any pass beside any others (a row that has nothing
// to feed feeds anything where its next real pass writes over it), and its keys and values leave
// and come back exact copies. So it equals the same episode played in groups (play.ts), bit for bit.
import type { EnvTurn } from '../../mesh/wire/index.ts';
import { Rng, sampleToken, type RowStash } from '../model/index.ts';
import { answered, endsWithStop, playedOf, type EpisodeEnv, type EpisodeRecord, type Played, type PlayOptions, type TurnCodec } from './play.ts';

interface Episode {
  /** Its row in the call. */
  row: number;
  id: string;
  rng: Rng;
  /** Positions its keys and values hold (in its slot or its stash): its next free position. */
  len: number;
  /** Tokens written, not yet fed (a prompt and an observation; an action's last token). */
  pending: number[];
  logits?: Float32Array;
  /** The action being written, and the actions so far. */
  action: number[];
  turn: number;
  stash?: RowStash;
  /** Its slot, if it holds one; whether it waits in the queue for one. */
  slot?: number;
  queued?: boolean;
  /** An answer of its environment is awaited (its reset, or its last action's step). */
  awaiting?: boolean;
  ended?: boolean;
}

/** playEpisodes with the episodes of the call decoded in `slots` slots instead of groups. */
export async function playInSlots(env: EpisodeEnv, codec: TurnCodec, o: PlayOptions & { slots: number }): Promise<Played> {
  const started = performance.now();
  const rows = o.ids.length;
  const { promptLen: P, responseLen: R } = o;
  const width = P + R;
  const out = playedOf(o);
  if (rows === 0) return out;
  const S = Math.max(1, Math.min(o.slots, rows));
  const episodes: Episode[] = o.ids.map((id, row) => ({ row, id, rng: new Rng(o.seeds[row]!), len: 0, pending: [], action: [], turn: 0 }));
  /** The episode in each slot (undefined: free). */
  const inSlot: Array<Episode | undefined> = Array.from({ length: S }, () => undefined);
  /** Episodes with something to decode and no slot, first come first served. */
  const ready: Episode[] = [];
  const opened = new Set<string>();
  let asking = 0;
  let failed: unknown;
  let wake: (() => void) | undefined;
  const woken = () => {
    const w = wake;
    wake = undefined;
    w?.();
  };
  const write = (e: Episode, toks: readonly number[]) => {
    out.tokens.set(toks, e.row * width + e.len + e.pending.length);
    e.pending.push(...toks);
  };
  const finish = (e: Episode, end: EpisodeRecord['end']) => {
    e.ended = true;
    out.episodes[e.row]!.end = end;
    e.pending = [];
    e.stash?.dispose();
    e.stash = undefined;
    opened.delete(e.id);
    void env.end(e.id).catch(() => {});
  };
  /** Asks the environment, and hears the answer in turn with the others. */
  const ask = (f: () => Promise<EnvTurn & { seconds?: number }>, then: (value: EnvTurn, seconds: number) => Promise<void> | void) => {
    asking += 1;
    const t0 = performance.now();
    f()
      .then(async (value) => {
        if (failed === undefined) await then(value, value.seconds ?? (performance.now() - t0) / 1000);
      })
      .catch((err: unknown) => {
        failed ??= err;
      })
      .finally(() => {
        asking -= 1;
        woken();
      });
  };
  const dec = await o.decoder(S, 2 * width);
  /** Takes `e` to the queue for a slot, unless it holds one or waits there already. */
  const toSlot = (e: Episode) => {
    if (e.slot === undefined && !e.queued) {
      e.queued = true;
      ready.push(e);
    }
  };
  /** An episode that ended leaves its slot, or drops what it stashed. */
  const leave = (e: Episode) => {
    if (e.slot !== undefined) inSlot[e.slot] = undefined;
    e.slot = undefined;
  };
  try {
    // Every episode's prompt is decoded while its reset is asked: only its first action waits for it.
    for (const e of episodes) {
      opened.add(e.id);
      e.pending = Array.from(o.prompts.subarray(e.row * P, (e.row + 1) * P));
      e.awaiting = true;
      toSlot(e);
      ask(
        () => env.reset(e.id, o.tasks[e.row]!, o.budget.maxTurns),
        (value, seconds) => {
          e.awaiting = false;
          const obs = codec.observation(value.observation, true);
          out.episodes[e.row] = { id: e.id, reset: { observation: value.observation, tokens: obs.length, instance: value.instance, seconds }, turns: [], return: 0, end: 'done' };
          if (obs.length >= R) return leave(e), finish(e, 'truncated');
          write(e, obs);
          if (value.done) return leave(e), finish(e, 'done');
          toSlot(e);
        },
      );
    }
    const stepped = (e: Episode) => async (value: EnvTurn, seconds: number) => {
      await o.afterRound?.();
      e.awaiting = false;
      const next = answered(out, codec, o, { row: e.row, lastAt: e.len + e.pending.length - 1, action: e.action, turn: e.turn }, value, seconds);
      e.action = [];
      if (!Array.isArray(next)) return finish(e, next);
      write(e, next);
      toSlot(e);
    };
    for (;;) {
      if (failed !== undefined) throw failed;
      // The device's work: putting keys and values back, the pass, keeping aside those that leave.
      const t0 = performance.now();
      // Free slots take the episodes that are ready, their keys and values put back where they left.
      for (let s = 0; s < S && ready.length; s++) {
        if (inSlot[s]) continue;
        const e = ready.shift()!;
        e.queued = false;
        if (e.ended) {
          s -= 1;
          continue;
        }
        inSlot[s] = e;
        e.slot = s;
        if (e.stash) {
          dec.restore(Int32Array.of(s), e.stash);
          e.stash.dispose();
          e.stash = undefined;
        }
      }
      if (!inSlot.some((e) => e)) {
        out.busySeconds += (performance.now() - t0) / 1000;
        if (asking === 0) break;
        await new Promise<void>((res) => (wake = res));
        continue;
      }
      // One pass: each episode in a slot feeds what it has (one with nothing, and a free slot,
      // feed anything where their next pass writes over it).
      const fed = inSlot.map((e) => e?.pending.length ?? 0);
      const widest = Math.max(1, ...fed);
      const tokens = new Int32Array(S * widest).fill(o.fill);
      const starts = new Int32Array(S);
      const last = new Int32Array(S);
      inSlot.forEach((e, s) => {
        if (!e) return;
        tokens.set(e.pending, s * widest);
        starts[s] = e.len;
        last[s] = Math.max(fed[s]! - 1, 0);
      });
      const values = await dec.pass(tokens, widest, starts, last);
      // Then each that has all it needs draws its action's next token; one whose action ends asks
      // the environment and leaves its slot (its last token is fed with the observation that
      // follows it), as does one still waiting for its reset.
      for (let s = 0; s < S; s++) {
        const e = inSlot[s];
        if (!e) continue;
        if (fed[s]! > 0) {
          e.logits = values.slice(s * o.vocab, (s + 1) * o.vocab);
          e.len += fed[s]!;
          // An answer that came during the pass appended tokens: they are fed next.
          e.pending = e.pending.slice(fed[s]!);
        }
        if (e.awaiting) {
          inSlot[s] = undefined;
          e.slot = undefined;
          e.stash = dec.stash(Int32Array.of(s));
          continue;
        }
        if (e.pending.length) continue;
        const tok = sampleToken(e.logits!, o, o.greedy ? 0 : e.rng.uniform());
        e.action.push(tok);
        const at = e.len; // the token's position
        write(e, [tok]);
        out.mask[e.row * R + at - P] = 1;
        const full = at + 1 >= width;
        if (!(full || o.budget.stop.includes(tok) || e.action.length >= o.budget.turnTokens || endsWithStop(codec, e.action, o.budget.stopStrings))) continue;
        inSlot[s] = undefined;
        e.slot = undefined;
        if (full) {
          finish(e, 'truncated');
          continue;
        }
        e.turn += 1;
        e.awaiting = true;
        e.stash = dec.stash(Int32Array.of(s));
        const text = codec.action(e.action);
        ask(() => env.step(e.id, text), stepped(e));
      }
      out.busySeconds += (performance.now() - t0) / 1000;
      // Answers that came in meanwhile are heard before the next pass.
      await new Promise<void>((res) => setImmediate(res));
    }
  } finally {
    dec.dispose();
    for (const e of episodes) e.stash?.dispose();
    await Promise.all([...opened].map((id) => env.end(id).catch(() => {})));
  }
  out.seconds = (performance.now() - started) / 1000;
  return out;
}
