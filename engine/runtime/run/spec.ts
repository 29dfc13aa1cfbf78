// A run's spec: the scenario resolved (plan, task, graph) and what the run derives from it — each
// model's spec, owner call and layouts, the views other calls read it through, sampling settings.
import type { LossModule, ModelSpec } from '../../../mesh/wire/index.ts';
import { layoutKey, type Layout } from '../../../mesh/parallel/index.ts';
import { ownerCall, type CallDecl, type Graph, type ModelDecl } from '../../algorithms/index.ts';
import { graphOf, loraOf, policyBaseOf, policySpec, resolvePlan, ScenarioError, taskOf, tokenizerDir, verifierOf, type CallName, type Plan, type Scenario } from '../scenario/scenario.ts';
import type { Task } from '../../device/index.ts';

export interface RunSpec {
  scenario: Scenario;
  plan: Plan;
  task: Task;
  /** The algorithm's graph: its models, calls and host steps. */
  graph: Graph;
  /** The reward service a learned reward model serves (unique to the run). */
  rewardService: string;
}

export function runSpec(scenario: Scenario, run = 'local'): RunSpec {
  const plan = resolvePlan(scenario);
  const graph = graphOf(scenario);
  const r: RunSpec = { scenario, plan, graph, task: taskOf(scenario), rewardService: `rm-${run}` };
  for (const m of graph.models) {
    if (m.head === 'reward' && scenario.reward.model && layoutOf(r, ownerOf(r, m.name)).devices.length !== 1) {
      throw new ScenarioError(`reward.model: a learned reward model trains on one device; the plan gives ${ownerOf(r, m.name)} ${layoutOf(r, ownerOf(r, m.name)).devices.length}`);
    }
  }
  return r;
}

/** The user's loss modules a model's train calls use, for its training layout's load call (none: nothing). */
export function lossModulesOf(r: RunSpec, model: string): { losses?: LossModule[] } {
  const modules = new Map<string, LossModule>();
  for (const c of r.graph.calls) if (c.fn === 'train' && c.model === model && c.loss.module) modules.set(c.loss.module.file, c.loss.module);
  return modules.size ? { losses: [...modules.values()] } : {};
}

export const declOf = (r: RunSpec, model: string): ModelDecl => {
  const m = r.graph.models.find((x) => x.name === model);
  if (!m) throw new Error(`'${model}' is not a model of the algorithm`);
  return m;
};

/** Whether a model is a learned reward model (a value network), not the rule. */
export const learnedReward = (r: RunSpec, model: string) => declOf(r, model).head === 'reward' && r.scenario.reward.model !== undefined;

export function modelSpec(r: RunSpec, model: string): ModelSpec {
  const { scenario: s } = r;
  const head = declOf(r, model).head;
  if (head === 'reward' && !s.reward.model) {
    if (!s.data) return { kind: 'rule', rule: s.reward.rule ?? s.task.name, digits: s.task.digits, base: s.task.base };
    return { kind: 'rule', rule: verifierOf(s), tokenizer: tokenizerDir(s)! };
  }
  const { tied, ...shape } = policySpec(s);
  // Every model reads the task's left-padded prompts as the prompts alone; a trained one carries
  // the scenario's adapters (a reference, untrained, is the base).
  const lora = declOf(r, model).trained ? loraOf(s, shape.family ?? 'gpt2') : undefined;
  const body = { ...shape, ...(r.task.pad === undefined ? {} : { pad: r.task.pad }), ...(lora ? { lora } : {}) };
  // A value model has the policy's body under a head of its own.
  return head === 'policy' ? { ...body, ...(tied ? { tied } : {}) } : { ...body, kind: 'value' };
}

/** The checkpoint directory a model's weights come from: the base policy's, with model.from. */
export const checkpointOf = (r: RunSpec, model: string): string | undefined => (model === basePolicy(r) ? r.scenario.model.from : undefined);

/** The PEFT adapter directory a model's adapters start from: the base policy's, with model.adapter. */
export const adapterOf = (r: RunSpec, model: string): string | undefined => (model === basePolicy(r) ? r.scenario.model.adapter : undefined);

/** How the run's generations draw tokens: the scenario's sampling settings. */
export function samplingOf(r: RunSpec): { temperature: number; topK?: number; topP?: number; eos?: number } {
  const { temperature, top_k, top_p } = r.scenario.rl;
  return { temperature, ...(top_k > 0 ? { topK: top_k } : {}), ...(top_p < 1 ? { topP: top_p } : {}), ...eosOf(r.task) };
}

/** The task's end token, as a call carries it. */
export const eosOf = (task: Task) => (task.eos === undefined ? {} : { eos: task.eos });

export function layoutOf(r: RunSpec, call: CallName): Layout {
  const p = r.plan[call];
  if (!p) throw new Error(`the plan has no call '${call}'`);
  return { devices: p.devices, dp: p.dp, tp: p.tp, pp: p.pp };
}

/** The call whose layout owns a model's weights (and, if trained, its optimizer state). */
export const ownerOf = (r: RunSpec, model: string): CallName => ownerCall(r.graph, model).name;

export const callDecl = (r: RunSpec, call: CallName): CallDecl => {
  const c = r.graph.calls.find((x) => x.name === call);
  if (!c) throw new Error(`'${call}' is not a call of the algorithm`);
  return c;
};

/**
 * The name under which a call finds its model: the owner itself when the call runs on the
 * owner's layout, else a view of it that is filled before the call and released after.
 */
export function viewOf(r: RunSpec, call: CallName): { name: string; isView: boolean; base?: boolean } {
  const model = callDecl(r, call).model;
  const isView = layoutKey(layoutOf(r, call)) !== layoutKey(layoutOf(r, ownerOf(r, model)));
  // A model that is its policy's base, where it is that policy's own layout: the policy's shards, adapters off.
  const shared = baseOwnerOf(r, model);
  if (shared !== undefined && !isView) return { name: shared, isView: false, base: true };
  return { name: isView ? `${model}@${call.slice(call.indexOf('.') + 1)}` : model, isView };
}

/**
 * The policy whose shards answer for `model` with their adapters off (docs/lora.md): a frozen
 * model that starts from a policy with LoRA adapters and nothing else trained (no saved module: the
 * base is then exactly the policy's frozen part), planned on that policy's own layout, in a run that
 * does not re-plan (an elastic run may move one without the other). It is not loaded, filled or
 * kept: the policy's base is it.
 */
export function baseOwnerOf(r: RunSpec, model: string): string | undefined {
  const from = policyBaseOf(r.scenario, r.graph, model);
  return from !== undefined && layoutKey(layoutOf(r, ownerOf(r, model))) === layoutKey(layoutOf(r, ownerOf(r, from))) ? from : undefined;
}

export function nodeOf(r: RunSpec): (device: number) => number {
  return (device) => Math.floor(device / r.scenario.cluster.devices_per_node);
}

/** The policy every other model starts from: the trained policy drawn from the seed, warmed up first. */
export function basePolicy(r: RunSpec): string | undefined {
  return r.graph.models.find((m) => m.head === 'policy' && m.trained && m.from === undefined)?.name;
}
