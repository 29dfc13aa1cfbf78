// A scenario as a planning problem: the shapes of its four models, its workload, its cluster and
// the profile of its devices (a catalog GPU, or the local machine as `npm run profile` fitted it).
import { existsSync, readFileSync } from 'node:fs';
import { totalmem } from 'node:os';
import { join } from 'node:path';
import { deviceCount } from '../../../mesh/parallel/index.ts';
import { graphOf, loraOf, planOnly, policyBaseOf, policySpec, presetOf, resolvePlan, rowsOf, taskOf, type Scenario } from '../scenario/scenario.ts';
import { ownerCall } from '../../algorithms/index.ts';
import { WASM_HEAP_MAX, archOf } from '../../model/index.ts';
import { flowOf } from './simulate.ts';
import { DEVICES, MODELS, localShape, type DeviceProfile, type ModelShape } from './catalog.ts';
import { loraShare } from './cost.ts';
import { Evaluator, type Candidate, type PlanGraph, type Problem } from './planner.ts';

export const LOCAL_PROFILE = join('profiles', 'local.json');
/** Shipped with ferry: a profile of a small 2-core machine, used when this one has none fitted. */
export const DEFAULT_LOCAL_PROFILE = join('profiles', 'default-local.json');

/** This machine's fitted profile, else the shipped one; undefined when neither is there. */
export function localProfileFile(): string | undefined {
  return [LOCAL_PROFILE, DEFAULT_LOCAL_PROFILE].find((f) => existsSync(f));
}

/**
 * Why a local scenario's models cannot fit its workers' memory, or undefined: the planner's
 * memory per device (weights, gradients and Adam state where a model trains, activations, the KV
 * cache) against what a worker has — this machine's memory shared by every device's worker, and
 * no more than the wasm heap when the backend may be wasm. Checked before any process starts.
 */
export function memoryProblem(s: Scenario): string | undefined {
  if (planOnly(s)) return undefined;
  const file = localProfileFile();
  if (!file) return undefined;
  const devices = deviceCount({ nodes: s.cluster.nodes, devicesPerNode: s.cluster.devices_per_node });
  const share = totalmem() / devices;
  const wasm = s.backend === 'wasm' || s.backend === 'auto';
  const bytes = wasm ? Math.min(WASM_HEAP_MAX, share) : share;
  const what = wasm && WASM_HEAP_MAX < share ? "the wasm heap's 4 GiB" : `this machine's ${(totalmem() / 2 ** 30).toFixed(0)} GiB over ${devices} devices`;
  const profile = { ...loadLocalProfile(file), memoryBytes: bytes };
  const e = new Evaluator(problemOf(s, profile)).evaluate(candidateOf(s));
  if (e.feasible) return undefined;
  return `model: the plan does not fit the workers' memory: ${e.why} (a worker has ${what}); make model.width or model.layers smaller, or spread the models over more devices with plan: (dp, tp, pp)`;
}

export class ProfileError extends Error {
  override name = 'ProfileError';
}

export function loadLocalProfile(file = LOCAL_PROFILE): DeviceProfile {
  if (!existsSync(file)) throw new ProfileError(`no local device profile at ${file}: run npm run profile first (it times the worker processes of this machine)`);
  return JSON.parse(readFileSync(file, 'utf8')) as DeviceProfile;
}

/** The lag the planner prices a scenario at: rl.lag, or a free-running run's bound η (its steady state when generation keeps up). */
export const lagOf = (s: Scenario): number => s.rl.lag || s.rl.staleness;

/**
 * The scenario at `lag` (its graph too: the proximal policy's pass); itself at its own lag. A
 * free-running scenario stays free-running, within η = `lag` (in flight where it is); at 0 any
 * scenario is lock-step. A run's records (rl.versions, rl.switches) are its own lag's only.
 */
export function atLag(s: Scenario, lag: number): Scenario {
  if (lag === lagOf(s)) return s;
  const records = { versions: undefined, switches: undefined };
  if (lag === 0) return { ...s, rl: { ...s.rl, ...records, lag: 0, staleness: 0, inflight: false } };
  return { ...s, rl: { ...s.rl, ...records, ...(s.rl.staleness > 0 ? { staleness: lag } : { lag, staleness: 0 }) } };
}

/**
 * The scenario as a planning problem. `lag`: priced at that lag instead of the scenario's own
 * (its graph too: stale rollouts add the proximal policy's pass).
 */
export function problemOf(s: Scenario, local?: DeviceProfile, lag = lagOf(s)): Problem {
  const task = taskOf(s); // its budget too: task.max_new_tokens
  s = atLag(s, lag);
  const g = graphOf(s);
  const shape = (model: string): ModelShape | undefined => {
    const preset = presetOf(s, model);
    if (preset) return MODELS[preset]!;
    if (g.models.find((m) => m.name === model)!.head === 'reward') return undefined; // the rule reward
    const p = policySpec(s);
    const a = archOf(p);
    return localShape(`local-${model}`, p.vocab, p.layers, p.width, p.heads, { ffn: a.ffn, kvHeads: a.kvHeads, gated: a.family === 'llama' });
  };
  // A frozen policy that starts from a policy with adapters (and nothing else trained) is that
  // policy's base: on its layout, it holds nothing of its own (engine/runtime/run/spec.ts's baseOwnerOf).
  const baseOfModel = (m: (typeof g.models)[number]): { baseOf?: string } => {
    const from = policyBaseOf(s, g, m.name);
    return from === undefined ? {} : { baseOf: from };
  };
  // A trained model with LoRA adapters trains, moves and writes a share of itself.
  const withAdapters = (model: string, m: ModelShape | undefined): ModelShape | undefined => {
    const decl = g.models.find((x) => x.name === model)!;
    if (!m || !decl.trained || decl.head === 'reward') return m;
    const lora = loraOf(s, m.gated ? 'llama' : 'gpt2');
    if (!lora) return m;
    return { ...m, trainedShare: loraShare(m, lora, decl.head === 'value' || lora.modulesToSave?.includes('lm_head') === true, decl.head === 'value') };
  };
  const device = s.cluster.device === 'local' ? (local ?? loadLocalProfile()) : DEVICES[s.cluster.device]!;
  const rows = rowsOf(s);
  // Reward actors on the bus are asked at once, beside the rule: the reward call waits for the slowest.
  const actorSeconds = Math.max(0, ...s.reward.actors.map((a) => a.seconds ?? 0));
  const graph: PlanGraph = {
    calls: g.calls.map((c) => ({
      name: c.name,
      model: c.model,
      kind: c.fn,
      rows,
      ...(c.fn === 'inference' && c.writes.scores !== undefined && !shape(c.model) && actorSeconds > 0 ? { waitSeconds: actorSeconds } : {}),
    })),
    models: g.models.map((m) => ({ name: m.name, valueHead: m.head !== 'policy', trainable: m.trained, owner: ownerCall(g, m.name).name, ...baseOfModel(m) })),
    flow: flowOf(g, lag),
  };
  return {
    name: s.name ?? 'scenario',
    models: Object.fromEntries(g.models.map((m) => [m.name, withAdapters(m.name, shape(m.name))])),
    graph,
    workload: {
      batch: s.rl.batch,
      promptLen: s.lengths.prompt ?? task.promptLen,
      responseLen: s.lengths.response ?? task.responseLen,
      ...(s.lengths.response_mean !== undefined ? { responseMean: s.lengths.response_mean } : {}),
      epochs: s.rl.epochs,
      minibatches: s.rl.minibatches,
      ...(s.rl.slots > 0 && !s.environment ? { slots: s.rl.slots } : {}),
      ...(s.rl.inflight ? { inflight: s.rl.inflight_kv } : {}),
      ...(s.environment
        ? {
            episodes: {
              groupSize: s.environment.group_size,
              maxTurns: s.environment.max_turns,
              turnTokens: s.environment.turn_tokens,
              ...(s.environment.seconds !== undefined ? { answerSeconds: s.environment.seconds } : {}),
            },
          }
        : {}),
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
