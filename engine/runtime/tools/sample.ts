// A continuation of a prompt, from a trained model of a run directory or from a Hugging Face
// model directory. A run's model is put back from the run's last checkpoint on devices in this
// process, on the layout it trained on; a Hugging Face model (the gpt2 family) is imported onto
// one device. Either decodes with the runtime's own generate call (the KV cache, the end token:
// the task's, or the tokenizer's), and the log-probability of each generated token is then scored
// by an inference call of the same model: under the model itself (temperature 1), whatever the
// sampling settings were.
import type { Bus } from '../../../mesh/wire/index.ts';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import type { Layout } from '../../../mesh/parallel/index.ts';
import { SafetensorsCheckpoint, TOKENIZER_FILE, TextTokenizer, gptSpecOf, importHf, initBackend, parameterShapes, readHfConfig, seedOf, type GptSpec } from '../../model/index.ts';
import { LocalDispatcher } from '../dispatch/local-dispatch.ts';
import { ResumeError, readResume } from '../record/record.ts';
import { baseOwnerOf, callMesh, layoutOf, modelSpec, ownerOf, runSpec } from '../run/run.ts';
import { shardsProblem } from '../store/reshard.ts';
import { loadScenarioFile } from '../scenario/scenario.ts';
import { TaskError } from '../../device/index.ts';

export class SampleError extends Error {
  override name = 'SampleError';
}

export interface SampleOptions {
  /** Prompt token ids, or (a run that read text: a dataset's) the prompt as text. */
  tokens?: readonly number[];
  prompt?: string;
  /** The model of the run to sample (default: the trained policy). */
  model?: string;
  /** New tokens at most (default: the task's budget). */
  maxTokens?: number;
  greedy?: boolean;
  temperature?: number;
  seed?: number;
}

export interface Sample {
  model: string;
  /** The generated token ids, up to and including the end token when one came. */
  tokens: number[];
  /** The log-probability of each under the model. */
  logprobs: number[];
  /** Whether generation stopped at the end token (else at the limit). */
  ended: boolean;
}

/**
 * A run directory's last checkpoint and one of its policies (`model`, default: the trained one),
 * for what `verb` says (sample from, export); `flag` names the option that chose the model, and
 * `fail` makes the caller's error.
 */
export async function runPolicy(dir: string, model: string | undefined, o: { verb: string; flag: string; fail: (message: string) => Error; hint?: string }) {
  if (!existsSync(join(dir, 'scenario.json'))) throw o.fail(`${dir}: expected a run directory (scenario.json and checkpoint.msgpack)${o.hint ?? ''}`);
  const r = runSpec(await loadScenarioFile(join(dir, 'scenario.json')));
  let resume: ReturnType<typeof readResume>;
  try {
    resume = readResume(dir);
  } catch (e) {
    if (e instanceof ResumeError) throw o.fail(e.message.replace('to resume from', `to ${o.verb}`));
    throw e;
  }
  const policies = r.graph.models.filter((m) => m.head === 'policy').map((m) => m.name);
  const name = model ?? r.graph.models.find((m) => m.head === 'policy' && m.trained)?.name ?? policies[0];
  if (!name || !policies.includes(name)) throw o.fail(`${o.flag}: expected a policy of the run (${policies.join(', ')}), got ${JSON.stringify(model)}`);
  const spec = modelSpec(r, name) as GptSpec;
  // A model that was its policy's base (baseOwnerOf) is in the checkpoint as the policy's frozen part.
  const owner = resume.checkpoint[name] === undefined ? baseOwnerOf(r, name) : undefined;
  if (owner !== undefined) {
    const names = new Set(parameterShapes(spec).map(([n]) => n));
    const shards: (typeof resume.checkpoint)[string] = (resume.checkpoint[owner] ?? []).map((c) => ({ tensors: c.tensors.filter((t) => names.has(t.name)) }));
    return {
      r,
      resume: { ...resume, checkpoint: { ...resume.checkpoint, [name]: shards }, layouts: { ...resume.layouts, ...(resume.layouts?.[owner] ? { [name]: resume.layouts[owner]! } : {}) } },
      model: name,
      spec,
    };
  }
  return { r, resume, model: name, spec };
}

export async function sampleRun(dir: string, o: SampleOptions): Promise<Sample & { text?: string }> {
  const { r, resume, model, spec } = await runPolicy(dir, o.model, {
    verb: 'sample from',
    flag: '--model-name',
    fail: (m) => new SampleError(m),
    hint: ' or a Hugging Face model directory (config.json), found neither',
  });
  const { task } = r;
  const R = o.maxTokens ?? task.responseLen;
  const temperature = o.temperature ?? r.scenario.rl.temperature;
  if ((o.tokens === undefined) === (o.prompt === undefined)) throw new SampleError('expected the prompt as token ids or as text, one of the two');
  if (o.prompt !== undefined && !task.encode) throw new SampleError(`--prompt: text prompts need a tokenizer, and the '${task.name}' task has none; give the prompt as --tokens`);
  let prompt: readonly number[];
  try {
    prompt = o.tokens ?? Array.from(task.encode!(o.prompt!));
  } catch (e) {
    if (e instanceof TaskError) throw new SampleError(`--prompt: ${e.message}`);
    throw e;
  }
  checkRequest(prompt, R, temperature, spec, `its task's prompt ${task.promptLen} and budget ${task.responseLen}`);

  const { d, layout } = await restorePolicy({ r, resume, model, spec }, (m) => new SampleError(m));
  try {
    const out = await continueOn(d, layout, model, prompt, R, { temperature, greedy: o.greedy, seed: seedOf(o.seed ?? r.scenario.seed, SAMPLE_STREAM), eos: task.eos });
    return task.encode ? { ...out, text: task.text(out.tokens) } : out;
  } finally {
    await d.close();
  }
}

/**
 * A run's policy put back from its checkpoint in this process, on the layout it trained on, with
 * its weights only (nothing here trains, so no optimizer); the caller closes the dispatcher.
 */
export async function restorePolicy(p: Awaited<ReturnType<typeof runPolicy>>, fail: (message: string) => Error, bus?: Bus): Promise<{ d: LocalDispatcher; layout: Layout }> {
  const { r, resume, model, spec } = p;
  await initBackend(r.scenario.backend);
  // The layout the checkpoint was taken on, where it says (a run resumed on another plan may have
  // rewritten scenario.json before its first checkpoint on the new plan).
  const layout = resume.layouts?.[model] ?? layoutOf(r, ownerOf(r, model));
  const d = new LocalDispatcher(Math.max(...layout.devices) + 1, bus);
  try {
    await Promise.all(layout.devices.map((device, rank) => d.call(device, model, -1, { fn: 'load', role: model, spec, layout, rank })));
    const shards = resume.checkpoint[model] ?? [];
    const problem = shardsProblem(spec, model, layout, shards);
    if (problem) throw fail(problem);
    await Promise.all(
      layout.devices.map((device, rank) => {
        const { optimizer: _, ...weights } = shards[rank]!;
        return d.restoreShard(device, model, -1, weights);
      }),
    );
    return { d, layout };
  } catch (e) {
    await d.close();
    throw e;
  }
}

/** Refuses a prompt, budget or temperature the model cannot take, saying what it expected; `context` says where the model's context comes from. */
function checkRequest(prompt: readonly number[], R: number, temperature: number, spec: { vocab: number; context: number }, context: string): void {
  if (prompt.length === 0) throw new SampleError('expected at least one prompt token, got none');
  const bad = prompt.findIndex((t) => !(Number.isInteger(t) && t >= 0 && t < spec.vocab));
  if (bad >= 0) throw new SampleError(`prompt token ${bad + 1}: expected an id in 0..${spec.vocab - 1} (the model's vocabulary), got ${prompt[bad]}`);
  if (!(Number.isInteger(R) && R > 0)) throw new SampleError(`--max-tokens: expected a whole number > 0, got ${R}`);
  if (prompt.length + R > spec.context) throw new SampleError(`a prompt of ${prompt.length} tokens and ${R} new ones need ${prompt.length + R} positions; the model has ${spec.context} (${context})`);
  if (!(temperature > 0)) throw new SampleError(`--temperature: expected a number > 0, got ${temperature}`);
}

/** The seed stream of sampling from a saved model (apart from a run's own). */
const SAMPLE_STREAM = 0x5a3e;

/**
 * Decodes `R` tokens after `prompt` on a loaded model, then scores them with an inference call at
 * temperature 1: the tokens up to the end token (with it), and each one's log-probability.
 */
async function continueOn(
  d: LocalDispatcher,
  layout: Layout,
  model: string,
  prompt: readonly number[],
  R: number,
  o: { temperature: number; greedy?: boolean; seed: number; eos?: number },
): Promise<Sample> {
  const P = prompt.length;
  // Generation needs one row per data-parallel replica: the prompt is repeated, the first row kept.
  const rows = layout.dp;
  const prompts = new Int32Array(rows * P);
  for (let i = 0; i < rows; i++) prompts.set(prompt, i * P);
  const gen = await callMesh(d, layout, model, 0, {
    fn: 'generate',
    prompts,
    batch: rows,
    promptLen: P,
    responseLen: R,
    seeds: new Uint32Array(rows).fill(o.seed),
    temperature: o.temperature,
    ...(o.greedy ? { greedy: true } : {}),
    ...(o.eos === undefined ? {} : { eos: o.eos }),
  });
  // Whole sequences come back, [rows, P + R]: row 0's response follows its prompt.
  const response = Array.from(gen.tokens.subarray(P, P + R));
  const end = o.eos === undefined ? -1 : response.indexOf(o.eos);
  const kept = end < 0 ? response : response.slice(0, end + 1);
  const scored = await callMesh(d, layout, model, 0, { fn: 'inference', tokens: gen.tokens, batch: rows, promptLen: P, responseLen: R });
  if (!('logprobs' in scored)) throw new Error(`${model}'s inference gave no log-probabilities`);
  return { model, tokens: kept, logprobs: Array.from(scored.logprobs.subarray(0, kept.length)), ended: end >= 0 };
}

export interface HfSampleOptions extends Omit<SampleOptions, 'tokens' | 'model'> {
  /** The prompt as token ids, or as text for the directory's tokenizer. */
  tokens?: readonly number[];
  prompt?: string;
}

/** New tokens by default for a Hugging Face model (its context permitting). */
const HF_DEFAULT_TOKENS = 32;

/**
 * A continuation from a Hugging Face model directory (config.json, model.safetensors, and
 * tokenizer.json for text prompts), on one device in this process.
 */
export async function sampleHf(dir: string, o: HfSampleOptions): Promise<Sample & { text?: string }> {
  const m = readHfConfig(dir);
  const spec = gptSpecOf(m, join(dir, 'config.json'));
  const tokenizer = existsSync(join(dir, TOKENIZER_FILE)) ? TextTokenizer.load(dir) : undefined;
  if ((o.tokens === undefined) === (o.prompt === undefined)) throw new SampleError('expected the prompt as token ids or as text, one of the two');
  if (o.prompt !== undefined && !tokenizer) throw new SampleError(`${dir}: a text prompt needs ${TOKENIZER_FILE}, which the directory does not have; give the prompt as token ids`);
  const prompt = o.tokens ?? tokenizer!.encode(o.prompt!);
  const R = o.maxTokens ?? Math.min(HF_DEFAULT_TOKENS, spec.context - prompt.length);
  const temperature = o.temperature ?? 1;
  checkRequest(prompt, R, temperature, spec, 'n_positions');
  const ck = SafetensorsCheckpoint.open(dir);
  let tensors: ReturnType<typeof importHf>;
  try {
    tensors = importHf(m, ck);
  } finally {
    ck.close();
  }
  await initBackend('auto');
  const layout: Layout = { devices: [0], dp: 1, tp: 1, pp: 1 };
  const d = new LocalDispatcher(1);
  try {
    await d.call(0, 'model', -1, { fn: 'load', role: 'model', spec, layout, rank: 0 });
    await d.restoreShard(0, 'model', -1, { tensors });
    const out = await continueOn(d, layout, 'model', prompt, R, { temperature, greedy: o.greedy, seed: seedOf(o.seed ?? 1, SAMPLE_STREAM), eos: tokenizer?.eos });
    return tokenizer ? { ...out, text: tokenizer.decode(out.tokens) } : out;
  } finally {
    await d.close();
  }
}
