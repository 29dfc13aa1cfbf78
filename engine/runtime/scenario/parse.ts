// Reading scenario files: YAML parsed and validated against the schema, an unknown key an error
// naming its path (with the keys allowed there), the model and plan checked, a re-plan applied.
import { readFileSync } from 'node:fs';
import { basename, dirname, extname, resolve } from 'node:path';
import { parseDocument } from 'yaml';
import type { z } from 'zod';
import { describeValue, formatIssues, shortList } from '../../../mesh/wire/index.ts';
import { TaskError, VERIFIERS } from '../../device/index.ts';
import { specProblem } from '../../model/index.ts';
import { algorithmPath, isPath, loadAlgorithmFile } from '../../algorithms/index.ts';

import { Scenario, ScenarioError } from './schema.ts';
import { algorithmName, algorithmSpec, checkpointShape, keepSpec, policySpec, resolvePlan, taskOf, type ReadOptions } from './resolve.ts';

/** The keys a scenario allows at `path` (through defaults and optionals), for typo hints. */
function keysAt(path: readonly PropertyKey[]): string[] | undefined {
  let schema: z.core.$ZodType = Scenario;
  for (const key of [...path, undefined]) {
    for (;;) {
      const def = schema._zod.def as { type: string; innerType?: z.core.$ZodType };
      if (!def.innerType || def.type === 'object') break;
      schema = def.innerType;
    }
    const shape = (schema._zod.def as { shape?: Record<string, z.core.$ZodType> }).shape;
    if (!shape) return undefined;
    if (key === undefined) return Object.keys(shape);
    schema = shape[String(key)]!;
    if (!schema) return undefined;
  }
  return undefined;
}

/** Parses and validates scenario text. `where` names the source in every error; `baseDir` resolves an algorithm's path. */
export function parseScenario(text: string, where: string, baseDir = '.', o: ReadOptions = {}): Scenario {
  const doc = parseDocument(text, { prettyErrors: true });
  if (doc.errors.length) {
    throw new ScenarioError(`${where}: not valid YAML:\n  ${doc.errors.map((e) => e.message.split('\n')[0]).join('\n  ')}`);
  }
  const raw: unknown = doc.toJS();
  if (raw === null || raw === undefined) {
    // An empty file (or one of comments) would run every default: almost surely not what was meant.
    throw new ScenarioError(`${where}: expected a mapping of settings (task:, model:, rl:, …), the file has none (it is empty or only comments); scenarios/quickstart.yaml is one to start from`);
  }
  const parsed = Scenario.safeParse(raw);
  if (!parsed.success) {
    throw new ScenarioError(`${where}: ${parsed.error.issues.length} problem(s):\n  ${shortList(formatIssues(parsed.error.issues, raw, keysAt)).join('\n  ')}`);
  }
  const name = algorithmName(parsed.data.algorithm);
  const absolute = isPath(name) ? algorithmPath(name, baseDir) : name;
  // Written back with its options' defaults filled in (and files' paths made absolute), so that
  // scenario.json says exactly what ran.
  const at = (p: string) => resolve(baseDir, p);
  const { model, data } = parsed.data;
  const scenario: Scenario = {
    ...parsed.data,
    algorithm: { ...(typeof parsed.data.algorithm === 'string' ? {} : parsed.data.algorithm), name: absolute },
    model: model.from === undefined ? model : { ...model, from: at(model.from) },
    ...(data ? { data: { ...data, train: at(data.train), ...(data.tokenizer === undefined ? {} : { tokenizer: at(data.tokenizer) }) } } : {}),
  };
  let problems: string[];
  try {
    problems = modelProblems(scenario, (raw as { model?: unknown }).model);
  } catch (e) {
    if (e instanceof ScenarioError) throw new ScenarioError(`${where}: ${e.message}`);
    throw e;
  }
  if (problems.length) throw new ScenarioError(`${where}: ${problems.length} problem(s):\n  ${shortList(problems).join('\n  ')}`);
  // With model.from, scenario.json says the shape that ran: the checkpoint's.
  if (scenario.model.from !== undefined) scenario.model = { ...scenario.model, ...checkpointShape(scenario.model.from) };
  try {
    const spec = algorithmSpec(scenario);
    scenario.algorithm = { ...spec.options, name: absolute };
    keepSpec(scenario, spec);
  } catch (e) {
    if (e instanceof Error && !(e instanceof ScenarioError)) throw new ScenarioError(`${where}: ${e.message}`, { cause: e });
    throw e instanceof ScenarioError ? new ScenarioError(`${where}: ${e.message}`) : e;
  }
  try {
    const task = taskOf(scenario);
    const spec = policySpec(scenario);
    const width = task.promptLen + task.responseLen;
    if (width > spec.context) throw new ScenarioError(`data.prompt_tokens + task.max_new_tokens: ${task.promptLen} + ${task.responseLen} = ${width} positions; the model has ${spec.context}`);
    if (task.vocab > spec.vocab) throw new ScenarioError(`data.tokenizer: the tokenizer has ${task.vocab} tokens; the model's vocabulary ${spec.vocab}`);
    const bad = specProblem(spec);
    if (bad) throw new ScenarioError(`model: ${bad}`);
  } catch (e) {
    if (e instanceof TaskError) throw new ScenarioError(`${where}: ${scenario.data ? 'data' : 'task.max_new_tokens'}: ${e.message}`);
    if (e instanceof ScenarioError) throw new ScenarioError(`${where}: ${e.message}`);
    throw e;
  }
  resolvePlan(scenario, where, o);
  return scenario;
}

/** Keys of `model:` that give a shape, which a checkpoint's config.json gives instead. */
const SHAPE_KEYS = ['family', 'layers', 'width', 'heads', 'kv_heads', 'ffn', 'rope_theta', 'tied'] as const;
/** Keys of `model:` that only the llama family has. */
const LLAMA_KEYS = ['kv_heads', 'ffn', 'rope_theta'] as const;

/** What is wrong with the scenario's model and data, by key (the file's raw `model:` tells given keys from defaults). */
function modelProblems(s: Scenario, rawModel: unknown): string[] {
  const errors: string[] = [];
  const given = typeof rawModel === 'object' && rawModel !== null ? Object.keys(rawModel) : [];
  if (s.model.from !== undefined) {
    // The checkpoint's own values (what a written-back scenario.json holds) are not a conflict.
    const actual = checkpointShape(s.model.from) as Record<string, unknown>;
    const raw = rawModel as Record<string, unknown>;
    for (const key of SHAPE_KEYS) {
      if (given.includes(key) && raw[key] !== actual[key])
        errors.push(
          `model.${key}: ${JSON.stringify(raw[key])}, but the checkpoint's config.json sets the shape of a model that starts from model.from (its ${key} is ${JSON.stringify(actual[key] ?? null)}); leave ${key} out`,
        );
    }
  } else if (s.model.family === 'gpt2') {
    for (const key of LLAMA_KEYS) if (given.includes(key)) errors.push(`model.${key}: only the llama family has it; set model.family: llama, or leave ${key} out`);
  }
  const rule = s.reward.rule;
  if (s.data && rule !== undefined && !(VERIFIERS as readonly string[]).includes(rule))
    errors.push(`reward.rule: a dataset's answers are checked by a verifier (${VERIFIERS.join(' or ')}); got '${rule}'`);
  if (!s.data && rule !== undefined && (VERIFIERS as readonly string[]).includes(rule))
    errors.push(`reward.rule: '${rule}' checks the answers of a dataset; this scenario has no data: (its prompts come from the '${s.task.name}' task)`);
  return errors;
}

function readText(file: string, what: string): string {
  try {
    return readFileSync(file, 'utf8');
  } catch (e) {
    throw new ScenarioError(`cannot read ${what} ${file}: ${(e as Error).message}`);
  }
}

/**
 * Reads and validates a scenario file. With `planFile` (a `plan:` as `npm run plan --write`
 * writes it), that plan replaces the scenario's before validation.
 */
export function loadScenario(file: string, planFile?: string, o: ReadOptions = {}): Scenario {
  let text = readText(file, 'scenario file');
  let where = file;
  if (planFile) {
    const doc = parseDocument(text);
    const plan = parseDocument(readText(planFile, 'plan file')).toJS() as unknown;
    if (plan === null || typeof plan !== 'object' || !('plan' in plan)) {
      throw new ScenarioError(`${planFile}: expected a YAML map with a 'plan' key (as npm run plan --write writes it), got ${describeValue(plan)}`);
    }
    doc.set('plan', (plan as { plan: unknown }).plan);
    // The lag the plan was searched for (npm run plan --write): a lagged run's k, a free-running
    // run's bound η (the planner prices it at its steady state), 0 for lock-step.
    const lag = (plan as { lag?: unknown }).lag;
    if (lag !== undefined) {
      const rl = (doc.get('rl') ?? {}) as unknown;
      const freeRunning = rl !== null && typeof rl === 'object' && 'get' in rl && Number((rl as { get(k: string): unknown }).get('staleness') ?? 0) > 0;
      doc.setIn(['rl', freeRunning ? 'staleness' : 'lag'], lag);
      if (!freeRunning) doc.setIn(['rl', 'staleness'], 0);
      // Lock-step: nothing to take in flight.
      if (lag === 0) doc.setIn(['rl', 'inflight'], false);
    }
    // Continuous generation the plan was priced with (npm run plan --write): its slots.
    const slots = (plan as { slots?: unknown }).slots;
    if (slots !== undefined) doc.setIn(['rl', 'slots'], slots);
    // In flight, where the planner chose it for a free-running scenario: what it does with the keys and values.
    const inflight = (plan as { inflight?: unknown }).inflight;
    if (inflight !== undefined && inflight !== 'keep' && inflight !== 'recompute')
      throw new ScenarioError(`${planFile}: inflight: expected keep or recompute (what a generation in flight does with the old version's keys and values), got ${describeValue(inflight)}`);
    if (inflight !== undefined) {
      doc.setIn(['rl', 'inflight'], true);
      doc.setIn(['rl', 'inflight_kv'], inflight);
    }
    text = doc.toString();
    where = `${file} with the plan of ${planFile}`;
  }
  const s = parseScenario(text, where, dirname(file), o);
  const named = { ...s, name: s.name ?? basename(file, extname(file)) };
  keepSpec(named, algorithmSpec(s));
  return named;
}

/**
 * loadScenario for a file whose algorithm may be a module of the user's: that module is imported
 * first. Every entry point (scenario, chaos, plan, the supervisor process) reads scenarios this way.
 */
export async function loadScenarioFile(file: string, planFile?: string, o: ReadOptions = {}): Promise<Scenario> {
  const raw = parseDocument(readText(file, 'scenario file')).toJS() as { algorithm?: unknown } | null;
  const a = raw?.algorithm;
  const name = typeof a === 'string' ? a : typeof a === 'object' && a !== null && typeof (a as { name?: unknown }).name === 'string' ? (a as { name: string }).name : undefined;
  if (name !== undefined && isPath(name)) await loadAlgorithmFile(algorithmPath(name, dirname(file)));
  return loadScenario(file, planFile, o);
}

/** The scenario with another plan (an elastic run's re-plan), checked against its cluster and models as a file's would be. */
export function withPlan(s: Scenario, plan: Scenario['plan']): Scenario {
  const out = { ...s, plan };
  keepSpec(out, algorithmSpec(s));
  resolvePlan(out, 'the re-plan');
  return out;
}
