// npm run plan -- FILE [--placement NAME] [--budget SECONDS] [--max-lag K] [--seed N] [--lose D,…] [--join D,…] [--remaining N] [--json] [--write PLAN.yaml] [--html OUT.html]
// Plans a scenario: every named placement and (by default) a search, each evaluated with the cost
// model and the simulator; prints the chosen plan call by call and how it compares. The search
// also chooses asynchrony: the best plan at each lag 0..K (its own split of the devices into a
// rollout and a train pool, or shared ones), and a lag only where it pays over lock-step. The
// budget is a number of plan evaluations (SECONDS × EVALUATIONS_PER_SECOND) for the whole search,
// every lag it tries together (chooseLag shares it out), so a seed gives the same plan on any
// machine. --lose asks what the run would do if those devices were lost for good: the re-plan on
// the devices left (engine/runtime/plan/replan.ts), its migration and its period; --join, what it
// would do when workers for lost devices join again: use them only where they save more over the
// remaining iterations than moving onto them costs.
import { writeFileSync } from 'node:fs';
import { UsageError, args, runMain } from '../../actors/host.ts';
import { loadScenarioFile } from '../runtime/index.ts';
import {
  PLACEMENTS,
  SWITCH_CROSSINGS,
  asynchronyOf,
  chooseLag,
  inflightChoice,
  planYaml,
  evaluationsFor,
  lagOf,
  lagsFor,
  namedPlan,
  poolsOf,
  replan,
  type Candidate,
  type Evaluation,
  type NamedPlacement,
  type Replan,
} from '../runtime/index.ts';
import { planRows, renderPlan } from '../runtime/index.ts';

const USAGE = `usage: npm run plan -- FILE [--placement search|${PLACEMENTS.join('|')}] [--budget SECONDS] [--max-lag K] [--seed N] [--lose D,…] [--join D,…] [--remaining N] [--json] [--write PLAN.yaml] [--html OUT.html]
  --max-lag    the largest rl.lag the search may choose (default 2; 0: lock-step only)
  --lose       devices lost for good (e.g. 5 or 5,6): the re-plan on the devices left, its migration and period
  --join       devices lost (with --lose, or by themselves) whose workers then join again: whether the plan takes them back
  --remaining  iterations left when they are lost (default: the scenario's rl.iterations), for the re-plan's objective`;

/** Devices as --lose and --join write them: whole numbers, comma-separated. */
function devicesArg(flag: string, text: string): number[] {
  const parts = text.split(',').map((x) => x.trim());
  const bad = parts.find((x) => !/^\d+$/.test(x));
  if (bad !== undefined) throw new UsageError(`--${flag}: expected device numbers separated by commas (e.g. 5 or 5,6), got ${JSON.stringify(text)}`);
  return parts.map(Number);
}

function replanReport(r: Replan) {
  const placements = Object.fromEntries(Object.entries(r.plan).map(([call, p]) => [call, { mesh: p.mesh, dp: p.dp, tp: p.tp, pp: p.pp }]));
  return {
    lost: r.lost,
    devices: r.devices,
    plan: placements,
    period_before: r.period.before,
    period_after: r.period.after,
    migration_seconds: r.migration.seconds,
    migration_bytes: r.migration.bytes,
    migration_minimum_bytes: r.migration.minimumBytes,
    migration_bytes_ratio: r.migration.minimumBytes > 0 ? r.migration.bytes / r.migration.minimumBytes : 1,
    snapshot_bytes: r.migration.snapshotBytes,
    remaining: r.remaining,
    objective_seconds: r.objective,
    changed: r.changed,
    gain_seconds: r.gainSeconds,
    why: r.why,
    search_seconds: r.search.seconds,
    plans_evaluated: r.search.evaluated,
  };
}

function report(placement: string, ev: Evaluation) {
  return {
    placement,
    feasible: ev.feasible,
    ...(ev.why ? { why: ev.why } : {}),
    iteration_seconds: ev.iterationSeconds,
    calls: Object.fromEntries(
      Object.keys(ev.calls).map((call) => {
        const c = ev.calls[call]!;
        return [
          call,
          {
            mesh: c.placement.mesh,
            dp: c.placement.dp,
            tp: c.placement.tp,
            pp: c.placement.pp,
            seconds: c.seconds,
            realloc_seconds: c.reallocSeconds,
            memory_gb_per_device: c.memoryBytes / 1e9,
            ...(c.switchSeconds !== undefined ? { switch_seconds: c.switchSeconds } : {}),
          },
        ];
      }),
    ),
  };
}

runMain(async () => {
  const { values, positionals } = args(USAGE, {
    placement: { type: 'string', default: 'search' },
    budget: { type: 'string', default: '10' },
    json: { type: 'boolean', default: false },
    write: { type: 'string' },
    html: { type: 'string' },
    seed: { type: 'string', default: '1' },
    'max-lag': { type: 'string', default: '2' },
    lose: { type: 'string' },
    join: { type: 'string' },
    remaining: { type: 'string' },
  });
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  if (positionals.length !== 1) throw new UsageError(`expected one scenario file\n${USAGE}`);
  const placement = values.placement!;
  if (placement !== 'search' && !(PLACEMENTS as readonly string[]).includes(placement)) {
    throw new UsageError(`--placement: expected search or one of ${PLACEMENTS.join(', ')}, got ${placement}`);
  }
  const budget = Number(values.budget);
  if (!(budget > 0)) throw new UsageError(`--budget: expected seconds > 0, got ${values.budget}`);
  const seed = Number(values.seed);
  if (!Number.isInteger(seed)) throw new UsageError(`--seed: expected a whole number, got ${values.seed}`);
  const maxLag = Number(values['max-lag']);
  if (!(Number.isInteger(maxLag) && maxLag >= 0)) throw new UsageError(`--max-lag: expected a whole number >= 0, got ${values['max-lag']}`);
  const join = values.join === undefined ? [] : devicesArg('join', values.join);
  // A device joins again after it was lost: --join alone loses it first.
  const lose = values.lose === undefined && join.length === 0 ? undefined : [...new Set([...(values.lose === undefined ? [] : devicesArg('lose', values.lose)), ...join])];
  const remainingArg = values.remaining === undefined ? undefined : Number(values.remaining);
  if (remainingArg !== undefined && !(Number.isInteger(remainingArg) && remainingArg >= 0)) throw new UsageError(`--remaining: expected a whole number >= 0, got ${values.remaining}`);
  // A search finds the plan: a refusal of the scenario's own plan that the search avoids by itself is left to it.
  const scenario = await loadScenarioFile(positionals[0]!, undefined, { searching: placement === 'search' });
  // A named placement is priced at the scenario's own lag; a search chooses the lag too.
  const lags = placement === 'search' ? lagsFor(scenario, maxLag) : [lagOf(scenario)];
  const choice = chooseLag(scenario, lags, { placement, search: { evaluations: evaluationsFor(budget), seed } });
  const { chosen: best, sync } = choice;
  const { problem, evaluator: ev, plan: chosen, evaluation } = best;
  if (placement === 'search' && !evaluation.feasible) {
    throw new Error(`no feasible plan found for ${problem.name} in ${best.search?.evaluated ?? 0} plans (every named plan: ${PLACEMENTS.map((n) => ev.evaluate(namedPlan(ev, n)).why).join('; ')})`);
  }
  /** --lose, then --join: the re-plans, each from the plan before it, and the plan they end with. */
  function changes(): { report: { replan?: ReturnType<typeof replanReport>; rejoin?: ReturnType<typeof replanReport> }; plan?: Candidate } {
    if (!lose) return { report: {} };
    const o = { remaining: remainingArg ?? scenario.rl.iterations, search: { evaluations: evaluationsFor(budget), seed } };
    const lost = replan(problem, chosen, { lost: lose }, o);
    if (join.length === 0) return { report: { replan: replanReport(lost) }, plan: lost.plan };
    const back = replan({ ...problem, cluster: { ...problem.cluster, lost: lost.lost } }, lost.plan, { joined: join }, o);
    return { report: { replan: replanReport(lost), rejoin: replanReport(back) }, plan: back.plan };
  }
  const changed = changes();
  const named = Object.fromEntries(PLACEMENTS.map((n) => [n, namedPlan(ev, n)])) as Record<NamedPlacement, Candidate>;
  const baselines = Object.fromEntries(PLACEMENTS.map((n) => [n, ev.evaluate(named[n]).iterationSeconds]));
  const searchInfo = best.search;
  const pools = poolsOf(problem, chosen);
  // A free-running scenario: whether to take new versions in flight on the chosen plan.
  const inflight = placement === 'search' ? inflightChoice(scenario, best) : undefined;
  const inflightTaken = inflight?.chosen && !changed.plan ? inflight.kv : undefined;
  const out = {
    scenario: problem.name,
    device: problem.device.name,
    devices: problem.cluster.nodes * problem.cluster.devicesPerNode,
    ...report(placement, evaluation),
    search_seconds: searchInfo ? choice.seconds : 0,
    search_seed: searchInfo?.seed ?? null,
    plans_evaluated: choice.evaluated,
    plans_budget: choice.evaluations,
    baselines,
    lag: best.lag,
    ...(best.slots !== undefined ? { slots: best.slots } : {}),
    pools: { rollout: pools.rollout, train: pools.train, shared: pools.shared },
    estimated_period: evaluation.iterationSeconds,
    sync_iteration_seconds: sync.evaluation.iterationSeconds,
    estimated_speedup: choice.speedup,
    lags: choice.tried.map((t) => ({
      lag: t.lag,
      ...(t.slots !== undefined ? { slots: t.slots } : {}),
      iteration_seconds: t.evaluation.iterationSeconds,
      feasible: t.evaluation.feasible,
      plans_evaluated: t.search?.evaluated ?? 0,
    })),
    asynchrony: choice.why,
    ...(inflight ? { inflight: { kv: inflight.kv, chosen: inflight.chosen, period: inflight.seconds, switch_seconds: inflight.switchSeconds, why: inflight.why } } : {}),
    ...changed.report,
  };
  // With --lose, the plan for the devices left: a run stopped for the loss goes on with it (--resume RUN_DIR --plan).
  if (values.write)
    writeFileSync(
      values.write,
      planYaml(
        changed.plan ?? chosen,
        placement === 'search' && (best.lag > 0 || lagOf(scenario) > 0) ? best.lag : undefined,
        placement === 'search' && !changed.plan ? best.slots : undefined,
        inflightTaken,
      ),
    );
  if (values.html) {
    writeFileSync(
      values.html,
      renderPlan({
        title: `ferry plan: ${problem.name}`,
        caption: `${scenario.cluster.nodes * scenario.cluster.devices_per_node} × ${problem.device.name}, placement ${placement}: ${evaluation.iterationSeconds.toFixed(3)} s per iteration (estimated).`,
        plan: planRows(chosen),
        devices: scenario.cluster.nodes * scenario.cluster.devices_per_node,
        devicesPerNode: scenario.cluster.devices_per_node,
        estimate: evaluation.simulation
          ? { simulation: evaluation.simulation, iterationSeconds: evaluation.iterationSeconds, profile: `${problem.device.name}${problem.device.source ? `: ${problem.device.source}` : ''}` }
          : { missing: `the plan is infeasible: ${evaluation.why ?? 'unknown'}` },
      }),
    );
  }
  if (values.json) {
    console.log(JSON.stringify(out));
    return evaluation.feasible ? 0 : 1;
  }
  const pad = (x: string, n: number) => x.padEnd(n);
  const lagRange = choice.tried.length > 1 ? `lags ${choice.tried[0]!.lag}–${choice.tried.at(-1)!.lag}` : `lag ${choice.tried[0]!.lag}`;
  console.log(
    `${problem.name}: ${out.devices} × ${problem.device.name}, placement ${placement}${searchInfo ? ` (seed ${searchInfo.seed}: ${choice.evaluated} plans of a budget of ${choice.evaluations}, ${lagRange} together, in ${choice.seconds.toFixed(1)} s)` : ''}`,
  );
  console.log(`${pad('call', 22)}${pad('mesh', 10)}${pad('dp/tp/pp', 10)}${pad('seconds', 10)}${pad('realloc', 10)}memory/device`);
  for (const call of Object.keys(evaluation.calls)) {
    const c = evaluation.calls[call]!;
    const p = c.placement;
    console.log(`${pad(call, 22)}${pad(p.mesh, 10)}${pad(`${p.dp}/${p.tp}/${p.pp}`, 10)}${pad(c.seconds.toFixed(3), 10)}${pad(c.reallocSeconds.toFixed(3), 10)}${(c.memoryBytes / 1e9).toFixed(2)} GB`);
  }
  if (!evaluation.feasible) console.log(`not feasible: ${evaluation.why}`);
  console.log(`iteration: ${evaluation.iterationSeconds.toFixed(3)} s (estimated)`);
  if (placement === 'search') {
    const pool = (ds: number[]) => (ds.length ? `${ds.length} device(s) ${ds[0]}${ds.length > 1 ? `–${ds.at(-1)}` : ''}` : 'none');
    const running = inflightTaken ? { ...scenario, rl: { ...scenario.rl, inflight: true, inflight_kv: inflightTaken } } : scenario;
    console.log(`asynchrony: ${asynchronyOf(running, best.lag)}${best.slots !== undefined ? `, rl.slots ${best.slots}` : ''}: ${choice.why}`);
    if (inflight) console.log(`  ${inflight.why}${inflight.chosen ? ` (period ${inflight.seconds.toFixed(3)} s in flight)` : ''}`);
    console.log(
      `  rollout pool ${pool(pools.rollout)}, train pool ${pool(pools.train)}${pools.shared ? ' (shared devices)' : ''}; estimated period ${evaluation.iterationSeconds.toFixed(3)} s, best lock-step ${sync.evaluation.iterationSeconds.toFixed(3)} s: ${(sync.evaluation.iterationSeconds / evaluation.iterationSeconds).toFixed(2)}×`,
    );
    const pauses = Object.entries(evaluation.calls).filter(([, c]) => c.switchSeconds !== undefined);
    for (const [call, c] of pauses)
      console.log(
        `  in flight: ${call} switches version once a generation, priced at ${c.switchSeconds! < 0.01 ? `${(1000 * c.switchSeconds!).toPrecision(3)} ms` : `${c.switchSeconds!.toFixed(3)} s`} (${(100 * (c.switchSeconds! / evaluation.iterationSeconds)).toFixed(1)}% of the period: the bus crossed ${SWITCH_CROSSINGS} times${scenario.rl.inflight_kv === 'recompute' ? ', and a pass of every held row again' : ''})`,
      );
    for (const t of choice.tried)
      console.log(
        `  ${t.lag > 0 && scenario.rl.staleness > 0 ? 'η' : 'lag'} ${t.lag}${t.slots !== undefined ? `, continuous (${t.slots} slots)` : ''}: ${Number.isFinite(t.evaluation.iterationSeconds) ? `${t.evaluation.iterationSeconds.toFixed(3)} s` : `infeasible: ${t.evaluation.why}`} (${t.search?.evaluated ?? 0} plans)`,
      );
  }
  for (const n of PLACEMENTS) {
    const t = baselines[n]!;
    console.log(`  ${pad(n, 14)}${Number.isFinite(t) ? `${t.toFixed(3)} s  (${(t / evaluation.iterationSeconds).toFixed(2)}× the chosen plan)` : `infeasible: ${ev.evaluate(named[n]).why}`}`);
  }
  for (const r of [out.replan, out.rejoin]) {
    if (!r) continue;
    console.log(`${r.why} (${r.plans_evaluated} plans in ${r.search_seconds.toFixed(1)} s)`);
    for (const [call, p] of Object.entries(r.plan)) console.log(`  ${pad(call, 20)}${pad(p.mesh, 10)}${p.dp}/${p.tp}/${p.pp}`);
    console.log(
      `  period ${r.period_before.toFixed(3)} s -> ${r.period_after.toFixed(3)} s; migration ${r.migration_seconds.toFixed(3)} s: ${(r.migration_bytes / 1e9).toFixed(2)} GB from the devices that hold it (${r.migration_bytes_ratio.toFixed(2)} × the minimum), ${(r.snapshot_bytes / 1e9).toFixed(2)} GB from the snapshot; ${r.remaining} iterations left: ${r.objective_seconds.toFixed(1)} s`,
    );
  }
  if (values.write) console.log(`plan written to ${values.write}`);
  if (values.html) console.log(`plan drawn in ${values.html}`);
  return evaluation.feasible ? 0 : 1;
});
