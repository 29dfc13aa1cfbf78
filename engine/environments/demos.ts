// A warm-up from the environment's expert (`warmup.source: environment`): episodes the expert
// plays (env.demo), laid out as a generation of episodes would be — the prompt, the first
// observation, then each action with its end-of-turn token and the observation that answered it —
// with a mask that trains the actions only, as RL will.
import type { EnvDemonstration, EnvTask } from '../../mesh/wire/index.ts';
import type { TurnCodec } from '../episodes/index.ts';

export type Demonstrate = (episode: string, task: EnvTask, maxTurns: number) => Promise<Pick<EnvDemonstration, 'observation' | 'turns'>>;

export interface DemoLayout {
  /** [rows, promptLen] prompts (left-padded), and one task and episode id per row. */
  prompts: Int32Array;
  tasks: EnvTask[];
  ids: string[];
  promptLen: number;
  responseLen: number;
  maxTurns: number;
  /** The end-of-turn token, appended to an action unless it ends with one of `stopStrings`. */
  eos?: number;
  stopStrings?: readonly string[];
  fill: number;
}

export class DemoError extends Error {
  override name = 'DemoError';
}

/** Rows [prompt | demonstration | fill] and their action mask [rows, responseLen]. */
export async function demoRows(demonstrate: Demonstrate, codec: TurnCodec, o: DemoLayout): Promise<{ tokens: Int32Array; mask: Float32Array; turns: number }> {
  const rows = o.ids.length;
  const { promptLen: P, responseLen: R } = o;
  const width = P + R;
  const tokens = new Int32Array(rows * width).fill(o.fill);
  const mask = new Float32Array(rows * R);
  const demos = await Promise.all(o.ids.map((id, r) => demonstrate(id, o.tasks[r]!, o.maxTurns)));
  let turns = 0;
  demos.forEach((d, r) => {
    tokens.set(o.prompts.subarray(r * P, (r + 1) * P), r * width);
    let at = 0; // position in the response
    const put = (toks: readonly number[], trained: boolean) => {
      const n = Math.min(toks.length, R - at);
      tokens.set(toks.slice(0, n), r * width + P + at);
      if (trained) mask.fill(1, r * R + at, r * R + at + n);
      at += n;
      return n === toks.length;
    };
    if (!put(codec.observation(d.observation, true), false)) throw new DemoError(`demonstration ${o.ids[r]}: its first observation does not fit in the ${R} tokens after the prompt`);
    for (const [k, t] of d.turns.entries()) {
      const ends = o.stopStrings?.some((s) => t.action.endsWith(s));
      const action = [...codec.actionTokens(t.action), ...(ends || o.eos === undefined ? [] : [o.eos])];
      const fits = put(action, true);
      turns += 1;
      if (!fits || k === d.turns.length - 1 || at >= R) break;
      if (!put(codec.observation(t.observation, false), false)) break;
    }
  });
  return { tokens, mask, turns: turns / Math.max(rows, 1) };
}
