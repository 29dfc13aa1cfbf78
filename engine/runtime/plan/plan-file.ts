// A plan as `npm run plan --write` writes it and `--plan PLAN.yaml` reads it back
// (engine/runtime/scenario/parse.ts, loadScenario): the placements, and what they were planned
// for — the lag (η for a free-running scenario), continuous generation's slots, in flight.
import { stringify } from 'yaml';
import type { Candidate } from './planner.ts';

/** The plan file: the placements, and the lag a search chose (with the slots and in flight where chosen). */
export function planYaml(c: Candidate, lag?: number, slots?: number, inflight?: 'keep'): string {
  const plan = Object.fromEntries(Object.entries(c).map(([call, p]) => [call, { mesh: p.mesh, dp: p.dp, tp: p.tp, pp: p.pp }]));
  // The lag a search chose; 0 where it kept lock-step for a scenario that was not (read back, it runs lock-step); none otherwise.
  return stringify({ plan, ...(lag !== undefined ? { lag } : {}), ...(slots !== undefined ? { slots } : {}), ...(inflight ? { inflight } : {}) }, { lineWidth: 0 });
}
