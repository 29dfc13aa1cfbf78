// npm run plan -- FILE [--placement NAME] [--budget SECONDS] [--seed N] [--json] [--write PLAN.yaml] [--html OUT.html]
// Plans a scenario: every named placement and (by default) a search, each evaluated with the cost
// model and the simulator; prints the chosen plan call by call and how it compares. The budget is
// a number of plan evaluations (SECONDS × EVALUATIONS_PER_SECOND), so a seed gives the same plan
// on any machine.
import { writeFileSync } from 'node:fs';
import { stringify } from 'yaml';
import { UsageError, args, runMain } from '../../actors/host.ts';
import { loadScenarioFile } from '../runtime/index.ts';
import { PLACEMENTS, Evaluator, evaluationsFor, namedPlan, search, type Candidate, type Evaluation, type NamedPlacement } from '../runtime/index.ts';
import { problemOf } from '../runtime/index.ts';
import { planRows, renderPlan } from '../runtime/index.ts';

const USAGE = `usage: npm run plan -- FILE [--placement search|${PLACEMENTS.join('|')}] [--budget SECONDS] [--seed N] [--json] [--write PLAN.yaml] [--html OUT.html]`;

export function planYaml(c: Candidate): string {
  const plan = Object.fromEntries(Object.entries(c).map(([call, p]) => [call, { mesh: p.mesh, dp: p.dp, tp: p.tp, pp: p.pp }]));
  return stringify({ plan }, { lineWidth: 0 });
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
          { mesh: c.placement.mesh, dp: c.placement.dp, tp: c.placement.tp, pp: c.placement.pp, seconds: c.seconds, realloc_seconds: c.reallocSeconds, memory_gb_per_device: c.memoryBytes / 1e9 },
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
  const scenario = await loadScenarioFile(positionals[0]!);
  const problem = problemOf(scenario);
  const ev = new Evaluator(problem);

  const named = Object.fromEntries(PLACEMENTS.map((n) => [n, namedPlan(ev, n)])) as Record<NamedPlacement, Candidate>;
  const baselines = Object.fromEntries(PLACEMENTS.map((n) => [n, ev.evaluate(named[n]).iterationSeconds]));
  let chosen: Candidate;
  let searchInfo: { seed: number; seconds: number; evaluated: number; accepted: number } | undefined;
  if (placement === 'search') {
    const starts = PLACEMENTS.map((n) => named[n]).sort((a, b) => ev.objective(a) - ev.objective(b));
    const r = search(ev, starts, { evaluations: evaluationsFor(budget), seed });
    if (r.best.length === 0) throw new Error(`no feasible plan found for ${problem.name} in ${r.evaluated} plans (every named plan: ${PLACEMENTS.map((n) => ev.evaluate(named[n]).why).join('; ')})`);
    chosen = r.best[0]!.plan;
    searchInfo = { seed: r.seed, seconds: r.seconds, evaluated: r.evaluated, accepted: r.accepted };
  } else {
    chosen = named[placement as NamedPlacement];
  }
  const evaluation = ev.evaluate(chosen, true);
  const out = {
    scenario: problem.name,
    device: problem.device.name,
    devices: problem.cluster.nodes * problem.cluster.devicesPerNode,
    ...report(placement, evaluation),
    search_seconds: searchInfo?.seconds ?? 0,
    search_seed: searchInfo?.seed ?? null,
    plans_evaluated: searchInfo?.evaluated ?? 0,
    baselines,
  };
  if (values.write) writeFileSync(values.write, planYaml(chosen));
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
  console.log(
    `${problem.name}: ${out.devices} × ${problem.device.name}, placement ${placement}${searchInfo ? ` (seed ${searchInfo.seed}: ${searchInfo.evaluated} plans in ${searchInfo.seconds.toFixed(1)} s)` : ''}`,
  );
  console.log(`${pad('call', 22)}${pad('mesh', 10)}${pad('dp/tp/pp', 10)}${pad('seconds', 10)}${pad('realloc', 10)}memory/device`);
  for (const call of Object.keys(evaluation.calls)) {
    const c = evaluation.calls[call]!;
    const p = c.placement;
    console.log(`${pad(call, 22)}${pad(p.mesh, 10)}${pad(`${p.dp}/${p.tp}/${p.pp}`, 10)}${pad(c.seconds.toFixed(3), 10)}${pad(c.reallocSeconds.toFixed(3), 10)}${(c.memoryBytes / 1e9).toFixed(2)} GB`);
  }
  if (!evaluation.feasible) console.log(`not feasible: ${evaluation.why}`);
  console.log(`iteration: ${evaluation.iterationSeconds.toFixed(3)} s (estimated)`);
  for (const n of PLACEMENTS) {
    const t = baselines[n]!;
    console.log(`  ${pad(n, 14)}${Number.isFinite(t) ? `${t.toFixed(3)} s  (${(t / evaluation.iterationSeconds).toFixed(2)}× the chosen plan)` : `infeasible: ${ev.evaluate(named[n]).why}`}`);
  }
  if (values.write) console.log(`plan written to ${values.write}`);
  if (values.html) console.log(`plan drawn in ${values.html}`);
  return evaluation.feasible ? 0 : 1;
});
