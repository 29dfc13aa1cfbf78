// A scenario as a planning problem: the shapes of its four models, its workload, its cluster and
// the profile of its devices (a catalog GPU, or the local machine as `npm run profile` fitted it).
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { graphOf, presetOf, resolvePlan, rowsOf, taskOf, type Scenario } from '../scenario.ts';
import { ownerCall } from '../../algorithms/index.ts';
import { flowOf } from './simulate.ts';
import { DEVICES, MODELS, localShape, type DeviceProfile, type ModelShape } from './catalog.ts';
import type { Candidate, PlanGraph, Problem } from './planner.ts';

export const LOCAL_PROFILE = join('profiles', 'local.json');

export class ProfileError extends Error {
  override name = 'ProfileError';
}

export function loadLocalProfile(file = LOCAL_PROFILE): DeviceProfile {
  if (!existsSync(file)) throw new ProfileError(`no local device profile at ${file}: run npm run profile first (it times the worker processes of this machine)`);
  return JSON.parse(readFileSync(file, 'utf8')) as DeviceProfile;
}

export function problemOf(s: Scenario, local?: DeviceProfile): Problem {
  const task = taskOf(s); // its budget too: task.max_new_tokens
  const g = graphOf(s);
  const shape = (model: string): ModelShape | undefined => {
    const preset = presetOf(s, model);
    if (preset) return MODELS[preset]!;
    if (g.models.find((m) => m.name === model)!.head === 'reward') return undefined; // the rule reward
    return localShape(`local-${model}`, task.vocab, s.model.layers, s.model.width, s.model.heads);
  };
  const device = s.cluster.device === 'local' ? (local ?? loadLocalProfile()) : DEVICES[s.cluster.device]!;
  const rows = rowsOf(s);
  const graph: PlanGraph = {
    calls: g.calls.map((c) => ({ name: c.name, model: c.model, kind: c.fn, rows })),
    models: g.models.map((m) => ({ name: m.name, valueHead: m.head !== 'policy', trainable: m.trained, owner: ownerCall(g, m.name).name })),
    flow: flowOf(g),
  };
  return {
    name: s.name ?? 'scenario',
    models: Object.fromEntries(g.models.map((m) => [m.name, shape(m.name)])),
    graph,
    workload: {
      batch: s.rl.batch,
      promptLen: s.lengths.prompt ?? task.promptLen,
      responseLen: s.lengths.response ?? task.responseLen,
      epochs: s.rl.epochs,
      minibatches: s.rl.minibatches,
    },
    cluster: { nodes: s.cluster.nodes, devicesPerNode: s.cluster.devices_per_node },
    device,
    checkpointEvery: s.checkpoint.every,
  };
}

/** A scenario's own plan, as the planner's candidate. */
export function candidateOf(s: Scenario): Candidate {
  const plan = resolvePlan(s);
  return Object.fromEntries(Object.values(plan).map((p) => [p.call, { mesh: p.mesh, devices: p.devices, dp: p.dp, tp: p.tp, pp: p.pp }]));
}
