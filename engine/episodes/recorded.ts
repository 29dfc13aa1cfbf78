// The environment's side of episodes, read from their record first. A generation played again
// after a fault gets, from the run's store, the answers its episodes had received before the
// fault, and reads them in order instead of asking the environment again (environments need not
// be deterministic: what the policy saw is what it sees again). Past the record the episode goes
// on live: the client brings an instance to where the episode is (a reset and the recorded
// actions, sent as replays) and asks the next step. Every answer that comes live is handed to
// `keep` as it arrives, so that a later fault finds it recorded too.
import { EnvCallError, type EnvAnswer, type EnvTask, type EnvTurn } from '../../mesh/wire/index.ts';
import type { EpisodeEnv } from './play.ts';

/** The live environment: an episode's answers, and taking up an episode whose first actions were answered earlier. */
export interface LiveEnv extends EpisodeEnv {
  resume(episode: string, task: EnvTask, maxTurns: number, actions: readonly string[]): void;
}

interface Replaying {
  task: EnvTask;
  maxTurns: number;
  /** The actions read from the record so far (the k-th answered step k). */
  actions: string[];
  answers: readonly EnvAnswer[];
}

export class RecordedEnv implements EpisodeEnv {
  /** Episodes still within their record. */
  private readonly replaying = new Map<string, Replaying>();
  /** Live episodes: the steps answered so far. */
  private readonly steps = new Map<string, number>();

  constructor(
    private readonly live: LiveEnv,
    private readonly recorded: Readonly<Record<string, readonly EnvAnswer[]>>,
    private readonly keep: (answer: EnvAnswer) => void,
  ) {}

  async reset(episode: string, task: EnvTask, maxTurns: number): Promise<EnvTurn & { seconds?: number }> {
    const answers = this.recorded[episode];
    const first = answers?.[0];
    if (first && first.k === 0) {
      this.replaying.set(episode, { task, maxTurns, actions: [], answers });
      return turnOf(first);
    }
    const t0 = performance.now();
    const out = await this.live.reset(episode, task, maxTurns);
    this.steps.set(episode, 0);
    this.keep(answerOf(episode, 0, undefined, out, (performance.now() - t0) / 1000));
    return out;
  }

  async step(episode: string, action: string): Promise<EnvTurn & { seconds?: number }> {
    const r = this.replaying.get(episode);
    if (r) {
      const k = r.actions.length + 1;
      const a = r.answers[k];
      if (a && a.k === k) {
        if (a.action !== action)
          throw new EnvCallError(
            `episode ${episode}, step ${k}: the action played again after a fault, ${JSON.stringify(action)}, is not the one the environment answered before it, ${JSON.stringify(a.action)}; the generation is not reproducible (another policy, sampling or batch composition), so the record cannot stand for it`,
          );
        r.actions.push(action);
        return turnOf(a);
      }
      // Past the record: the live client replays the recorded actions on an instance first.
      this.replaying.delete(episode);
      this.live.resume(episode, r.task, r.maxTurns, r.actions);
      this.steps.set(episode, r.actions.length);
    }
    const k = (this.steps.get(episode) ?? 0) + 1;
    const t0 = performance.now();
    const out = await this.live.step(episode, action);
    this.steps.set(episode, k);
    this.keep(answerOf(episode, k, action, out, (performance.now() - t0) / 1000));
    return out;
  }

  async end(episode: string): Promise<void> {
    // An episode that ended within its record was never opened on an instance.
    if (this.replaying.delete(episode)) return;
    this.steps.delete(episode);
    await this.live.end(episode);
  }
}

function turnOf(a: EnvAnswer): EnvTurn & { seconds: number } {
  return { observation: a.observation, reward: a.reward, done: a.done, ...(a.info ? { info: a.info } : {}), instance: a.instance, seconds: a.seconds };
}

function answerOf(episode: string, k: number, action: string | undefined, t: EnvTurn, seconds: number): EnvAnswer {
  return {
    episode,
    k,
    ...(action !== undefined ? { action } : {}),
    observation: t.observation,
    reward: t.reward,
    done: t.done,
    ...(t.info ? { info: t.info } : {}),
    instance: t.instance,
    seconds,
  };
}
