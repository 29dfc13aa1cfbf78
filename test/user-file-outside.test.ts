// A user's algorithm file in a folder of its own, outside the checkout (docs/losses.md): it
// imports engine/api.ts by an absolute path, and its folder has no package.json and no
// node_modules. Run by ferry's own command lines (real tsx processes, as users run them: inside
// vitest every module goes through vite, which would hide how Node and tsx load such a file).
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Graph } from '../engine/algorithms/graph.ts';
import type { Summary } from '../engine/runtime/record/record.ts';
import { ROOT, spawnTs, tempDir } from './helpers.ts';

const dir = tempDir('ferry-outside-');
// The same file inside the checkout (runs/ is ignored), to compare with.
const inside = join(ROOT, 'runs', `test-user-file-outside-${process.pid}`);
const api = join(ROOT, 'engine/api.ts');

/** The example's file, its one import of ferry made absolute, as docs/losses.md says to. */
function copyExample(name: string): string {
  const text = readFileSync(join(ROOT, 'examples/algorithm', name), 'utf8');
  const absolute = text.replace("from '../../engine/api.ts'", `from ${JSON.stringify(api)}`);
  expect(absolute).not.toBe(text);
  const file = join(dir, name);
  writeFileSync(file, absolute);
  return file;
}

/** A scenario in `folder`, as small as a run gets. */
function scenario(name: string, algorithm: string, folder = dir): string {
  const file = join(folder, `${name}.yaml`);
  writeFileSync(
    file,
    [
      `name: ${name}`,
      'seed: 1',
      'backend: wasm',
      'model: { layers: 1, width: 16, heads: 2 }',
      'cluster: { nodes: 1, devices_per_node: 1 }',
      `algorithm: ${algorithm}`,
      'warmup: { steps: 1, demos: 16, batch: 16 }',
      'rl: { iterations: 1, batch: 4, epochs: 1, minibatches: 1 }',
      '',
    ].join('\n'),
  );
  return file;
}

/** The graphs the scenarios' algorithms build, loaded by one tsx process (test/fixtures/algorithm-graph.ts). */
async function graphs(...scenarios: string[]): Promise<Array<{ graph?: Graph; error?: string }>> {
  const p = spawnTs('test/fixtures/algorithm-graph.ts', scenarios);
  const code = await p.exited;
  expect(code, p.output()).toBe(0);
  const lines = p
    .output()
    .split('\n')
    .filter((l) => l.startsWith('{'));
  expect(lines.length, p.output()).toBe(scenarios.length);
  return lines.map((l) => JSON.parse(l));
}

/** A graph with its user's losses' module (path and SHA-256) left out: where the file lies. */
const withoutModules = (g: Graph | undefined) => ({
  ...g,
  calls: g?.calls.map((c) => (c.fn === 'train' ? { ...c, loss: { ...c.loss, module: c.loss.module === undefined ? 'none' : 'a module' } } : c)),
});

/** A built-in graph (GRPO's) trained with the file's loss, which the scenario names as `loss:`. */
const HALF = `import { defineAlgorithm, defineLoss, grpo, tf, tokenMean, z } from ${JSON.stringify(api)};
export const halfPolicy = defineLoss({
  name: 'half_policy',
  summary: 'half the clipped surrogate',
  head: 'policy',
  params: z.strictObject({ clip: z.number().positive().default(0.2) }),
  ports: ['old', 'advantages'],
  compute({ pred, data, mask, norm, params }) {
    const ratio = tf.exp(tf.sub(pred, data.old!));
    const surrogate = tf.minimum(tf.mul(ratio, data.advantages!), tf.mul(tf.clipByValue(ratio, 1 - params.clip, 1 + params.clip), data.advantages!));
    return { loss: tf.mul(-0.5, tokenMean(surrogate, mask, norm)) };
  },
});
export default defineAlgorithm({
  name: 'half',
  summary: 'GRPO with the loss its option names',
  options: z.strictObject({ loss: z.string() }),
  graph: (o, rl) => grpo.graph(grpo.options.parse({ group: 2, kl: 'reward', loss: o.loss }), rl),
});
`;

beforeAll(() => {
  copyExample('gmpo.ts');
  copyExample('rank-grpo.ts');
  writeFileSync(join(dir, 'half.ts'), HALF);
  mkdirSync(inside, { recursive: true });
  writeFileSync(join(inside, 'half.ts'), HALF);
});
afterAll(() => rmSync(inside, { recursive: true, force: true }));

describe('an algorithm file outside the checkout', () => {
  it('examples/algorithm/gmpo.ts, copied out: the supervisor and a worker process load it, and it trains', async () => {
    const out = join(dir, 'gmpo-run');
    const p = spawnTs('engine/cli/scenario.ts', [scenario('gmpo', '{ name: ./gmpo.ts, group: 2 }'), '--out', out]);
    const code = await p.exited;
    expect(code, p.output()).toBe(0);
    const s = JSON.parse(readFileSync(join(out, 'summary.json'), 'utf8')) as Summary;
    expect(s.status).toBe('succeeded');
    expect(s.recoveries).toEqual([]);
    // The train call ran the file's loss: its statistic reached the metrics.
    const metrics = readFileSync(join(out, 'metrics.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(metrics.some((m) => typeof m.actor_clipfrac === 'number' && Number.isFinite(m.actor_loss))).toBe(true);
  }, 120_000);

  it('builds the graph it builds inside the checkout: gmpo.ts, rank-grpo.ts, and a built-in graph with the file’s loss as `loss:`', async () => {
    const gmpoIn = scenario('gmpo-in', `{ name: ${join(ROOT, 'examples/algorithm/gmpo.ts')}, group: 2 }`);
    const gmpoOut = scenario('gmpo-out', '{ name: ./gmpo.ts, group: 2 }');
    const halfIn = scenario('half-in', '{ name: ./half.ts, loss: half_policy }', inside);
    const halfOut = scenario('half-out', '{ name: ./half.ts, loss: half_policy }');
    const rankIn = scenario('rank-in', `{ name: ${join(ROOT, 'examples/algorithm/rank-grpo.ts')}, group: 2 }`);
    const rankOut = scenario('rank-out', '{ name: ./rank-grpo.ts, group: 2 }');
    // One process each side: a process refuses two files that export losses of the same name.
    const [[gIn, hIn, rIn], [gOut, hOut, rOut]] = await Promise.all([graphs(gmpoIn, halfIn, rankIn), graphs(gmpoOut, halfOut, rankOut)]);
    for (const [a, b] of [
      [gIn!, gOut!],
      [hIn!, hOut!],
      [rIn!, rOut!],
    ]) {
      expect(a.error).toBeUndefined();
      expect(b.error).toBeUndefined();
      expect(withoutModules(b.graph)).toEqual(withoutModules(a.graph));
    }
    // The actor trains with the file's loss, its ports bound to the batch's fields.
    const train = hOut!.graph!.calls.find((c) => c.name === 'actor.train') as Extract<Graph['calls'][number], { fn: 'train' }>;
    expect(train.loss.name).toBe('half_policy');
    expect(train.reads).toMatchObject({ old: 'logprobs', advantages: 'advantages' });
    expect(train.loss.module?.file).toBe(join(dir, 'half.ts'));
    expect(hIn!.graph!.calls.find((c) => c.name === 'actor.train')).toMatchObject({ loss: { module: { sha256: train.loss.module!.sha256 } } });
  }, 60_000);
});
