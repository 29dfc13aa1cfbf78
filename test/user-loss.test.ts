// A user's own loss, as users meet it: exported from their algorithm's file, loaded by every worker
// process that trains with it (real processes on a real nats-server), checked against the digest
// the supervisor planned with, and refused — before any work where it can be known then, as a
// failed run (never a recovery loop) where only training shows it.
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { launch } from '../engine/cli/launch.ts';
import { loadScenarioFile } from '../engine/runtime/scenario/scenario.ts';
import type { Summary } from '../engine/runtime/record/record.ts';
import { startNatsServer, type PrivateNatsServer } from '../mesh/wire/server/nats-server.ts';
import { ROOT, smallScenario, spawnTs, tempDir } from './helpers.ts';

const quiet = { phase() {}, iteration() {}, stop() {} };
const dir = tempDir('ferry-user-loss-');
// Inside the checkout (runs/ is ignored), so the module's path travels relative to it.
const inside = join(ROOT, 'runs', `test-user-loss-${process.pid}`);
const api = JSON.stringify(join(ROOT, 'engine/api.ts'));

/** A file of only `losses` and an algorithm running GRPO's graph with the loss its `loss` option names. */
const bareFile = (losses: string) => `import { BUILTIN, defineAlgorithm, defineLoss, tf, z } from ${api};
const grpo = BUILTIN.grpo!;
${losses}
export default defineAlgorithm({ name: 'bare', summary: 'GRPO with another loss', options: z.strictObject({ loss: z.string() }), graph: (o, rl) => grpo.graph(grpo.options.parse({ kl: 'reward', loss: o.loss }), rl) });
`;

/** A user's file: GRPO's graph with the loss its `loss` option names, and the losses it exports. */
const userFile = (extra = '') => `import { BUILTIN, defineAlgorithm, defineLoss, tf, tokenMean, z } from ${api};
const grpo = BUILTIN.grpo!;
/** Half of PPO's clipped surrogate: learns as PPO does, at half the step. */
export const halfPolicy = defineLoss({
  name: 'half_policy',
  summary: 'half the clipped surrogate',
  head: 'policy',
  params: z.strictObject({ clip: z.number().positive().default(0.2) }),
  ports: ['old', 'advantages'],
  stats: ['ratio_mean'],
  compute({ pred, data, mask, norm, params }) {
    const ratio = tf.exp(tf.sub(pred, data.old!));
    const surrogate = tf.minimum(tf.mul(ratio, data.advantages!), tf.mul(tf.clipByValue(ratio, 1 - params.clip, 1 + params.clip), data.advantages!));
    return { loss: tf.mul(-0.5, tokenMean(surrogate, mask, norm)), stats: { ratio_mean: tokenMean(ratio, mask, norm) } };
  },
});
export const notFinite = defineLoss({
  name: 'not_finite',
  summary: 'a loss that divides by zero',
  head: 'policy',
  params: z.strictObject({}),
  ports: ['old'],
  compute: ({ pred, data }) => ({ loss: tf.div(tf.sum(tf.sub(pred, data.old!)), 0) }),
});
${extra}
export default defineAlgorithm({
  name: 'own',
  summary: 'GRPO with a loss of its own',
  options: z.strictObject({ loss: z.string().default('half_policy') }),
  graph: (o, rl) => grpo.graph(grpo.options.parse({ kl: 'reward', loss: o.loss }), rl),
});
`;

function writeUser(folder: string, name: string, text: string): string {
  mkdirSync(folder, { recursive: true });
  const file = join(folder, name);
  writeFileSync(file, text);
  return file;
}

const summaryOf = (out: string) => JSON.parse(readFileSync(join(out, 'summary.json'), 'utf8')) as Summary;

beforeAll(() => {
  writeUser(inside, 'own.ts', userFile());
});
afterAll(() => rmSync(inside, { recursive: true, force: true }));

describe('a loss in the algorithm’s own file', () => {
  it('trains on worker processes that load the file themselves, and two runs end with equal digests', async () => {
    const file = smallScenario(inside, `algorithm: { name: ./own.ts }\ncluster: { nodes: 1, devices_per_node: 2 }`, 'own');
    const digests: Array<Record<string, string>> = [];
    for (const n of [1, 2]) {
      const out = join(dir, `own-${n}`);
      const run = await launch({ scenario: await loadScenarioFile(file), run: `own${n}${Date.now()}`, out, progress: quiet, say: () => {}, workers: undefined });
      expect(run.code, run.summary?.error).toBe(0);
      const s = summaryOf(out);
      expect(s.recoveries).toEqual([]);
      digests.push(s.digests);
      // The loss's own statistic reaches the metrics through the train call's result.
      const scenario = JSON.parse(readFileSync(join(out, 'scenario.json'), 'utf8')) as { algorithm: { name: string } };
      expect(scenario.algorithm.name).toBe(join(inside, 'own.ts'));
    }
    expect(digests[1]).toEqual(digests[0]);
  }, 180_000);

  it('a loss that is not finite fails the run once, naming the loss (no recovery loop)', async () => {
    const file = smallScenario(inside, `algorithm: { name: ./own.ts, loss: not_finite }\ncluster: { nodes: 1, devices_per_node: 1 }`, 'nan');
    const out = join(dir, 'nan');
    const run = await launch({ scenario: await loadScenarioFile(file), run: `nan${Date.now()}`, out, progress: quiet, say: () => {}, workers: undefined });
    expect(run.code).not.toBe(0);
    const s = summaryOf(out);
    expect(s.error).toMatch(/actor\.train.*the loss 'not_finite' is (NaN|-?Infinity) on mini-batch/);
    expect(s.recoveries).toEqual([]);
  }, 120_000);

  it('a file that imports ferry past engine/api.ts is refused before anything starts, naming both files (in a bundled process it would be a second copy of ferry)', async () => {
    const internal = join(ROOT, 'engine/algorithms/index.ts');
    const folder = join(inside, 'internal');
    const own = writeUser(
      folder,
      'own.ts',
      userFile('export const internal = Object.keys(INTERNAL);').replace('import { BUILTIN, ', `import { BUILTIN as INTERNAL } from ${JSON.stringify(internal)};\nimport { BUILTIN, `),
    );
    const file = smallScenario(folder, `algorithm: { name: ./own.ts }\ncluster: { nodes: 1, devices_per_node: 1 }`, 'internal');
    const p = spawnTs('engine/cli/scenario.ts', [file, '--out', join(dir, 'internal')]);
    expect(await p.exited).not.toBe(0);
    expect(p.output()).toContain(`${own} imports ${internal}: a user's file imports ferry through ${join(ROOT, 'engine/api.ts')} alone`);
    expect(p.output()).not.toMatch(/nats-server on/);
  }, 60_000);

  describe('a worker from another checkout', () => {
    let server: PrivateNatsServer;
    beforeAll(async () => {
      server = await startNatsServer();
    });
    afterAll(async () => {
      await server?.stop();
    });

    it('is refused before any work, naming the file and both digests', async () => {
      // The other checkout holds the same path with other bytes (its loss halves nothing).
      const other = join(dir, 'other-checkout');
      writeUser(join(other, relative(ROOT, inside)), 'own.ts', userFile('// another copy'));
      const file = smallScenario(inside, `algorithm: { name: ./own.ts }\ncluster: { nodes: 1, devices_per_node: 1 }`, 'stranger');
      const run = `stranger${Date.now()}`;
      const out = join(dir, 'stranger');
      const running = launch({ scenario: await loadScenarioFile(file), run, out, natsUrl: server.url, workers: 0, progress: quiet, say: () => {} });
      const worker = spawnTs('actors/worker.ts', ['--nats', server.url, '--run', run, '--backend', 'wasm'], {}, { cwd: other });
      onTestFinished(() => void worker.child.kill('SIGKILL'));
      const result = await running;
      expect(result.code).not.toBe(0);
      const s = summaryOf(out);
      expect(s.error).toMatch(
        /^setup: .*the loss module runs\/test-user-loss-\d+\/own\.ts: this worker's copy \(.*other-checkout.*\) has SHA-256 [0-9a-f]{64}, the supervisor planned with [0-9a-f]{64}/,
      );
      expect(s.recoveries).toEqual([]);
      // Nothing trained: the warm-up never ran.
      expect(s.warmup).toBeUndefined();
    }, 120_000);
  });
});

describe('bad losses are refused before anything starts, naming the file, the call and the loss', () => {
  const refusal = async (algorithm: string, file = 'refused') => {
    const scenario = smallScenario(inside, `algorithm: ${algorithm}`, file);
    return loadScenarioFile(scenario).then(
      () => 'accepted',
      (e: Error) => e.message,
    );
  };

  it('an unknown loss name lists the known ones', async () => {
    expect(await refusal('{ name: grpo, loss: nope }')).toMatch(/call 'actor\.train': unknown loss 'nope'; known: clip_policy, clip_value, pair_sigmoid, gspo, cispo, decoupled/);
  });

  it('a parameter of the wrong type, or one the loss does not have', async () => {
    expect(await refusal('{ name: grpo, kl: reward, loss: { name: gspo, clip: big } }')).toMatch(/call 'actor\.train', loss 'gspo': params: clip: .*expected number, received string/);
    expect(await refusal('{ name: grpo, kl: reward, loss: { name: cispo, clipp: 1 } }')).toMatch(/call 'actor\.train', loss 'cispo': params: .*clipp/);
  });

  it('a loss whose ports the graph does not write', async () => {
    writeUser(
      inside,
      'ports.ts',
      bareFile(
        `export const wantsValues = defineLoss({ name: 'wants_values', summary: 'reads returns', head: 'policy', params: z.strictObject({}), ports: ['returns'], compute: ({ pred }) => ({ loss: tf.sum(pred) }) });`,
      ),
    );
    expect(await refusal('{ name: ./ports.ts, loss: wants_values }', 'ports')).toMatch(/call 'actor\.train', loss 'wants_values': it reads port\(s\) returns, which the call does not bind/);
  });

  it('a module that fails to load, or whose loss takes a built-in name', async () => {
    writeUser(inside, 'broken.ts', 'export default {;\n');
    expect(await refusal('./broken.ts', 'broken')).toMatch(/cannot load the algorithm in .*broken\.ts/);
    writeUser(
      inside,
      'taken.ts',
      bareFile(
        `export const mine = defineLoss({ name: 'gspo', summary: 'a second gspo', head: 'policy', params: z.strictObject({}), ports: ['old'], compute: ({ pred }) => ({ loss: tf.sum(pred) }) });`,
      ),
    );
    expect(await refusal('{ name: ./taken.ts, loss: gspo }', 'taken')).toMatch(/taken\.ts exports the loss 'gspo', a name already taken by a built-in loss; rename it/);
  });

  it('a file whose default export is not an algorithm: the file, what was expected and what came', async () => {
    const expected = 'expected a default export made with defineAlgorithm\\(\\{ name, summary, options, graph \\}\\)';
    writeUser(inside, 'no-default.ts', `export const graph = () => ({});\nexport const name = 'x';\n`);
    expect(await refusal('./no-default.ts', 'no-default')).toMatch(new RegExp(`no-default\\.ts: ${expected}, got no default export \\(it exports graph, name\\)`));
    writeUser(inside, 'a-function.ts', 'export default function graph() { return {}; }\n');
    expect(await refusal('./a-function.ts', 'a-function')).toMatch(new RegExp(`a-function\\.ts: ${expected}, got a function \\(graph\\)`));
    writeUser(inside, 'wrong-shape.ts', `export default { name: 'shape', summary: 'no graph', options: { group: 4 } };\n`);
    expect(await refusal('./wrong-shape.ts', 'wrong-shape')).toMatch(
      new RegExp(
        `wrong-shape\\.ts: ${expected}; its default export is wrong: options: expected a zod schema \\(z\\.strictObject\\(\\{\\.\\.\\.\\}\\)\\), got an object with group; graph: expected a function \\(options, rl\\) => Graph, got nothing`,
      ),
    );
  });

  it('an algorithm made by another copy of ferry (its api.ts imported from another checkout)', async () => {
    // What defineAlgorithm of a copy at /elsewhere/ferry leaves on the algorithm it makes.
    writeUser(
      inside,
      'elsewhere.ts',
      bareFile('').replace(
        /export default defineAlgorithm\((.*)\);\n$/s,
        `export default Object.defineProperty($1, Symbol.for('ferry.algorithm'), { value: { url: 'file:///elsewhere/ferry/engine/algorithms/algorithm.ts' } });\n`,
      ),
    );
    expect(await refusal('{ name: ./elsewhere.ts, loss: clip_policy }', 'elsewhere')).toMatch(
      new RegExp(`elsewhere\\.ts: its defineAlgorithm came from another copy of ferry \\(/elsewhere/ferry/engine/api\\.ts\\), .*; import ${join(ROOT, 'engine/api.ts').replace(/[.]/g, '\\.')}$`),
    );
  });
});
