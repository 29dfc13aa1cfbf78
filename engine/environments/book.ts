// An iteration's episodes, by the sequences they made: each generate call's action mask, records
// and device times, looked up by its tokens array wherever those sequences go next (the calls
// that read them get the mask; the reward gets the returns; the metrics get the records).
import type { EpisodeRecordWire } from '../../mesh/wire/index.ts';
import { episodeMetrics, episodeReturns, type EpisodeMetrics } from './episodes.ts';

/** What a generate call with episodes gives back beside its tokens and log-probs (as it is stored with the call's result). */
export interface PlayedEpisodes {
  mask: Float32Array;
  episodes: EpisodeRecordWire[];
  busy_seconds: number;
  seconds: number;
}

export class EpisodeBook {
  private readonly played = new Map<Int32Array, PlayedEpisodes>();

  /** Keeps what a generate call played; for a call without episodes, nothing. */
  note(tokens: Int32Array, out: { mask?: Float32Array; episodes?: EpisodeRecordWire[]; busy_seconds?: number; seconds?: number }): PlayedEpisodes | undefined {
    if (!out.mask || !out.episodes) return undefined;
    const p = { mask: out.mask, episodes: out.episodes, busy_seconds: out.busy_seconds ?? 0, seconds: out.seconds ?? 0 };
    this.played.set(tokens, p);
    return p;
  }

  /** What episodes made these sequences, to be stored with the generation's result. */
  of(tokens: Int32Array): PlayedEpisodes | undefined {
    return this.played.get(tokens);
  }

  /** The action mask of sequences that episodes made (observations 0), or undefined. */
  mask(tokens: Int32Array): Float32Array | undefined {
    return this.played.get(tokens)?.mask;
  }

  /** Each row's return, for sequences that episodes made. */
  returns(tokens: Int32Array): Float64Array | undefined {
    const p = this.played.get(tokens);
    return p ? episodeReturns(p.episodes) : undefined;
  }

  metrics(tokens: Int32Array): EpisodeMetrics | undefined {
    const p = this.played.get(tokens);
    return p ? episodeMetrics(p.episodes, p.busy_seconds, p.seconds) : undefined;
  }

  records(tokens: Int32Array): EpisodeRecordWire[] | undefined {
    return this.played.get(tokens)?.episodes;
  }
}
