// A generate call's episodes, from the scenario's environment key and the iteration's prompts, and
// the iteration's metrics from their records.
import type { EpisodeRecordWire, EpisodesSpec, TurnCodecSpec } from '../../mesh/wire/index.ts';
import { Stream, seedOf } from '../model/index.ts';
import type { EnvironmentKey } from './key.ts';

/** What a call's episodes need of the task: its lengths, end token, texts and codec. */
export interface EpisodeTaskInfo {
  promptLen: number;
  /** Tokens after the prompt, all turns together. */
  responseLen: number;
  /** The end-of-turn token (the task's end token), if it has one. */
  eos?: number;
  /** The token after a sequence's end. */
  fill: number;
  text(tokens: ArrayLike<number>): string;
  answer?(prompt: ArrayLike<number>): string;
  codec: TurnCodecSpec;
}

/**
 * The episodes of a generate call of `prompts` (rows of `promptLen`, `group` samples per prompt in
 * a row): episode `<iteration>-<row>`, and the seed of its environment's task shared by the
 * samples of one prompt, so that they play the same game.
 */
export function episodesSpec(key: EnvironmentKey, t: EpisodeTaskInfo, seed: number, iteration: number, prompts: Int32Array, group: number): EpisodesSpec {
  const rows = prompts.length / t.promptLen;
  const tasks = Array.from({ length: rows }, (_, r) => {
    const prompt = prompts.subarray(r * t.promptLen, (r + 1) * t.promptLen);
    const truth = t.answer?.(prompt);
    return { prompt_text: t.text(prompt), ...(truth !== undefined ? { ground_truth: truth } : {}), seed: seedOf(seed, Stream.episodes, iteration, Math.floor(r / group)) };
  });
  return {
    environment: key.name,
    ids: Array.from({ length: rows }, (_, r) => `${iteration}-${r}`),
    tasks,
    max_turns: key.max_turns,
    turn_tokens: key.turn_tokens,
    stop: t.eos === undefined ? [] : [t.eos],
    ...(key.stop_strings.length ? { stop_strings: key.stop_strings } : {}),
    group_size: key.group_size,
    codec: t.codec,
    fill: t.fill,
    timeout_ms: key.timeout_seconds * 1000,
    retries: key.retries,
    wait_ms: key.wait_seconds * 1000,
  };
}

export interface EpisodeMetrics {
  /** Actions per episode, mean. */
  turns: number;
  /** Observation tokens per episode, mean (the reset's included). */
  observation_tokens: number;
  /** The sum of an episode's step rewards, mean. */
  episode_return: number;
  /** Seconds the environment took, summed over the iteration's requests. */
  env_seconds: number;
  /** The share of episodes that ended at the turn budget, and that ran out of room. */
  turn_limit: number;
  truncated: number;
  /** The share of the generating call's time its devices spent waiting (on environments, mostly). */
  device_idle: number;
}

export function episodeMetrics(records: readonly EpisodeRecordWire[], busySeconds: number, seconds: number): EpisodeMetrics {
  const n = Math.max(records.length, 1);
  const sum = (f: (e: EpisodeRecordWire) => number) => records.reduce((a, e) => a + f(e), 0);
  return {
    turns: sum((e) => e.turns.length) / n,
    observation_tokens: sum((e) => e.reset.tokens + e.turns.reduce((a, t) => a + t.observationTokens, 0)) / n,
    episode_return: sum((e) => e.return) / n,
    env_seconds: sum((e) => e.reset.seconds + e.turns.reduce((a, t) => a + t.seconds, 0)),
    turn_limit: sum((e) => (e.end === 'turns' ? 1 : 0)) / n,
    truncated: sum((e) => (e.end === 'truncated' ? 1 : 0)) / n,
    device_idle: seconds > 0 ? Math.max(0, 1 - busySeconds / seconds) : 0,
  };
}

/** Each row's episode return, in row order. */
export function episodeReturns(records: readonly EpisodeRecordWire[]): Float64Array {
  return Float64Array.from(records, (e) => e.return);
}

/** The metrics' figures of an iteration's episodes (without their sample of transcripts). */
export function episodeFigures(m: EpisodeMetrics): Record<keyof EpisodeMetrics, number> {
  return {
    turns: m.turns,
    observation_tokens: m.observation_tokens,
    episode_return: m.episode_return,
    env_seconds: m.env_seconds,
    turn_limit: m.turn_limit,
    truncated: m.truncated,
    device_idle: m.device_idle,
  };
}
