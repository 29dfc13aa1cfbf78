// Chaos testing as data: the kill points of a run, from a scenario's `chaos:` section (explicit
// kills, and random ones drawn from a seed). Each names the actor kind, the call it dies in, the
// iteration, and the device whose worker dies there (the supervisor has none), so that a worker
// or the supervisor can tell, call by call, whether it has reached one.
import { Rng, seedOf } from '../model/index.ts';
import { layoutOf, ownerOf, planDevices, runSpec, viewOf, withPlan, type RunSpec, type Summary } from '../runtime/index.ts';
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
  /** The scenario lets the run skip it (`optional: true`): npm run chaos does not fail when it never fires. */
  optional?: true;
}

/** A worker that joins an elastic run beyond its plan (chaos.joins). */
export interface JoinPoint {
  device: number;
  iteration: number;
  optional?: true;
}

const optionalOf = (o: { optional?: boolean | undefined }) => (o.optional ? { optional: true as const } : {});

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
    case 'switch': {
      // In flight: the next version handed to a generation running on a view (after the training).
      const gen = calls.find((c) => c.fn === 'generate' && viewOf(r, c.name).isView);
      if (!r.scenario.rl.inflight) return `a generation is handed a new version ('switch') only with rl.inflight`;
      return !setup && gen ? first(gen.name) : `'${model}' runs no generation on devices of its own${setup ? ' during setup' : ''}`;
    }
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
  const add = ({ optional, ...given }: Omit<KillPoint, 'id' | 'device' | 'optional'> & { optional?: boolean | undefined }, where: string) => {
    const k = { ...given, ...optionalOf({ optional }) };
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
      add({ actor, call, iteration: rng.int(iterations), how, optional: chaos.random.optional }, `chaos.random (draw ${n})`);
    }
  }
  return out;
}

/**
 * A device lost for good during a call (`{ lose: DEVICE, call, iteration }`): the scenario must be
 * elastic, the device the plan's, and the call one the device runs in that iteration.
 */
function losePoint(r: RunSpec, k: { lose: number; call: string; iteration: number; optional?: boolean | undefined }, where: string, id: string): KillPoint {
  if (!r.scenario.elastic) throw new ScenarioError(`${where}: a device lost for good ends a run that is not elastic; add elastic: to the scenario (it re-plans onto the devices left)`);
  const devices = planDevices(r);
  if (!devices.includes(k.lose)) throw new ScenarioError(`${where}: lose: ${k.lose} is not a device of the plan (devices ${devices.join(', ')})`);
  if (k.iteration >= r.scenario.rl.iterations) throw new ScenarioError(`${where}: iteration ${k.iteration} is past the run's last (${r.scenario.rl.iterations - 1})`);
  if (!deviceRuns(r, k.lose, k.call)) {
    throw new ScenarioError(`${where}: device ${k.lose} runs no '${k.call}' in an iteration with this plan; it runs ${callsOn(r, k.lose)}`);
  }
  return { id, actor: 'device', call: k.call, iteration: k.iteration, how: 'kill', device: k.lose, lose: true, ...optionalOf(k) };
}

/** Whether `device` runs a call `fn` (a graph call, or its part of a snapshot) in an iteration with the run's plan. */
function deviceRuns(r: RunSpec, device: number, fn: string): boolean {
  if (['generate', 'inference', 'train'].includes(fn)) return r.graph.calls.some((c) => c.fn === fn && layoutOf(r, c.name).devices.includes(device));
  // A reallocation lands on the devices of a call that runs its model on a layout of its own (a view).
  if (fn === 'realloc') return r.graph.calls.some((c) => viewOf(r, c.name).isView && layoutOf(r, c.name).devices.includes(device));
  return fn === 'checkpoint' && keptModels(r).some((m) => layoutOf(r, ownerOf(r, m)).devices.includes(device));
}

/** The calls `device` runs in an iteration with the run's plan, quoted: 'generate', 'inference', 'realloc', 'checkpoint'. */
function callsOn(r: RunSpec, device: number): string {
  const calls = [...new Set(r.graph.calls.filter((c) => layoutOf(r, c.name).devices.includes(device)).map((c) => c.fn))];
  return [...calls, ...(deviceRuns(r, device, 'realloc') ? ['realloc'] : []), 'checkpoint'].map((c) => `'${c}'`).join(', ');
}

/** The workers that join a run beyond its plan (chaos.joins): elastic runs only, devices of the cluster, iterations of the run. */
export function joinPoints(r: RunSpec): JoinPoint[] {
  const joins = r.scenario.chaos?.joins ?? [];
  const total = r.scenario.cluster.nodes * r.scenario.cluster.devices_per_node;
  joins.forEach((j, i) => {
    const where = `chaos.joins[${i}]`;
    if (!r.scenario.elastic) throw new ScenarioError(`${where}: a worker that joins beyond the plan is used only by an elastic run; add elastic: to the scenario`);
    if (j.device >= total) throw new ScenarioError(`${where}: device ${j.device} is not a device of the cluster (devices 0-${total - 1})`);
    if (j.iteration >= r.scenario.rl.iterations) throw new ScenarioError(`${where}: iteration ${j.iteration} is past the run's last (${r.scenario.rl.iterations - 1})`);
  });
  return joins.map((j) => ({ device: j.device, iteration: j.iteration, ...optionalOf(j) }));
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

/**
 * A chaos event of the scenario that never happened: where the scenario gives it, what was to
 * happen, why it did not (as far as the run's summary tells), and whether the scenario lets the
 * run skip it (`optional: true`).
 */
export interface UnfiredEvent {
  /** chaos.kills[1], chaos.random (draw 3), chaos.joins[0]. */
  event: string;
  /** The kill point's id (absent for a join). */
  id?: string;
  expected: string;
  why: string;
  optional: boolean;
}

type Replan = Pick<NonNullable<Summary['replans']>[number], 'iteration' | 'trigger' | 'lost' | 'joined' | 'changed' | 'plan_after'>;

/** What a run did, as its summary says (a summary is one; absent: it wrote none), for telling why an event did not fire. */
export interface RunOutcome {
  status?: Summary['status'];
  iterations?: number;
  error?: string;
  replans?: readonly Replan[];
  recoveries?: readonly unknown[];
}

/** Where the scenario gives a kill point: explicit kills come first (k0 is chaos.kills[0]), random draws after them. */
export function eventOf(r: RunSpec, k: KillPoint): string {
  const n = Number(k.id.slice(1));
  const explicit = r.scenario.chaos?.kills.length ?? 0;
  return n < explicit ? `chaos.kills[${n}]` : `chaos.random (draw ${n - explicit})`;
}

const at = (iteration: number) => (iteration < 0 ? 'setup' : `iteration ${iteration}`);

/** What a kill point was to do, in words. */
function expectedOf(k: KillPoint): string {
  const done = k.how === 'hang' ? 'hung' : 'killed';
  if (k.lose) return `device ${k.device} lost for good in '${k.call}' of ${at(k.iteration)}`;
  if (k.actor === 'supervisor') return `the supervisor ${done} as it sends '${k.call}' in ${at(k.iteration)}`;
  if (k.actor === ENVIRONMENT_ACTOR) return `environment instance 0 killed while device ${k.device} generates (${k.model}) in ${at(k.iteration)}`;
  return `${k.actor}'s worker on device ${k.device} ${done} in '${k.call}' of ${at(k.iteration)}`;
}

const firstLine = (text: string) => {
  const line = text.split('\n')[0]!;
  return line.length > 200 ? `${line.slice(0, 200)}…` : line;
};

/** Why an event due in or after `iteration` never came: the run ended first (or left no summary). */
function endedBefore(run: RunOutcome | undefined, iteration: number): string | undefined {
  if (run?.status === undefined) return 'the run wrote no summary (it ended before its supervisor could write one; its logs say how far it got)';
  const n = run.iterations ?? 0;
  if (iteration < 0 || n > iteration) return undefined;
  return `the run ${run.status === 'failed' ? 'failed' : 'ended'} after ${n} iteration(s), before iteration ${iteration} was done${run.error ? ` (${firstLine(run.error)})` : ''}`;
}

const causeOf = (x: Replan) => `${x.trigger}: ${x.lost.length ? `device(s) ${x.lost.join(', ')} lost` : `device(s) ${x.joined.join(', ')} joined`}`;

/** The plan a run had in `iteration`: the last re-plan that changed it from there on, or none (the scenario's own). */
function replannedAt(r: RunSpec, run: RunOutcome | undefined, iteration: number): { replan: Replan; spec: RunSpec } | undefined {
  const replan = (run?.replans ?? []).filter((x) => x.changed && x.iteration <= iteration).at(-1);
  if (!replan) return undefined;
  try {
    return { replan, spec: runSpec(withPlan(r.scenario, replan.plan_after)) };
  } catch {
    return undefined;
  }
}

/** Why a kill point was not reached, where the run's re-plans tell: its device left the plan, or no longer runs the call. */
function movedAway(r: RunSpec, k: KillPoint, run: RunOutcome | undefined): string | undefined {
  const d = k.device;
  if (d === undefined || k.iteration < 0) return undefined;
  const now = replannedAt(r, run, k.iteration);
  if (!now) return undefined;
  const { replan, spec } = now;
  const after = `after the re-plan at iteration ${replan.iteration} (${causeOf(replan)})`;
  if (!planDevices(spec).includes(d)) {
    const lost = (run?.replans ?? []).filter((x) => x.iteration <= k.iteration && x.lost.includes(d)).at(-1);
    return lost ? `device ${d} was lost for good at the re-plan of iteration ${lost.iteration} (${causeOf(lost)})` : `${after}, the plan uses no device ${d}`;
  }
  const placed = (fn: string, model?: string) =>
    spec.graph.calls
      .filter((c) => c.fn === fn && (model === undefined || c.model === model))
      .map((c) => `${c.name} runs on device(s) ${layoutOf(spec, c.name).devices.join(', ')}`)
      .join(', ');
  if (k.lose) return deviceRuns(spec, d, k.call) ? undefined : `${after}, device ${d} runs no '${k.call}' (${placed(k.call) || 'none'}); it runs ${callsOn(spec, d)}`;
  if (k.actor === 'supervisor') return undefined;
  const model = k.model ?? k.actor;
  const fn = k.actor === ENVIRONMENT_ACTOR ? 'generate' : k.call;
  const there = deviceFor(spec, model, fn, k.iteration);
  if (typeof there === 'string') return `${after}, ${there}`;
  if (['generate', 'inference', 'train'].includes(fn)) {
    return spec.graph.calls.some((c) => c.model === model && c.fn === fn && layoutOf(spec, c.name).devices.includes(d))
      ? undefined
      : `${after}, device ${d} runs no '${fn}' of ${model} (${placed(fn, model)})`;
  }
  const on = [...new Set(spec.graph.calls.filter((c) => c.model === model).flatMap((c) => layoutOf(spec, c.name).devices))];
  return on.includes(d) ? undefined : `${after}, ${model} is on device(s) ${on.join(', ')}, no longer on device ${d}`;
}

/** Why a kill point never fired, as far as the run tells; else that no process reached it. */
function whyNot(r: RunSpec, k: KillPoint, run: RunOutcome | undefined, known: string | undefined): string {
  const why = known ?? endedBefore(run, k.iteration) ?? movedAway(r, k, run);
  if (why) return why;
  if (k.call === 'restore' && !run?.recoveries?.length && !(run?.replans ?? []).some((x) => x.changed)) return "'restore' runs only in a recovery or a migration, and this run had neither";
  const who = k.actor === 'supervisor' ? 'the supervisor' : `the worker of device ${k.device}`;
  return `not reached: ${who} never asked to be ${k.how === 'hang' ? 'hung' : 'killed'} there${run?.status === 'failed' && run.error ? ` (the run failed: ${firstLine(run.error)})` : ''}`;
}

/**
 * The scenario's chaos events that did not fire: kill points not done and joins whose worker was
 * not started, each with why (the launcher's own reason where it has one, `known`; else the run
 * ending first, or a re-plan moving the call off the event's device), in the scenario's order.
 */
export function unfiredEvents(
  r: RunSpec,
  points: readonly KillPoint[],
  joins: readonly JoinPoint[],
  fired: { kills: ReadonlySet<string>; joins: ReadonlySet<number> },
  run: RunOutcome | undefined,
  known: { kills?: ReadonlyMap<string, string>; joins?: ReadonlyMap<number, string> } = {},
): UnfiredEvent[] {
  const kills = points
    .filter((k) => !fired.kills.has(k.id))
    .map((k) => ({ event: eventOf(r, k), id: k.id, expected: expectedOf(k), why: whyNot(r, k, run, known.kills?.get(k.id)), optional: k.optional === true }));
  const joined = joins.flatMap((j, i) => {
    if (fired.joins.has(i)) return [];
    const why = known.joins?.get(i) ?? endedBefore(run, j.iteration - 1) ?? `not reached: the launcher heard of no iteration ${j.iteration - 1} done, after which the worker was to start`;
    return [{ event: `chaos.joins[${i}]`, expected: `a worker for device ${j.device} started once iteration ${j.iteration - 1} is done`, why, optional: j.optional === true }];
  });
  return [...kills, ...joined];
}

/** One unfired event in a line: which, what was expected, why it did not come. */
export function describeUnfired(u: UnfiredEvent): string {
  return `${u.event}${u.optional ? ' (optional)' : ''}: expected ${u.expected}; it never fired: ${u.why}`;
}

/** The chaos run's verdict on its events: why it fails (events not marked optional that never fired), or nothing. */
export function unfiredProblem(unfired: readonly UnfiredEvent[] | undefined): string | undefined {
  const must = (unfired ?? []).filter((u) => !u.optional);
  if (must.length === 0) return undefined;
  return `${must.length} chaos event(s) never fired that the scenario does not mark optional (${must.map((u) => u.event).join(', ')}); a run that skips an event tested less than it says. Mark an event optional: true where the run may skip it`;
}
