// Multi-turn environments as users meet them: a scenario whose environment ferry starts as its own
// processes (examples/env/guess.ts) on the run's closed bus, episodes played by real worker
// processes over a real nats-server, runs that repeat bit for bit and leave no process behind,
// and what is refused: an environment that never comes (the run fails naming it, no recovery
// loop), budgets and plans that cannot hold episodes (before anything starts).
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { launch } from '../engine/cli/launch.ts';
import { runChaos } from '../engine/cli/chaos-run.ts';
import { loadScenarioFile, ScenarioError } from '../engine/runtime/scenario/scenario.ts';
import { evaluateRun } from '../engine/runtime/tools/evaluate.ts';
import { ensurePython, ROOT, tempDir } from './helpers.ts';

const quiet = { phase() {}, iteration() {}, stop() {} };
const dir = tempDir('ferry-env-run-');

/** The guess scenario, small: `extra` lines are appended (later keys win in YAML only if unique, so tests pass whole sections). */
function scenario(name: string, environment: string, extra = ''): string {
  const file = join(dir, `${name}.yaml`);
  writeFileSync(
    file,
    `name: ${name}
seed: 2
backend: wasm
task: { name: count, base: 10, max_new_tokens: 16 }
model: { layers: 1, width: 32, heads: 2 }
cluster: { nodes: 1, devices_per_node: 2 }
algorithm: { name: grpo, group: 4, kl: loss, kl_estimator: k3 }
reward: { weight: 0 }
environment: ${environment}
warmup: { steps: 0 }
${extra || 'rl: { iterations: 3, batch: 4, epochs: 1, minibatches: 2, kl_coef: 0.001, lr: 3.0e-3 }'}
`,
  );
  return file;
}

/** Processes whose command line holds `tag`. */
function processesWith(tag: string): string[] {
  const out = execFileSync('ps', ['-eo', 'pid,args'], { encoding: 'utf8' });
  return out.split('\n').filter((l) => l.includes(tag) && !l.includes('ps -eo'));
}

describe('a scenario with an environment ferry starts', () => {
  it('plays episodes of several turns, ends with equal digests against the environment and its Python twin, and leaves no environment process behind', async () => {
    const tag = `ferry-env-test-${process.pid}`;
    const env = `{ name: guess, max_turns: 4, turn_tokens: 2, group_size: 4, instances: 2, command: [node, --import, tsx, ${join(ROOT, 'examples/env/guess.ts')}, ${tag}] }`;
    const file = scenario('guess', env);
    // The same game in Python (examples/env/guess.py, nats-py and msgpack): the same episodes, here
    // played in 3 slots (rl.slots: an episode waiting on its environment gives its slot to another).
    const python = scenario(
      'guess-py',
      env.replace(`node, --import, tsx, ${join(ROOT, 'examples/env/guess.ts')}`, `${ensurePython()}, ${join(ROOT, 'examples/env/guess.py')}`),
      'rl: { iterations: 3, batch: 4, epochs: 1, minibatches: 2, kl_coef: 0.001, lr: 3.0e-3, slots: 3 }',
    );
    const runs = [];
    // Two runs, one against each twin: equal digests say that a run repeats, that the Python
    // environment plays the same game, and that episodes in slots are those played in groups.
    for (const [n, f] of [
      [1, file],
      [2, python],
    ] as const) {
      const out = join(dir, `run${n}`);
      const run = await launch({ scenario: await loadScenarioFile(f), run: `guess${n}${Date.now()}`, out, progress: quiet, say: () => {}, workers: undefined });
      expect(run.code, run.summary?.error).toBe(0);
      expect(processesWith(tag)).toEqual([]);
      runs.push({ run, out });
    }
    expect(runs[1]!.run.summary!.digests).toEqual(runs[0]!.run.summary!.digests);
    expect(readFileSync(join(runs[1]!.out, 'logs', 'env-guess-0.log'), 'utf8')).toMatch(/serving .*guess-0/);
    const metrics = readFileSync(join(runs[0]!.out, 'metrics.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, number>);
    expect(metrics).toHaveLength(3);
    for (const m of metrics) {
      expect(m.turns).toBeGreaterThan(1);
      expect(m.observation_tokens).toBeGreaterThan(0);
      expect(m.reward_mean).toBeCloseTo(m.episode_return!, 5);
      for (const k of ['env_seconds', 'turn_limit', 'truncated', 'device_idle']) expect(typeof m[k]).toBe('number');
    }
    // A few episodes per iteration, as they went: actions and observations told apart.
    const episodes = readFileSync(join(runs[0]!.out, 'episodes.jsonl'), 'utf8').trim().split('\n');
    expect(episodes).toHaveLength(3);
    const first = JSON.parse(episodes[0]!) as { iteration: number; episodes: Array<{ id: string; turns: Array<{ text: string; observation: string }> }> };
    expect(first.iteration).toBe(0);
    expect(first.episodes[0]!.id).toBe('0-0');
    expect(first.episodes[0]!.turns.length).toBeGreaterThan(0);
    // The report shows them, and the environment's time on the timeline.
    const report = readFileSync(join(runs[0]!.out, 'report.html'), 'utf8');
    expect(Number(report.match(/id="episodes" data-items="(\d+)"/)?.[1])).toBeGreaterThan(0);
    expect(report).toMatch(/<text x="4" y="\d+" class="lbl">environment<\/text>/);
    expect(report).toMatch(/<span class="act">/);
    // The environment's processes logged to the run's directory.
    expect(existsSync(join(runs[0]!.out, 'logs', 'env-guess-0.log'))).toBe(true);
  }, 240_000);

  it("chaos: the generating device killed mid-episode, and an environment instance killed mid-episode, end with the clean run's digests, no rollout lost or repeated, no answer asked twice", async () => {
    // The guess game, noting every request it answers (a group per replica: the kill comes when every answer of the round is in).
    const asked = join(dir, 'asked.log');
    const env = `{ name: guess, max_turns: 4, turn_tokens: 2, group_size: 16, instances: 2, command: [node, --import, tsx, ${join(ROOT, 'test/fixtures/counted-guess.ts')}, ${asked}] }`;
    const file = scenario(
      'guess-chaos',
      env,
      'rl: { iterations: 4, batch: 4, epochs: 1, minibatches: 2, kl_coef: 0.001, lr: 3.0e-3 }\nchaos: { kills: [{ actor: actor, call: generate, iteration: 1 }, { actor: environment, call: generate, iteration: 2 }] }',
    );
    const lines: string[] = [];
    const report = await runChaos(await loadScenarioFile(file), join(dir, 'chaos'), (l) => lines.push(l));
    expect(report.chaos.status, report.chaos.error).toBe('succeeded');
    expect(report.kills_by_actor).toEqual({ actor: 1, environment: 1 });
    expect(report.recoveries).toBe(1);
    expect(report.digests_equal).toBe(true);
    expect(report.rollouts_lost).toBe(0);
    expect(report.rollouts_duplicated).toBe(0);
    // Each kill came after the episodes' first step: mid-episode.
    expect(lines.join('\n')).toMatch(/chaos: killing environment 'guess' instance 0 \(pid \d+\) while device \d+, 'generate' of actor, iteration 2/);
    // Iteration 1 (the device killed after its first round): no step the environment answered
    // before the kill was asked again (it was read from the record); the episodes that went on were
    // brought to where they were by a reset and replays. The clean run asked exactly the same steps.
    const runs = new Map<string, string[]>();
    for (const line of readFileSync(asked, 'utf8').trim().split('\n')) {
      const [bus, ...rest] = line.split(' ');
      runs.set(bus!, [...(runs.get(bus!) ?? []), rest.join(' ')]);
    }
    expect(runs.size).toBe(2);
    const firstAsks = (log: string[]) =>
      log
        .map((l) => l.split(' ').slice(1))
        .filter(([kind, episode, , replay]) => kind === 'step' && episode!.startsWith('1-') && replay === 'false')
        .map((w) => w.slice(0, 3).join(' '))
        .sort();
    const [clean, chaos] = [...runs.values()].sort((a, b) => a.filter((l) => l.endsWith(' true')).length - b.filter((l) => l.endsWith(' true')).length);
    const chaosAsks = firstAsks(chaos!);
    expect(new Set(chaosAsks).size).toBe(chaosAsks.length);
    expect(chaosAsks).toEqual(firstAsks(clean!));
    expect(chaos!.some((l) => / step 1-\d+ 1 true$/.test(l))).toBe(true);
  }, 180_000);

  it('an environment that never appears fails the run once, naming it and where it was awaited', async () => {
    const file = scenario('absent', '{ name: nobody, wait_seconds: 1 }', 'rl: { iterations: 2, batch: 4, epochs: 1, minibatches: 2 }');
    const out = join(dir, 'absent');
    const run = await launch({ scenario: await loadScenarioFile(file), run: `absent${Date.now()}`, out, progress: quiet, say: () => {}, workers: undefined });
    expect(run.code).not.toBe(0);
    expect(run.summary?.status).toBe('failed');
    expect(run.summary?.error).toMatch(/no environment 'nobody' appeared on ferry\.env\.nobody\.hb within 1 s \(its wait_seconds\)/);
    expect(run.summary?.recoveries ?? []).toEqual([]);
  }, 120_000);

  it("warms up on episodes the environment's expert plays; an environment without an expert fails the run once, naming it", async () => {
    const warm = (name: string, command: string) => {
      const file = scenario(name, `{ name: guess, max_turns: 4, turn_tokens: 2, command: [${command}] }`, 'rl: { iterations: 1, batch: 4, epochs: 1, minibatches: 2, lr: 3.0e-3 }');
      writeFileSync(file, readFileSync(file, 'utf8').replace('warmup: { steps: 0 }', 'warmup: { source: environment, steps: 20, demos: 128, batch: 16 }'));
      return file;
    };
    const out = join(dir, 'warm');
    const run = await launch({
      scenario: await loadScenarioFile(warm('warm', `node, --import, tsx, ${join(ROOT, 'examples/env/guess.ts')}`)),
      run: `warm${Date.now()}`,
      out,
      progress: quiet,
      say: () => {},
      workers: undefined,
    });
    expect(run.code, run.summary?.error).toBe(0);
    const summary = JSON.parse(readFileSync(join(out, 'summary.json'), 'utf8')) as { warmup: { source: string; turns: number; first_loss: number; loss: number } };
    // Binary search over 0-9 takes 2.9 guesses on average; the demonstrations are drawn from seeds, so about that.
    expect(summary.warmup.source).toBe('environment');
    expect(summary.warmup.turns).toBeGreaterThan(2.3);
    expect(summary.warmup.turns).toBeLessThan(3.5);
    expect(summary.warmup.loss).toBeLessThan(summary.warmup.first_loss / 2);
    // guess.py has no expert: it answers env.demo with an error, and the run stops there, once
    // (the demonstrations are asked for all at once: whichever answer comes first names its episode).
    const py = join(dir, 'warm-py');
    const refused = await launch({
      scenario: await loadScenarioFile(warm('warm-py', `${ensurePython()}, ${join(ROOT, 'examples/env/guess.py')}`)),
      run: `warmpy${Date.now()}`,
      out: py,
      progress: quiet,
      say: () => {},
      workers: undefined,
    });
    expect(refused.code).not.toBe(0);
    expect(refused.summary?.error).toMatch(
      /warm-up from environment 'guess': environment 'guess' \(instance guess-0\) could not answer env\.demo of episode warmup-\d+: .*unknown request type 'env\.demo'/,
    );
    expect(refused.summary?.recoveries ?? []).toEqual([]);
  }, 180_000);
});

describe('the calculator: a tool the policy calls in the middle of its answer', () => {
  it('answers a call at the end of an action with its result, and ends the episode on an answer without one', async () => {
    const { answer, calculate } = await import('../examples/env/calculator.ts');
    expect(calculate('37 * 12')).toBe(444);
    expect(calculate('27/9')).toBe(3);
    expect(calculate('28 / 9')).toBeUndefined();
    expect(calculate('2 ** 3')).toBeUndefined();
    expect(answer('so <calc>22 - 7</calc>')).toEqual({ observation: '<result>15</result>', done: false, info: { calls: 1, errors: 0 } });
    expect(answer('<calc>1 / 0</calc>')).toMatchObject({ observation: '<result>error</result>', done: false });
    expect(answer('\n#### 15')).toEqual({ observation: '', done: true, info: { calls: 0 } });
  });

  it('a run on the arithmetic data with the calculator, then npm run eval playing its episodes against a calculator of its own, leaving no process', async () => {
    const tag = `ferry-calc-test-${process.pid}`;
    const file = join(dir, 'calc.yaml');
    writeFileSync(
      file,
      `name: calc
seed: 1
backend: wasm
data: { train: ${join(ROOT, 'examples/arith/train.jsonl')}, prompt_field: question, answer_field: answer, demo_field: tool, tokenizer: ${join(ROOT, 'examples/arith/tokenizer')}, prompt_tokens: 96 }
task: { max_new_tokens: 56 }
reward: { rule: math }
environment: { name: calculator, max_turns: 3, turn_tokens: 40, stop_strings: ["</calc>"], weight: 0, command: [node, --import, tsx, ${join(ROOT, 'examples/env/calculator.ts')}, ${tag}] }
model: { family: llama, layers: 1, width: 32, heads: 2, kv_heads: 1 }
cluster: { nodes: 1, devices_per_node: 2 }
warmup: { steps: 4, demos: 64, batch: 16 }
algorithm: { name: grpo, group: 2 }
rl: { iterations: 1, batch: 4, epochs: 1, minibatches: 2 }
`,
    );
    const out = join(dir, 'calc');
    const run = await launch({ scenario: await loadScenarioFile(file), run: `calc${Date.now()}`, out, progress: quiet, say: () => {}, workers: undefined });
    expect(run.code, run.summary?.error).toBe(0);
    const metrics = JSON.parse(readFileSync(join(out, 'metrics.jsonl'), 'utf8').trim().split('\n')[0]!) as Record<string, number>;
    expect(metrics.turns).toBeGreaterThanOrEqual(1);
    const evaluated = await evaluateRun(out, { data: join(ROOT, 'examples/arith/test.jsonl'), max: 6 });
    expect(evaluated.rows).toBe(6);
    expect(evaluated.accuracy).toBeGreaterThanOrEqual(0);
    expect(evaluated.accuracy).toBeLessThanOrEqual(1);
    expect(processesWith(tag)).toEqual([]);
  }, 180_000);
});

describe('scenarios that cannot hold episodes are refused before anything starts, naming the key', () => {
  const refusal = async (name: string, environment: string, extra = '') => {
    try {
      await loadScenarioFile(scenario(name, environment, extra));
    } catch (e) {
      expect(e).toBeInstanceOf(ScenarioError);
      return (e as Error).message;
    }
    throw new Error('expected a refusal');
  };

  it('an action budget beyond the response budget, a plan that splits the generating model, an algorithm of pairs', async () => {
    expect(await refusal('turns', '{ name: g, turn_tokens: 20 }')).toMatch(
      /environment\.turn_tokens: 20 tokens per action exceed the 16 tokens after the prompt that all turns share \(task\.max_new_tokens\)/,
    );
    expect(await refusal('split', '{ name: g }', 'plan: { actor.generate: { mesh: "0:0-1", tp: 2 } }\nrl: { iterations: 2, batch: 4, epochs: 1, minibatches: 2 }')).toMatch(
      /plan\.actor\.generate: episodes of several turns are generated by replicas of one device each \(tp = pp = 1\); the plan has tp=2, pp=1/,
    );
    const dpo = scenario('pairs', '{ name: g }').replace('pairs.yaml', 'pairs2.yaml');
    writeFileSync(dpo, readFileSync(scenario('pairs', '{ name: g }'), 'utf8').replace('algorithm: { name: grpo, group: 4, kl: loss, kl_estimator: k3 }', 'algorithm: dpo'));
    await expect(loadScenarioFile(dpo)).rejects.toThrow(/environment: 'dpo' learns from preference pairs and generates nothing/);
    expect(await refusal('name', '{ name: "a.b" }')).toMatch(/environment\.name/);
  });
});
