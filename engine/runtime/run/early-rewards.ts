// Reward actors' scores of a continuous generation's rows, asked the moment each row ends (its
// SampleLedger tells), so that scoring goes on beside the decoding of the rows still running. The
// reward call then takes them instead of asking for the whole batch at once; a row that was not
// heard as it ended (kept from before a fault, or its message lost) is asked with the others in
// one request. Each actor scores each row the same either way: the item it gets is the same.
import type { RewardItem } from '../../../mesh/wire/index.ts';

export interface Scorer {
  score(name: string, iteration: number, items: RewardItem[]): Promise<number[]>;
}

export class EarlyRewards {
  /** Per rollout (its tokens), per actor, each row's score as asked. */
  private readonly asked = new WeakMap<Int32Array, Map<string, Map<number, Promise<number>>>>();

  /** A call's scores as they are asked: `row(…)` for each row as it ends, then `of(tokens)` once its rollout exists. */
  begin(scorer: Scorer, actors: string[], iteration: number): { row(row: number, item: RewardItem): void; of(tokens: Int32Array): void } {
    const byActor = new Map(actors.map((a) => [a, new Map<number, Promise<number>>()]));
    return {
      row: (row, item) => {
        for (const a of actors) {
          const p = scorer.score(a, iteration, [item]).then((xs) => xs[0]!);
          // Awaited by the reward call; a failure before then must not go unhandled.
          p.catch(() => {});
          byActor.get(a)!.set(row, p);
        }
      },
      of: (tokens) => this.asked.set(tokens, byActor),
    };
  }

  /**
   * Actor `name`'s score of every item of the rollout `tokens`: those asked as their rows ended,
   * and the rest in one request.
   */
  async scores(scorer: Scorer, name: string, iteration: number, tokens: Int32Array, items: RewardItem[]): Promise<number[]> {
    const early = this.asked.get(tokens)?.get(name);
    if (!early?.size) return scorer.score(name, iteration, items);
    const rest = items.map((_, i) => i).filter((i) => !early.has(i));
    const late = rest.length
      ? await scorer.score(
          name,
          iteration,
          rest.map((i) => items[i]!),
        )
      : [];
    const out = await Promise.all(items.map((_, i) => early.get(i) ?? Promise.resolve(late[rest.indexOf(i)]!)));
    return out;
  }
}
