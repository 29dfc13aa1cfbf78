// A run's policy scored on a dataset it did not train on: every row of a JSONL file (or the first
// `max` of the run's seeded order), laid out and verified as the run's own prompts were — the same
// fields, tokenizer, chat template, prompt length, budget and verifier — in batches of generation
// calls on the layout the policy trained on. Greedy by default: the policy's own best answer.
import { seedOf } from '../../model/index.ts';
import { CALL_BYTES, ScenarioError, dataTaskOf } from '../scenario/scenario.ts';
import type { DataTask } from '../data/data-task.ts';
import { callMesh, episodeTaskOf } from '../run/run.ts';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connectBus, startNatsServer, type NatsConnection } from '../../../mesh/wire/index.ts';
import { episodesSpec, startEnvironments, type EnvironmentKey } from '../../environments/index.ts';
import { restorePolicy, runPolicy } from './sample.ts';

export class EvaluationError extends Error {
  override name = 'EvaluationError';
}

export interface EvalOptions {
  /** The JSONL file: the fields the run's data: names. */
  data: string;
  model?: string;
  /** Rows at most (default: all). */
  max?: number;
  /** Sample at the run's temperature instead of taking the likeliest token. */
  sample?: boolean;
  seed?: number;
}

export interface EvalResult {
  model: string;
  rows: number;
  correct: number;
  accuracy: number;
  greedy: boolean;
}

/** The seed stream of evaluation draws (apart from a run's own and sampling's). */
const EVAL_STREAM = 0xe7a1;

export async function evaluateRun(dir: string, o: EvalOptions): Promise<EvalResult> {
  const fail = (m: string) => new EvaluationError(m);
  const policy = await runPolicy(dir, o.model, { verb: 'evaluate', flag: '--model', fail });
  const { r, model } = policy;
  const d = r.scenario.data;
  if (!d) throw fail(`${dir}: the run's prompts came from the '${r.task.name}' task, not a dataset; evaluation reads a dataset through the run's tokenizer and verifier`);
  let task: DataTask;
  try {
    task = dataTaskOf(r.scenario, { file: o.data, key: '--data' });
  } catch (e) {
    throw e instanceof ScenarioError ? fail(e.message) : e;
  }
  const rows = Math.min(o.max ?? task.rows, task.rows);
  if (!(Number.isInteger(rows) && rows > 0)) throw fail(`--max: expected a whole number > 0, got ${o.max}`);
  const P = task.promptLen;
  const width = P + task.responseLen;
  // With an environment, episodes are played against it as in training: ferry starts it on a
  // private server of its own for the evaluation.
  const env = r.scenario.environment;
  if (env && env.command === undefined) throw fail(`${dir}: the run played episodes against '${env.name}', which has no environment.command; evaluation starts the environment itself`);
  const bus = env ? await environmentBus(env) : undefined;
  const { d: dispatcher, layout } = await restorePolicy(policy, fail, bus?.nc).catch(async (e) => {
    await bus?.stop();
    throw e;
  });
  // As many rows per call as one message carries, and every replica gets some.
  const batch = Math.max(layout.dp, Math.min(rows, Math.floor(CALL_BYTES / (width * 4 * 2))));
  const seed = seedOf(o.seed ?? r.scenario.seed, EVAL_STREAM);
  let correct = 0;
  try {
    for (let at = 0, call = 0; at < rows; at += batch, call++) {
      const n = Math.max(Math.min(batch, rows - at), layout.dp);
      const prompts = task.prompts(seed, call, batch).subarray(0, n * P);
      const gen = await callMesh(dispatcher, layout, model, 0, {
        fn: 'generate',
        prompts,
        batch: n,
        promptLen: P,
        responseLen: task.responseLen,
        seeds: Uint32Array.from({ length: n }, (_, i) => seedOf(seed, call, i)),
        temperature: o.sample ? r.scenario.rl.temperature : 1,
        ...(o.sample ? {} : { greedy: true }),
        eos: task.eos!,
        ...(env ? { episodes: episodesSpec(env, episodeTaskOf(r, task), seed, call, prompts, 1) } : {}),
      });
      for (let b = 0; b < Math.min(n, rows - at); b++) correct += task.score(prompts.subarray(b * P, (b + 1) * P), gen.tokens.subarray(b * width + P, (b + 1) * width));
    }
  } finally {
    await dispatcher.close();
    await bus?.stop();
  }
  return { model, rows, correct, accuracy: correct / rows, greedy: !o.sample };
}

/** A private nats-server with the environment's processes on it, and a connection for the devices. */
async function environmentBus(env: EnvironmentKey): Promise<{ nc: NatsConnection; stop(): Promise<void> }> {
  const server = await startNatsServer();
  const logs = mkdtempSync(join(tmpdir(), 'ferry-eval-env-'));
  const processes = startEnvironments(env, { url: server.url, logs, say: (line) => process.stderr.write(`${line}\n`) });
  const nc = await connectBus(server.url, 'ferry-eval');
  return {
    nc,
    async stop() {
      await nc.drain().catch(() => {});
      await processes.stop();
      await server.stop();
      rmSync(logs, { recursive: true, force: true });
    },
  };
}
