// Chaos testing as data: the kill points of a run, from a scenario's `chaos:` section (explicit
// kills, and random ones drawn from a seed). Each names the actor kind, the call it dies in, the
// iteration, and the device whose worker dies there (the supervisor has none), so that a worker
// or the supervisor can tell, call by call, whether it has reached one.
import { Rng, seedOf } from '../model/index.ts';
import { layoutOf, ownerOf, planDevices, viewOf, type RunSpec } from '../runtime/index.ts';
import { keptModels } from '../runtime/index.ts';
import { ScenarioError, type CallName } from '../runtime/index.ts';

/** A model of the algorithm, or the supervisor. */
export type ActorKind = string;

export interface KillPoint {
  /** Unique within the run: the launcher does each kill once, whatever replays. */
  id: string;
  actor: ActorKind;
  call: string;
  iteration: number;
  how: 'kill' | 'hang';
  /** The device whose worker dies; absent for the supervisor. For an environment instance: the device whose episodes it serves. */
  device?: number;
  /** An environment instance's kill: the model whose generation reaches it (mid-episode). */
  model?: string;
  /** The device is lost for good: its worker is killed and never restarted (an elastic run re-plans). */
  lose?: true;
}

/** The kill points' name for the environment's instances (a scenario whose environment ferry starts). */
export const ENVIRONMENT_ACTOR = 'environment';

/** The device that runs `fn` for `model` in an iteration (rank 0 of the layout), or why none does. */
function deviceFor(r: RunSpec, model: string, fn: string, iteration: number): number | string {
  const first = (call: CallName) => layoutOf(r, call).devices[0]!;
  const decl = r.graph.models.find((m) => m.name === model)!;
  const setup = iteration < 0;
  const calls = r.graph.calls.filter((c) => c.model === model);
  const view = calls.find((c) => viewOf(r, c.name).isView)?.name;
  const base = r.graph.models.find((m) => m.head === 'policy' && m.trained && m.from === undefined)?.name;
  const kept = keptModels(r).includes(model);
  const learned = decl.head === 'reward' && r.scenario.reward.model !== undefined;
  switch (fn) {
    case 'load':
      // Owners load during setup; in an iteration only views are loaded (then filled by a reallocation).
      if (setup) return first(ownerOf(r, model));
      return view ? first(view) : `'${model}' loads only during setup (iteration -1) with this plan`;
    case 'restore':
      return setup && kept ? first(ownerOf(r, model)) : `restores happen only in a recovery, as part of setup (iteration -1), and only for models with parameters`;
    case 'sft':
      if (r.scenario.warmup.steps === 0) return 'warmup.steps is 0: no supervised warm-up runs';
      return model === base && setup ? first(ownerOf(r, model)) : `only '${base}' runs 'sft', during setup (iteration -1)`;
    case 'generate':
    case 'inference':
    case 'train': {
      const call = calls.find((c) => c.fn === fn);
      if (setup || !call) return `'${model}' has no ${fn} call${setup ? ' during setup' : ` in '${r.graph.calls.map((c) => c.name).join(', ')}'`}`;
      if (decl.head === 'reward' && (learned || r.scenario.reward.weight === 0)) return `the reward device runs no inference call here (its score comes over the reward protocol, or it is not used)`;
      return first(call.name);
    }
    case 'realloc': {
      if (setup) return decl.from !== undefined || learned ? first(ownerOf(r, model)) : `during setup only models that start from another receive a reallocation`;
      if (!view) return `'${model}' is never reallocated in an iteration with this plan (no call runs it on another layout)`;
      return first(view);
    }
    case 'checkpoint':
      return kept ? first(ownerOf(r, model)) : `the reward is a rule: it has no state to checkpoint`;
    case 'manifest':
      // The final digests: the trained models, after the last iteration.
      return decl.trained && iteration === r.scenario.rl.iterations - 1
        ? first(ownerOf(r, model))
        : `only trained models are asked for a manifest, after the last iteration (${r.scenario.rl.iterations - 1})`;
    default:
      return `'${fn}' is not a call chaos can land in`;
  }
}

/** The kinds of call an actor kind can be killed in within an iteration (for random kills): its graph's calls, reallocations, checkpoints. */
function randomCalls(r: RunSpec, actor: ActorKind): string[] {
  if (actor === ENVIRONMENT_ACTOR) return ['generate'];
  if (actor === 'supervisor') return [...new Set([...r.graph.calls.map((c) => c.fn), 'checkpoint'])];
  return [...new Set([...r.graph.calls.filter((c) => c.model === actor).map((c) => c.fn), 'realloc', 'checkpoint'])];
}

/** Every kill point of a run, in the order given (explicit ones first, then random draws). */
export function killPoints(r: RunSpec): KillPoint[] {
  const chaos = r.scenario.chaos;
  if (!chaos) return [];
  const iterations = r.scenario.rl.iterations;
  const kinds = [...r.graph.models.map((m) => m.name), 'supervisor', ...(r.scenario.environment?.command !== undefined ? [ENVIRONMENT_ACTOR] : [])];
  const out: KillPoint[] = [];
  const add = (k: Omit<KillPoint, 'id' | 'device'>, where: string) => {
    if (!kinds.includes(k.actor)) throw new ScenarioError(`${where}: '${k.actor}' is neither a model of the algorithm nor the supervisor; expected one of ${kinds.join(', ')}`);
    if (k.iteration >= iterations) throw new ScenarioError(`${where}: iteration ${k.iteration} is past the run's last (${iterations - 1})`);
    if (k.actor === 'supervisor') {
      out.push({ ...k, id: `k${out.length}` });
      return;
    }
    if (k.actor === ENVIRONMENT_ACTOR) {
      // An instance dies while a generation plays episodes against it: after the episodes' first step.
      const model = r.graph.calls.find((c) => c.fn === 'generate')!.model;
      if (k.call !== 'generate') throw new ScenarioError(`${where}: an environment instance dies while a generation plays episodes; call must be 'generate', not '${k.call}'`);
      if (k.how !== 'kill') throw new ScenarioError(`${where}: an environment instance is killed, not hung`);
      const device = deviceFor(r, model, 'generate', k.iteration);
      if (typeof device === 'string') throw new ScenarioError(`${where}: ${device}`);
      out.push({ ...k, id: `k${out.length}`, device, model });
      return;
    }
    const device = deviceFor(r, k.actor, k.call, k.iteration);
    if (typeof device === 'string') throw new ScenarioError(`${where}: ${k.actor} never dies in '${k.call}' of iteration ${k.iteration}: ${device}`);
    out.push({ ...k, id: `k${out.length}`, device });
  };
  chaos.kills.forEach((k, i) => ('lose' in k ? out.push(losePoint(r, k, `chaos.kills[${i}]`, `k${out.length}`)) : add(k, `chaos.kills[${i}]`)));
  if (chaos.random) {
    const rng = new Rng(seedOf(chaos.random.seed, 0xc4a05));
    const drawFrom = chaos.random.actors ?? kinds;
    for (const a of drawFrom)
      if (!kinds.includes(a)) throw new ScenarioError(`chaos.random.actors: '${a}' is neither a model of the algorithm nor the supervisor; expected one of ${kinds.join(', ')}`);
    for (let n = 0; n < chaos.random.kills; n++) {
      const actor = drawFrom[rng.int(drawFrom.length)]!;
      const calls = randomCalls(r, actor).filter((c) => actor === 'supervisor' || typeof deviceFor(r, actor, c, 0) === 'number');
      if (calls.length === 0) throw new ScenarioError(`chaos.random: '${actor}' can be killed in no call with this scenario; leave it out of chaos.random.actors`);
      const call = calls[rng.int(calls.length)]!;
      // An environment instance is only ever killed (a draw of a hang kills it too).
      const how = rng.uniform() < chaos.random.hang && actor !== ENVIRONMENT_ACTOR ? 'hang' : 'kill';
      add({ actor, call, iteration: rng.int(iterations), how }, `chaos.random (draw ${n})`);
    }
  }
  return out;
}

/**
 * A device lost for good during a call (`{ lose: DEVICE, call, iteration }`): the scenario must be
 * elastic, the device the plan's, and the call one the device runs in that iteration.
 */
function losePoint(r: RunSpec, k: { lose: number; call: string; iteration: number }, where: string, id: string): KillPoint {
  if (!r.scenario.elastic) throw new ScenarioError(`${where}: a device lost for good ends a run that is not elastic; add elastic: to the scenario (it re-plans onto the devices left)`);
  const devices = planDevices(r);
  if (!devices.includes(k.lose)) throw new ScenarioError(`${where}: lose: ${k.lose} is not a device of the plan (devices ${devices.join(', ')})`);
  if (k.iteration >= r.scenario.rl.iterations) throw new ScenarioError(`${where}: iteration ${k.iteration} is past the run's last (${r.scenario.rl.iterations - 1})`);
  const graphCall = ['generate', 'inference', 'train'].includes(k.call);
  const runs = graphCall
    ? r.graph.calls.some((c) => c.fn === k.call && layoutOf(r, c.name).devices.includes(k.lose))
    : k.call === 'checkpoint' && keptModels(r).some((m) => layoutOf(r, ownerOf(r, m)).devices.includes(k.lose));
  if (!runs) {
    const calls = [...new Set(r.graph.calls.filter((c) => layoutOf(r, c.name).devices.includes(k.lose)).map((c) => c.fn))];
    throw new ScenarioError(`${where}: device ${k.lose} runs no '${k.call}' in an iteration with this plan; it runs ${[...calls, 'checkpoint'].map((c) => `'${c}'`).join(', ')}`);
  }
  return { id, actor: 'device', call: k.call, iteration: k.iteration, how: 'kill', device: k.lose, lose: true };
}

/** The workers that join a run beyond its plan (chaos.joins): elastic runs only, devices of the cluster, iterations of the run. */
export function joinPoints(r: RunSpec): Array<{ device: number; iteration: number }> {
  const joins = r.scenario.chaos?.joins ?? [];
  const total = r.scenario.cluster.nodes * r.scenario.cluster.devices_per_node;
  joins.forEach((j, i) => {
    const where = `chaos.joins[${i}]`;
    if (!r.scenario.elastic) throw new ScenarioError(`${where}: a worker that joins beyond the plan is used only by an elastic run; add elastic: to the scenario`);
    if (j.device >= total) throw new ScenarioError(`${where}: device ${j.device} is not a device of the cluster (devices 0-${total - 1})`);
    if (j.iteration >= r.scenario.rl.iterations) throw new ScenarioError(`${where}: iteration ${j.iteration} is past the run's last (${r.scenario.rl.iterations - 1})`);
  });
  return joins.map((j) => ({ ...j }));
}

/** Whether a worker running `fn` of `model` in `iteration` on `device` has reached `k`. */
export function reachedByWorker(k: KillPoint, device: number, model: string, fn: string, iteration: number): boolean {
  const call = named(fn);
  if (k.lose) return k.device === device && call === k.call && iteration === k.iteration;
  return k.actor !== 'supervisor' && k.device === device && model.split('@')[0] === (k.model ?? k.actor) && call === k.call && iteration === k.iteration;
}

/** The name a scenario's kill point gives a call: a device writing its part of a snapshot is in `checkpoint`. */
const named = (fn: string) => (fn === 'snapshot' ? 'checkpoint' : fn);

/** Whether the supervisor, about to send `fn` in `iteration`, has reached `k`. */
export function reachedBySupervisor(k: KillPoint, fn: string, iteration: number): boolean {
  return k.actor === 'supervisor' && named(fn) === k.call && iteration === k.iteration;
}
