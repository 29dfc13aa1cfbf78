import { describe, expect, it } from 'vitest';
import { asynchronySummary, stalenessLine } from '../runtime/record/record.ts';
import type { Metrics } from '../../mesh/wire/index.ts';
import { decisionsOf, handOver, switchMetrics, switchesOfMetric, tokenStaleness, type HandOver } from './handover.ts';

describe('handOver', () => {
  const fake = (answers: Array<number | undefined>) => {
    const log: string[] = [];
    const o: HandOver = {
      devices: [4, 5],
      generation: { iteration: 3, model: 'actor@generate' },
      to: { model: 'actor@generate~1', version: 3 },
      call: async (device, model, body) => {
        log.push(`${device} ${model} ${body.at === undefined ? 'ask' : `at ${body.at}`}`);
        return body.at === undefined && answers[o.devices.indexOf(device)] !== undefined ? { step: answers[o.devices.indexOf(device)]! } : {};
      },
      record: async (d) => {
        log.push(`record ${JSON.stringify(d)}`);
      },
    };
    return { o, log };
  };

  it('asks every device, writes the decision, and only then tells each that answered to go on', async () => {
    const { o, log } = fake([7, undefined]);
    expect(await handOver(o)).toEqual({ version: 3, steps: [7, null] });
    expect(log).toEqual(['4 actor@generate~1 ask', '5 actor@generate~1 ask', 'record {"version":3,"steps":[7,null]}', '4 actor@generate~1 at 7']);
  });

  it('no device still generating: nothing written, nothing told; a replay tells its recorded passes without asking or writing', async () => {
    const none = fake([undefined, undefined]);
    expect(await handOver(none.o)).toBeUndefined();
    expect(none.log).toEqual(['4 actor@generate~1 ask', '5 actor@generate~1 ask']);
    const replay = fake([]);
    expect(await handOver({ ...replay.o, planned: { version: 3, steps: [2, 9] } })).toEqual({ version: 3, steps: [2, 9] });
    expect(replay.log).toEqual(['4 actor@generate~1 at 2', '5 actor@generate~1 at 9']);
  });
});

describe('the decisions in the records', () => {
  it('a reply’s switches per rank become decisions per version, a metric and back', () => {
    const decisions = decisionsOf([[{ step: 4, version: 2 }], [], [{ step: 6, version: 2 }]]);
    expect(decisions).toEqual([{ version: 2, steps: [4, null, 6] }]);
    const metric = switchMetrics({ 'actor.generate': decisions });
    expect(metric).toEqual({ 'actor.generate#2#0': 4, 'actor.generate#2#2': 6 });
    expect(switchesOfMetric(metric)).toEqual({ 'actor.generate': [{ version: 2, steps: [4, null, 6] }] });
  });

  it('the tokens’ staleness counts response tokens only', () => {
    // Iteration 5: two tokens of version 4, one of 5, one after the end (−1), one masked out.
    expect(tokenStaleness(Int32Array.from([4, 4, 5, -1, 3]), [1, 1, 1, 0, 0], 5)).toEqual({ mean: 2 / 3, max: 1 });
    expect(tokenStaleness(Int32Array.from([-1]), [1], 5)).toBeUndefined();
  });

  it('the summary gathers them and says them in a line', () => {
    const m = (iteration: number, extra: Record<string, unknown>) =>
      ({ iteration, reward_mean: 0, seconds: 1, tokens: 10, tokens_per_second: 10, realloc_seconds: 0, realloc_bytes: 0, policy_version: iteration - 1, staleness: 1, ...extra }) as Metrics;
    const history = [m(1, { token_staleness_mean: 1, token_staleness_max: 1 }), m(2, { token_staleness_mean: 0.5, token_staleness_max: 1, switches: { 'actor.generate#2#0': 8 } })];
    const st = asynchronySummary(history).staleness!;
    expect(st.tokens).toEqual({ mean: 0.75, max: 1 });
    expect(st.switches).toEqual({ '2': { 'actor.generate': [{ version: 2, steps: [8] }] } });
    expect(stalenessLine(st)).toBe("staleness: mean 1.00, max 1; tokens' staleness mean 0.75, max 1 (1 generation switched version in flight)");
    expect(stalenessLine({ versions: [0, 0], mean: 0.5, max: 1, histogram: {} })).toBe('staleness: mean 0.50, max 1');
  });
});
