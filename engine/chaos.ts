// Chaos testing as data: the kill points of a run, from a scenario's `chaos:` section (explicit
// kills, and random ones drawn from a seed). Each names the actor kind, the call it dies in, the
// iteration, and the device whose worker dies there (the supervisor has none), so that a worker
// or the supervisor can tell, call by call, whether it has reached one.
import { Rng, seedOf } from './rng.ts';
import { OWNER, layoutOf, viewOf, type RunSpec } from './rlhf.ts';
import { ScenarioError, type CallName, type ModelName } from './scenario.ts';

export type ActorKind = ModelName | 'supervisor';

export interface KillPoint {
  /** Unique within the run: the launcher does each kill once, whatever replays. */
  id: string;
  actor: ActorKind;
  call: string;
  iteration: number;
  how: 'kill' | 'hang';
  /** The device whose worker dies; absent for the supervisor. */
  device?: number;
}

/** The device that runs `fn` for `model` in an iteration (rank 0 of the layout), or why none does. */
function deviceFor(r: RunSpec, model: ModelName, fn: string, iteration: number): number | string {
  const first = (call: CallName) => layoutOf(r, call).devices[0]!;
  const setup = iteration < 0;
  const view = model === 'actor' ? 'actor.generate' : model === 'critic' ? 'critic.inference' : undefined;
  const hasView = view !== undefined && viewOf(r, view).isView;
  switch (fn) {
    case 'load':
      // Owners load during setup; in an iteration only views are loaded (then filled by a reallocation).
      if (setup) return first(OWNER[model]);
      return hasView ? first(view!) : `'${model}' loads only during setup (iteration -1) with this plan`;
    case 'restore':
      return setup && model !== 'reward' ? first(OWNER[model]) : `restores happen only in a recovery, as part of setup (iteration -1), and never for the reward`;
    case 'sft':
      if (r.scenario.warmup.steps === 0) return 'warmup.steps is 0: no supervised warm-up runs';
      return model === 'actor' && setup ? first('actor.train') : `only the actor runs 'sft', during setup (iteration -1)`;
    case 'generate':
      return model === 'actor' && !setup ? first('actor.generate') : `only the actor generates, in iterations 0 and on`;
    case 'inference': {
      if (setup || model === 'actor') return `'${model}' runs no inference${setup ? ' during setup' : ''}`;
      if (model === 'reward' && (r.scenario.reward.model || r.scenario.reward.weight === 0)) return `the reward device runs no inference call here (its score comes over the reward protocol, or it is not used)`;
      return first(`${model}.inference` as CallName);
    }
    case 'train':
      return (model === 'actor' || model === 'critic') && !setup ? first(OWNER[model]) : `only the actor and the critic train, in iterations 0 and on`;
    case 'realloc': {
      if (setup) return model === 'reference' || model === 'critic' ? first(OWNER[model]) : `during setup only the reference and the critic receive a reallocation`;
      if (!hasView) return `'${model}' is never reallocated in an iteration with this plan (no call runs it on another layout)`;
      return first(view!);
    }
    case 'checkpoint':
      return model === 'reward' && !r.scenario.reward.model ? `the reward is a rule: it has no state to checkpoint` : first(OWNER[model]);
    case 'manifest':
      // The final digests: the trained models, after the last iteration.
      return (model === 'actor' || model === 'critic') && iteration === r.scenario.ppo.iterations - 1
        ? first(OWNER[model])
        : `only the actor and the critic are asked for a manifest, after the last iteration (${r.scenario.ppo.iterations - 1})`;
    default:
      return `'${fn}' is not a call chaos can land in`;
  }
}

/** The kinds of call each actor kind can be killed in, within an iteration (for random kills). */
const RANDOM_CALLS: Record<ActorKind, readonly string[]> = {
  actor: ['generate', 'train', 'realloc', 'checkpoint'],
  critic: ['inference', 'train', 'realloc', 'checkpoint'],
  reference: ['inference', 'checkpoint'],
  reward: ['inference', 'checkpoint'],
  supervisor: ['generate', 'inference', 'train', 'checkpoint'],
};

/** Every kill point of a run, in the order given (explicit ones first, then random draws). */
export function killPoints(r: RunSpec): KillPoint[] {
  const chaos = r.scenario.chaos;
  if (!chaos) return [];
  const iterations = r.scenario.ppo.iterations;
  const out: KillPoint[] = [];
  const add = (k: Omit<KillPoint, 'id' | 'device'>, where: string) => {
    if (k.iteration >= iterations) throw new ScenarioError(`${where}: iteration ${k.iteration} is past the run's last (${iterations - 1})`);
    if (k.actor === 'supervisor') {
      out.push({ ...k, id: `k${out.length}` });
      return;
    }
    const device = deviceFor(r, k.actor, k.call, k.iteration);
    if (typeof device === 'string') throw new ScenarioError(`${where}: ${k.actor} never dies in '${k.call}' of iteration ${k.iteration}: ${device}`);
    out.push({ ...k, id: `k${out.length}`, device });
  };
  chaos.kills.forEach((k, i) => add(k, `chaos.kills[${i}]`));
  if (chaos.random) {
    const rng = new Rng(seedOf(chaos.random.seed, 0xc4a05));
    const kinds = chaos.random.actors ?? (['actor', 'critic', 'reference', 'reward', 'supervisor'] as const);
    for (let n = 0; n < chaos.random.kills; n++) {
      const actor = kinds[rng.int(kinds.length)]!;
      const calls = RANDOM_CALLS[actor].filter((c) => actor === 'supervisor' || typeof deviceFor(r, actor, c, 0) === 'number');
      if (calls.length === 0) throw new ScenarioError(`chaos.random: '${actor}' can be killed in no call with this scenario; leave it out of chaos.random.actors`);
      const call = calls[rng.int(calls.length)]!;
      const how = rng.uniform() < chaos.random.hang ? 'hang' : 'kill';
      add({ actor, call, iteration: rng.int(iterations), how }, `chaos.random (draw ${n})`);
    }
  }
  return out;
}

/** Whether a worker running `fn` of `model` in `iteration` on `device` has reached `k`. */
export function reachedByWorker(k: KillPoint, device: number, model: string, fn: string, iteration: number): boolean {
  return k.actor !== 'supervisor' && k.device === device && model.split('@')[0] === k.actor && fn === k.call && iteration === k.iteration;
}

/** Whether the supervisor, about to send `fn` in `iteration`, has reached `k`. */
export function reachedBySupervisor(k: KillPoint, fn: string, iteration: number): boolean {
  return k.actor === 'supervisor' && fn === k.call && iteration === k.iteration;
}
