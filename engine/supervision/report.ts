// What a run reports of itself from the supervisor's context: each iteration's metrics, and the
// summary at its end (summary.json).
import type { Metrics } from '../../mesh/wire/index.ts';
import { mean } from '../algorithms/index.ts';
import { episodeFigures } from '../environments/index.ts';
import { measuredPeriods } from '../elastic/index.ts';
import { switchMetrics } from '../asynchrony/index.ts';
import { asynchronySummary, median, rewardWindows, rolloutField, ruleScore, responseStats, type IterationResult, type Summary } from '../runtime/index.ts';
import type { Context } from './context.ts';

/** An iteration's metrics: the reward, every statistic the graph produced, its seconds, tokens and moves. */
export function iterationMetrics(context: Context, out: IterationResult, seconds: number): Metrics {
  const { fields } = out;
  const reward = fields[context.spec.graph.reward];
  const stats = Object.fromEntries(Object.entries(fields).filter((e): e is [string, number] => typeof e[1] === 'number' && e[0] !== context.spec.graph.reward));
  const rollout = rolloutField(context.spec);
  const tokens = rollout ? fields[rollout] : undefined;
  const metrics: Metrics = {
    iteration: context.iteration,
    reward_mean: typeof reward === 'number' ? reward : mean(reward ?? []),
    ...stats,
    seconds,
    tokens: out.generated,
    tokens_per_second: out.generated / seconds,
    realloc_seconds: out.moved.reduce((a, m) => a + m.seconds, 0),
    realloc_bytes: out.moved.reduce((a, m) => a + m.bytes, 0),
    // A rollout of episodes is measured by its episodes; the task's rule reads single answers.
    ...(out.episodes ? episodeFigures(out.episodes) : tokens instanceof Int32Array ? { rule_score: ruleScore(context.spec, tokens), ...responseStats(context.spec, tokens) } : {}),
    ...(Object.keys(out.sources).length ? { rewards: out.sources } : {}),
    // Asynchrony: which policy made the rollout, and how many updates behind this one it is.
    ...(out.version !== undefined ? { policy_version: out.version, staleness: context.iteration - out.version } : {}),
    // In flight: how far behind the tokens were drawn, and the passes the generations switched version at.
    ...(out.tokenStaleness ? { token_staleness_mean: out.tokenStaleness.mean, token_staleness_max: out.tokenStaleness.max } : {}),
    ...(out.switches ? { switches: switchMetrics(out.switches) } : {}),
  };
  return metrics;
}

/** The run's summary as the context holds it now. */
export function runSummary(context: Context): Summary {
  const s = context.spec.scenario;
  const windows = rewardWindows(context.history);
  const backends = [...new Set([...(context.backends ?? []), ...Object.values(context.joined).map((j) => j.backend)])];
  const summary: Summary = {
    status: context.error ? 'failed' : 'succeeded',
    scenario: s.name ?? 'scenario',
    run: context.run,
    iterations: context.history.length,
    seed: s.seed,
    backend: backends.join(',') || 'unknown',
    plan: Object.fromEntries(Object.values(context.spec.plan).map((p) => [p.call, { mesh: p.mesh, dp: p.dp, tp: p.tp, pp: p.pp }])),
    reward_first5: windows.first5,
    reward_last5: windows.last5,
    digests: context.digests,
    wall_seconds: (Date.now() - context.startedAt) / 1000,
    tokens_per_second: median(context.history.map((m) => m.tokens_per_second)),
    parameters: context.parameters,
    ...(context.dispatcher.stats ? { transport: context.dispatcher.stats() } : {}),
    recoveries: context.recoveries,
    ...(context.replans.length ? { replans: measuredPeriods(context.replans, context.starts), lost: context.lost } : {}),
    ...(context.snapshots.count ? { snapshots: context.snapshots } : {}),
    ...(context.warmup ? { warmup: context.warmup } : {}),
    ...(context.rewardModel ? { reward_model: context.rewardModel } : {}),
    ...(context.rollouts ? { rollouts: context.rollouts } : {}),
    ...asynchronySummary(context.history),
    ...(context.bus ? { bus: context.bus } : {}),
    ...(context.error ? { error: context.error } : {}),
  };
  return summary;
}
