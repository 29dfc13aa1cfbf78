// A device's side of episodes of several turns: the clients of the environments it plays against
// (kept for its life: they track the instances' presence), and a generate call's episodes for this
// replica's rows, played by engine/episodes, then scored as training will score them.
import type { Bus, Call, CallOf, EnvAnswer, ResultOf, Subjects, TurnLog } from '../../mesh/wire/index.ts';
import { EnvClient, encode, PROTOCOL_VERSION } from '../../mesh/wire/index.ts';
import { playEpisodes, playInSlots, RecordedEnv, turnCodec, type PlayOptions } from '../episodes/index.ts';
import { masked, replicaRows, type GptRank } from '../model/index.ts';

export class DeviceEpisodes {
  private readonly clients = new Map<string, EnvClient>();

  constructor(
    private readonly bus: Bus,
    private readonly subj: Subjects,
    private readonly device: number,
    private readonly warn?: (line: string) => void,
  ) {}

  private get run(): string {
    return this.subj.root.slice('ferry.'.length);
  }

  close(): void {
    for (const c of this.clients.values()) c.close();
    this.clients.clear();
  }

  /**
   * A generate call's episodes: this replica's rows, each played against the environment on the
   * bus, then their log-probabilities as training will compute them, 0 at observations and after
   * each end. Answers the call carries from before a fault are read, not asked again; every answer
   * asked goes to the supervisor as it comes (on this device's `turns` subject), so that the next
   * fault finds it recorded. `midEpisode` (chaos) is reached once, after the first round of steps.
   */
  async play(s: GptRank, body: CallOf<'generate'>, group: string, o: { call?: Call; midEpisode?: (call: Call) => Promise<void>; memoryBytes?: number }): Promise<ResultOf<'generate'>> {
    const e = body.episodes!;
    const [lo, hi] = replicaRows(body.batch, s.layout.dp, s.coords.dp);
    const P = body.promptLen;
    let client = this.clients.get(e.environment);
    if (!client) {
      client = new EnvClient(this.bus, e.environment, { run: this.run, timeoutMs: e.timeout_ms, retries: e.retries, waitMs: e.wait_ms, ...(this.warn ? { say: this.warn } : {}) });
      this.clients.set(e.environment, client);
    }
    const call = o.call;
    const stage = e.log;
    const keep =
      stage !== undefined && call
        ? (a: EnvAnswer) => {
            const log: TurnLog = { type: 'turns', v: PROTOCOL_VERSION, epoch: call.epoch ?? 0, iteration: call.iteration, stage, answers: [a] };
            this.bus.publish(this.subj.turns(this.device), encode(log));
          }
        : () => {};
    const env = new RecordedEnv(client, e.recorded ?? {}, keep);
    let reached = false;
    const midEpisode = o.midEpisode;
    const options: PlayOptions = {
      prompts: body.prompts.subarray(lo * P, hi * P),
      tasks: e.tasks.slice(lo, hi),
      ids: e.ids.slice(lo, hi),
      seeds: body.seeds.subarray(lo, hi),
      promptLen: P,
      responseLen: body.responseLen,
      budget: { maxTurns: e.max_turns, turnTokens: e.turn_tokens, stop: e.stop, ...(e.stop_strings ? { stopStrings: e.stop_strings } : {}) },
      groupSize: e.group_size,
      fill: e.fill,
      vocab: s.spec.vocab,
      temperature: body.temperature,
      ...(body.greedy ? { greedy: true } : {}),
      ...(body.topK !== undefined ? { topK: body.topK } : {}),
      ...(body.topP !== undefined ? { topP: body.topP } : {}),
      decoder: (rows, capacity) => s.decoder(group, rows, capacity, { memoryBytes: o.memoryBytes }),
      ...(midEpisode && call
        ? {
            afterRound: async () => {
              if (reached) return;
              reached = true;
              await midEpisode(call);
            },
          }
        : {}),
    };
    // In slots, an episode waiting on its environment gives its slot to another; else in groups.
    const codec = turnCodec(e.codec, e.stop[0]);
    const played = e.slots !== undefined ? await playInSlots(env, codec, { ...options, slots: e.slots }) : await playEpisodes(env, codec, options);
    const logprobs = masked(await s.infer(`${group}/logp`, played.tokens, hi - lo, P), played.mask);
    return { tokens: played.tokens, logprobs, mask: played.mask, rewards: played.rewards, episodes: played.episodes, busy_seconds: played.busySeconds, seconds: played.seconds };
  }
}
