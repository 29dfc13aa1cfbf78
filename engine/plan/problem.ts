// A scenario as a planning problem: the shapes of its four models, its workload, its cluster and
// the profile of its devices (a catalog GPU, or the local machine as `npm run profile` fitted it).
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { CALLS, presetOf, resolvePlan, type ModelName, type Scenario } from '../scenario.ts';
import { makeTask } from '../task.ts';
import { DEVICES, MODELS, localShape, type DeviceProfile, type ModelShape } from './catalog.ts';
import type { Candidate, Problem } from './planner.ts';

export const LOCAL_PROFILE = join('profiles', 'local.json');

export class ProfileError extends Error {
  override name = 'ProfileError';
}

export function loadLocalProfile(file = LOCAL_PROFILE): DeviceProfile {
  if (!existsSync(file)) throw new ProfileError(`no local device profile at ${file}: run npm run profile first (it times the worker processes of this machine)`);
  return JSON.parse(readFileSync(file, 'utf8')) as DeviceProfile;
}

export function problemOf(s: Scenario, local?: DeviceProfile): Problem {
  const task = makeTask(s.task.name, s.task.digits, s.task.base);
  const shape = (model: ModelName): ModelShape | undefined => {
    const preset = presetOf(s, model);
    if (preset) return MODELS[preset]!;
    if (model === 'reward') return undefined; // the rule reward
    return localShape(`local-${model}`, task.vocab, s.model.layers, s.model.width, s.model.heads);
  };
  const device = s.cluster.device === 'local' ? (local ?? loadLocalProfile()) : DEVICES[s.cluster.device]!;
  return {
    name: s.name ?? 'scenario',
    models: { actor: shape('actor'), critic: shape('critic'), reference: shape('reference'), reward: shape('reward') },
    workload: {
      batch: s.ppo.batch,
      promptLen: s.lengths.prompt ?? task.promptLen,
      responseLen: s.lengths.response ?? task.responseLen,
      epochs: s.ppo.epochs,
      minibatches: s.ppo.minibatches,
    },
    cluster: { nodes: s.cluster.nodes, devicesPerNode: s.cluster.devices_per_node },
    device,
  };
}

/** A scenario's own plan, as the planner's candidate. */
export function candidateOf(s: Scenario): Candidate {
  const plan = resolvePlan(s);
  return Object.fromEntries(CALLS.map((c) => [c, { mesh: plan[c].mesh, devices: plan[c].devices, dp: plan[c].dp, tp: plan[c].tp, pp: plan[c].pp }])) as Candidate;
}
