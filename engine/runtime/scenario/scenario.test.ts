import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it, expect } from 'vitest';
import { fileURLToPath } from 'node:url';
import { ScenarioError, loadScenario, modelOf, parseScenario, policySpec, resolvePlan, scenarioJsonSchema, taskOf } from './scenario.ts';
import { encodeSafetensors, hfTensors, parseHfConfig } from '../../model/index.ts';
import { arithTokenizerFiles } from '../data/arith.ts';
import { modelSpec, runSpec } from '../run/spec.ts';

function scenarioError(text: string): string {
  try {
    parseScenario(text, 'test.yaml');
  } catch (e) {
    expect(e).toBeInstanceOf(ScenarioError);
    expect((e as Error).name).toBe('ScenarioError');
    return (e as Error).message;
  }
  throw new Error(`parseScenario accepted ${JSON.stringify(text)}`);
}

describe('parseScenario defaults', () => {
  const documented = {
    seed: 1,
    backend: 'auto',
    task: { name: 'sort', digits: 4, base: 10 },
    model: { family: 'gpt2', layers: 2, width: 64, heads: 4, tied: false },
    cluster: { nodes: 1, devices_per_node: 4, device: 'local' },
    models: {},
    lengths: {},
    algorithm: { name: 'ppo', critic_lr: 1e-3, value_clip: 0.2, gamma: 1, lambda: 0.95, loss: 'clip_policy' },
    plan: {},
    warmup: { steps: 15, demos: 1024, batch: 32, lr: 3e-3, source: 'task' },
    rl: {
      iterations: 40,
      batch: 64,
      epochs: 2,
      minibatches: 2,
      clip: 0.2,
      kl_coef: 0.02,
      temperature: 1,
      top_k: 0,
      top_p: 1,
      lr: 1e-3,
      clip_norm: 1,
      lag: 0,
      staleness: 0,
      slots: 0,
      inflight: false,
      inflight_kv: 'keep',
    },
    reward: { weight: 1, actors: [] },
    checkpoint: { every: 1 },
    bus: { sync: 'always' },
    timeouts: { join_seconds: 60, call_seconds: 300, heartbeat_seconds: 10, recover_seconds: 120 },
    supervision: { strategy: 'one_for_one', intensity: 10, period_seconds: 60, restart: { worker: 'permanent', supervisor: 'transient' } },
  };

  it('an empty mapping yields the documented defaults', () => {
    const s = parseScenario('{}', 'empty.yaml');
    expect(s).toEqual(documented);
    expect(s.name).toBeUndefined();
    expect(s.reward.rule).toBeUndefined();
  });

  it('an empty file, or one of comments only, is refused: it would run every default unasked', () => {
    for (const text of ['', '\n\n', '# nothing here\n# at all\n']) {
      expect(() => parseScenario(text, 'c.yaml')).toThrow(ScenarioError);
      expect(() => parseScenario(text, 'c.yaml')).toThrow(/^c\.yaml: expected a mapping of settings \(task:, model:, rl:, …\), the file has none \(it is empty or only comments\)/);
    }
  });

  it('an override changes only what it names; siblings keep their defaults', () => {
    const s = parseScenario('rl: {epochs: 5}\ntask: {name: reverse}', 'o.yaml');
    expect(s.rl).toEqual({ ...documented.rl, epochs: 5 });
    expect(s.task).toEqual({ name: 'reverse', digits: 4, base: 10 });
    expect(s.model).toEqual(documented.model);
  });

  it('plan entries get dp = tp = pp = 1 by default', () => {
    const s = parseScenario('plan: {actor.generate: {mesh: "0:0"}, actor.train: {mesh: "0:0"}}', 'p.yaml');
    expect(s.plan['actor.generate']).toEqual({ mesh: '0:0', dp: 1, tp: 1, pp: 1 });
  });

  it('the quickstart scenario loads, named after its file', () => {
    const file = fileURLToPath(new URL('../../../scenarios/quickstart.yaml', import.meta.url));
    const s = loadScenario(file);
    expect(s.name).toBe('quickstart');
    expect(s.task).toEqual({ name: 'sort', digits: 4, base: 10 });
  });

  it('a file that cannot be read is a ScenarioError naming the file', () => {
    expect(() => loadScenario('/nonexistent/x.yaml')).toThrow(ScenarioError);
    expect(() => loadScenario('/nonexistent/x.yaml')).toThrow(/cannot read scenario file \/nonexistent\/x\.yaml/);
  });
});

describe('parseScenario refusals', () => {
  it('an unknown key at a nested path names the path and the key', () => {
    const m = scenarioError('rl: {epochz: 3}');
    expect(m).toMatch(/^test\.yaml: 1 problem\(s\):\n  rl\.epochz: unknown key \(expected one of: iterations, batch, epochs,/);
  });

  it('an unknown top-level key', () => {
    expect(scenarioError('seeed: 3')).toContain('seeed: unknown key (expected one of: name, seed,');
  });

  it('an unknown call in the plan', () => {
    expect(scenarioError('plan: {actor.gen: {mesh: "0:1"}}')).toMatch(/plan\.actor\.gen: (unknown key|Invalid key|'ppo' has no call 'actor\.gen')/);
  });

  it('a wrong type names the field path and what came', () => {
    const m = scenarioError('rl: {epochs: "two"}');
    expect(m).toContain('rl.epochs: expected number, received string (got "two")');
    expect(m.startsWith('test.yaml: 1 problem(s):')).toBe(true);
  });

  it('a response budget a task cannot take, and sampling settings out of range, name their paths', () => {
    expect(scenarioError('task: {name: sort, digits: 4, max_new_tokens: 6}')).toBe(
      "test.yaml: task.max_new_tokens: the 'sort' task answers with exactly 4 tokens (its digits) and has no end-of-sequence token; max_new_tokens must be 4 or left out, got 6",
    );
    expect(parseScenario('task: {name: count, base: 10, max_new_tokens: 6}', 'c.yaml').task.max_new_tokens).toBe(6);
    expect(scenarioError('rl: {top_p: 0}')).toMatch(/rl\.top_p: .*\(got number 0\)/);
    expect(scenarioError('rl: {top_k: -1}')).toMatch(/rl\.top_k: .*\(got number -1\)/);
  });

  it('a value out of range names its path', () => {
    expect(scenarioError('algorithm: {name: ppo, gamma: 1.5}')).toMatch(/algorithm\.gamma: .*\(got number 1\.5\)/);
    expect(scenarioError('task: {base: 1}')).toMatch(/task\.base: .*\(got number 1\)/);
    expect(scenarioError('task: {name: shuffle}')).toMatch(/task\.name: .*\(got "shuffle"\)/);
  });

  it('every problem is listed', () => {
    const m = scenarioError('seed: -1\nrl: {epochs: 0, clip: "x"}');
    expect(m).toMatch(/^test\.yaml: 3 problem\(s\):/);
    expect(m).toContain('seed:');
    expect(m).toContain('rl.epochs:');
    expect(m).toContain('rl.clip:');
  });

  it('errors stay short: five items at most, with a count of the rest', () => {
    const many = Array.from({ length: 12 }, (_, i) => `k${i}: 1`).join('\n');
    const m = scenarioError(many);
    expect(m).toBe(
      'test.yaml: 1 problem(s):\n  k0, k1, k2, k3, k4, … and 7 more: unknown keys (expected one of: name, seed, backend, task, model, data, cluster, models, lengths, algorithm, plan, warmup, rl, reward, environment, checkpoint, bus, timeouts, supervision, chaos, elastic)',
    );
    const wrong = scenarioError('seed: -1\nrl: {epochs: 0, batch: 0, iterations: 0, clip: "x", lr: -1, temperature: 0}');
    expect(wrong).toMatch(/^test\.yaml: 7 problem\(s\):/);
    expect(wrong.split('\n')).toHaveLength(1 + 5 + 1);
    expect(wrong).toMatch(/… and 2 more$/);
  });

  it('well-typed values no run can honour are refused, naming the key', () => {
    expect(scenarioError('rl: {batch: 4, minibatches: 8}')).toBe('test.yaml: the plan does not fit:\n  rl.minibatches: 8 mini-batches need at least as many rows; a train call gets 4');
    expect(scenarioError('algorithm: {name: grpo, group: 2}\nrl: {batch: 2, minibatches: 5}')).toMatch(
      /rl\.minibatches: 5 mini-batches need at least as many rows; a train call gets 4 \(rl\.batch 2 × 2 samples per prompt\)/,
    );
    expect(scenarioError('task: {digits: 100000}')).toMatch(/task\.digits: .*<=256 \(got number 100000\)/);
    expect(scenarioError('task: {name: count, max_new_tokens: 100000}')).toMatch(/task\.max_new_tokens: .*<=4096/);
    expect(scenarioError('rl: {lr: .nan}')).toMatch(/rl\.lr: expected number, received NaN/);
    expect(scenarioError('rl: {iterations: 0}')).toMatch(/rl\.iterations: .*\(got number 0\)/);
    expect(scenarioError('rl: {lr: -0.1}')).toMatch(/rl\.lr: .*\(got number -0\.1\)/);
    expect(scenarioError('cluster: {nodes: 0}')).toMatch(/cluster\.nodes: .*\(got number 0\)/);
  });

  it('invalid YAML is reported as such, with the position', () => {
    const m = scenarioError('rl: [1');
    expect(m).toMatch(/^test\.yaml: not valid YAML:\n {2}/);
    expect(m).toMatch(/line 1/);
    expect(scenarioError('a: b: c')).toMatch(/not valid YAML/);
  });

  it('a document that is not a mapping', () => {
    expect(scenarioError('42')).toContain('(top level): expected object, received number (got number 42)');
    expect(scenarioError('- a\n- b')).toContain('(top level): expected object, received array (got an array of 2)');
  });
});

describe('plan checks', () => {
  it('dp×tp×pp must equal the mesh size', () => {
    const m = scenarioError('plan: {actor.generate: {mesh: "0:0-1", dp: 1}}');
    expect(m).toContain('test.yaml: the plan does not fit:');
    expect(m).toContain('plan.actor.generate: dp×tp×pp = 1×1×1 = 1, but mesh "0:0-1" has 2 device(s)');
  });

  it('a mesh outside the cluster', () => {
    expect(scenarioError('plan: {actor.generate: {mesh: "1:0"}}')).toContain('plan.actor.generate: mesh "1:0": node 1 is outside the cluster of 1 node(s)');
    expect(scenarioError('plan: {critic.train: {mesh: "0:4"}}')).toContain('plan.critic.train: mesh "0:4": device 4 is outside a node of 4 device(s)');
  });

  it('a malformed or misaligned mesh names the call', () => {
    expect(scenarioError('plan: {reward.inference: {mesh: "0:1-2", dp: 2}}')).toContain('plan.reward.inference: mesh "0:1-2": expected an aligned power-of-two block');
    expect(scenarioError('plan: {reward.inference: {mesh: "zero"}}')).toContain('plan.reward.inference: mesh "zero": expected');
  });

  it('tp that does not divide the heads is refused (4 heads cannot be split over 8 ranks)', () => {
    // width 64, heads 4, tp 8: Megatron splits heads over tp ranks, 4 % 8 ≠ 0.
    const m = scenarioError('cluster: {devices_per_node: 8}\nmodel: {heads: 4, width: 64}\nplan: {actor.generate: {mesh: "0:0-7", tp: 8}, actor.train: {mesh: "0:0-7", tp: 8}}');
    expect(m).toContain("plan.actor.generate: tp=8 must divide the model's 4 attention heads");
  });

  it('tp that divides the heads is accepted (2 heads of width 6 over tp = 2)', () => {
    const s = parseScenario('model: {heads: 2, width: 6}\nplan: {actor.generate: {mesh: "0:0-1", tp: 2}, actor.train: {mesh: "0:0-1", tp: 2}}', 'test.yaml');
    expect(resolvePlan(s)['actor.train']).toMatchObject({ devices: [0, 1], dp: 1, tp: 2, pp: 1 });
  });

  it('multi-device meshes are accepted, with the checks that keep them runnable', () => {
    const s = parseScenario('plan: {actor.generate: {mesh: "0:0-1", dp: 2}, actor.train: {mesh: "0:0-3", dp: 2, pp: 2}}', 'test.yaml');
    expect(resolvePlan(s)['actor.train']).toMatchObject({ devices: [0, 1, 2, 3], dp: 2, tp: 1, pp: 2 });
    expect(scenarioError('plan: {reward.inference: {mesh: "0:2-3", dp: 2}}')).toContain('plan.reward.inference: the rule reward runs on one device; mesh "0:2-3" has 2');
    expect(scenarioError('model: {layers: 2}\nplan: {critic.train: {mesh: "0:0-3", pp: 4}}')).toContain('plan.critic.train: pp=4 needs at least 4 layers; the model has 2');
    expect(scenarioError('rl: {batch: 4, minibatches: 2}\nwarmup: {batch: 4}\nplan: {critic.train: {mesh: "0:0-3", dp: 4}}')).toContain(
      'plan.critic.train: dp=4 replicas need at least 4 rows per batch; this call gets 2',
    );
  });

  it('a warm-up from the environment needs an environment', () => {
    expect(scenarioError('warmup: {source: environment}')).toContain("warmup.source: 'environment' draws demonstrations from the scenario's environment, and it names none");
    expect(scenarioError('warmup: {source: expert}')).toMatch(/warmup\.source/);
  });

  it("a model's calls may use different meshes (the supervisor reallocates between them)", () => {
    // actor.generate on 0:1, actor.train on its default 0:0
    const s = parseScenario('plan: {actor.generate: {mesh: "0:1"}}', 'test.yaml');
    expect(resolvePlan(s)['actor.generate'].devices).toEqual([1]);
    expect(resolvePlan(s)['actor.train'].devices).toEqual([0]);
  });

  it('a mean response length for planning must be below the budget (lengths.response, else the task): refused, naming the key', () => {
    expect(parseScenario('lengths: { response: 1000, response_mean: 250 }', 'l.yaml').lengths).toEqual({ response: 1000, response_mean: 250 });
    expect(() => parseScenario('lengths: { response: 1000, response_mean: 1000 }', 'l.yaml')).toThrow(/lengths\.response_mean: 1000 is not below the response budget, 1000 \(lengths\.response\)/);
    expect(() => parseScenario('lengths: { response_mean: 4096 }', 'l.yaml')).toThrow(/lengths\.response_mean: 4096 is not below the response budget, \d+ \(the task's\)/);
    expect(() => parseScenario('lengths: { response_mean: 0 }', 'l.yaml')).toThrow(/lengths\.response_mean/);
  });

  it('model.lora: on the trained models only, every linear layer by default; bad ranks, targets, modules and dropout refused before work starts, naming the key and the file', () => {
    const s = parseScenario('model: { layers: 2, width: 64, heads: 4, lora: { rank: 4, alpha: 16 } }', 'lora.yaml');
    const r = runSpec(s);
    expect(modelSpec(r, 'actor')).toMatchObject({ lora: { rank: 4, alpha: 16, targets: ['c_attn', 'c_proj', 'c_fc'] } });
    expect(modelSpec(r, 'critic')).toMatchObject({ kind: 'value', lora: { rank: 4 } });
    expect(modelSpec(r, 'reference')).not.toHaveProperty('lora');
    const llama = parseScenario('model: { family: llama, layers: 2, width: 64, heads: 4, lora: { rank: 2, targets: [q_proj, v_proj], modules_to_save: [lm_head] } }', 'l.yaml');
    expect(modelSpec(runSpec(llama), 'actor')).toMatchObject({ lora: { rank: 2, alpha: 8, targets: ['q_proj', 'v_proj'], modulesToSave: ['lm_head'] } });
    const bad = (lora: string) => () => parseScenario(`model: { layers: 2, width: 64, heads: 4, lora: ${lora} }`, 'bad.yaml');
    expect(bad('{ rank: 0 }')).toThrow(/bad\.yaml[\s\S]*model\.lora\.rank/);
    expect(bad('{ rank: 65 }')).toThrow(/bad\.yaml[\s\S]*model\.lora\.rank: 65 is above the smaller side of attn\.wq \[64, 64\] \(64\)/);
    expect(bad('{ targets: [q_proj] }')).toThrow(/model\.lora\.targets: 'q_proj' is not a module of a gpt2 model; its linear layers are c_attn, c_proj, c_fc/);
    expect(bad('{ modules_to_save: [wte] }')).toThrow(/model\.lora\.modules_to_save: 'wte': expected lm_head/);
    expect(bad('{ dropout: 0.05 }')).toThrow(/model\.lora\.dropout: expected 0, got 0\.05/);
    expect(() => parseScenario('model: { layers: 2, width: 64, heads: 4, tied: true, lora: { modules_to_save: [lm_head] } }', 't.yaml')).toThrow(
      /'lm_head' is this model's token embedding \(a tied head\)/,
    );
  });

  it('the default plan puts actor, critic, reference, reward on devices 0, 1, 2, 3 (wrapping on small clusters)', () => {
    const plan = resolvePlan(parseScenario('{}', 'd.yaml'));
    const d = parseScenario('{}', 'd.yaml');
    const CALLS = Object.keys(plan);
    expect(CALLS.map((c) => plan[c]!.devices[0])).toEqual([0, 2, 3, 1, 0, 1]);
    expect(CALLS.map((c) => modelOf(d, c))).toEqual(['actor', 'reference', 'reward', 'critic', 'actor', 'critic']);
    const small = resolvePlan(parseScenario('cluster: {devices_per_node: 2}', 's.yaml'));
    // actor 0, critic 1, reference 2 % 2 = 0, reward 3 % 2 = 1
    expect(CALLS.map((c) => small[c]!.mesh)).toEqual(['0:0', '0:0', '0:1', '0:1', '0:0', '0:1']);
  });

  it('a plan that fits resolves to meshes and strategies', () => {
    const s = parseScenario('cluster: {nodes: 2, devices_per_node: 2}\nplan: {reward.inference: {mesh: "1:1"}}', 'ok.yaml');
    const plan = resolvePlan(s);
    expect(plan['reward.inference']).toEqual({ call: 'reward.inference', mesh: '1:1', devices: [3], dp: 1, tp: 1, pp: 1 });
  });
});

describe('scenarioJsonSchema', () => {
  const schema = scenarioJsonSchema() as {
    title: string;
    type: string;
    additionalProperties: unknown;
    properties: Record<string, { additionalProperties?: unknown; properties?: Record<string, { default?: unknown }> }>;
  };

  it('is closed at the top level and lists every section', () => {
    expect(schema.title).toBe('ferry scenario');
    expect(schema.type).toBe('object');
    expect(schema.additionalProperties).toBe(false);
    expect(Object.keys(schema.properties)).toEqual(expect.arrayContaining(['name', 'seed', 'backend', 'task', 'model', 'cluster', 'algorithm', 'plan', 'warmup', 'rl', 'reward', 'timeouts']));
  });

  it('describes rl, closed, with its defaults', () => {
    const ppo = schema.properties.rl!;
    expect(ppo.additionalProperties).toBe(false);
    expect(ppo.properties!.epochs!.default).toBe(2);
    expect(ppo.properties!.kl_coef!.default).toBe(0.02);
  });

  it('is plain JSON', () => {
    expect(JSON.parse(JSON.stringify(schema))).toEqual(schema);
  });
});

describe('loadScenario with a plan file', () => {
  const dir = mkdtempSync(join(tmpdir(), 'ferry-plan-file-'));
  const scenario = join(dir, 's.yaml');
  writeFileSync(scenario, 'name: s\nplan: {actor.generate: {mesh: "0:0"}}\n');

  it("replaces the scenario's plan, then validates the whole", () => {
    const plan = join(dir, 'p.yaml');
    writeFileSync(plan, 'plan:\n  actor.generate: {mesh: "0:2-3", tp: 2}\n');
    const s = loadScenario(scenario, plan);
    expect(s.plan).toEqual({ 'actor.generate': { mesh: '0:2-3', dp: 1, tp: 2, pp: 1 } });
    expect(s.rl.slots).toBe(0);
  });

  it('takes the slots of continuous generation the plan was priced with (npm run plan --write), held to the scenario checks', () => {
    const plan = join(dir, 'slots.yaml');
    writeFileSync(plan, 'plan:\n  actor.generate: {mesh: "0:2-3", tp: 2}\nslots: 24\n');
    expect(loadScenario(scenario, plan).rl.slots).toBe(24);
    writeFileSync(plan, 'plan:\n  actor.generate: {mesh: "0:2-3", pp: 2}\nslots: 24\n');
    expect(() => loadScenario(scenario, plan)).toThrow(/rl\.slots: 24, and plan\.actor\.generate has pp = 2/);
  });

  it('says what it expected of a plan file that is not one, and where the bad plan came from', () => {
    const bad = join(dir, 'bad.yaml');
    writeFileSync(bad, '- 1\n- 2\n');
    expect(() => loadScenario(scenario, bad)).toThrow(/bad\.yaml: expected a YAML map with a 'plan' key .*got an array of 2/);
    writeFileSync(bad, 'plan: {actor.generate: {mesh: "0:9"}}\n');
    expect(() => loadScenario(scenario, bad)).toThrow(/s\.yaml with the plan of .*bad\.yaml: the plan does not fit:\n  plan\.actor\.generate: mesh "0:9": device 9 is outside a node of 4/);
  });
});

describe('data: and model.from', () => {
  // A dataset, the arithmetic tokenizer, and a small llama-family checkpoint, in one directory.
  const dir = mkdtempSync(join(tmpdir(), 'ferry-scenario-data-'));
  writeFileSync(join(dir, 'train.jsonl'), `${JSON.stringify({ q: 'What is 2 + 3?', a: '5' })}\n${JSON.stringify({ q: 'What is 4 + 4?', a: '8' })}\n`);
  writeFileSync(join(dir, 'bad.jsonl'), `${JSON.stringify({ q: 'What is 2 + 3?', a: '5' })}\n{"q": "no answer"}\n`);
  for (const [name, text] of Object.entries(arithTokenizerFiles())) writeFileSync(join(dir, name), text);
  const config = { model_type: 'llama', vocab_size: 128, max_position_embeddings: 64, hidden_size: 16, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, intermediate_size: 24 };
  writeFileSync(join(dir, 'config.json'), JSON.stringify(config));
  writeFileSync(
    join(dir, 'model.safetensors'),
    encodeSafetensors(hfTensors(parseHfConfig(config)).map(({ name, shape }) => ({ name, shape, data: new Float32Array(shape.reduce((a, b) => a * b, 1)) }))),
  );
  const data = 'data: {train: train.jsonl, prompt_field: q, answer_field: a, prompt_tokens: 24, tokenizer: .}\ntask: {max_new_tokens: 8}\n';
  const parse = (text: string) => parseScenario(text, 'data.yaml', dir);
  const refused = (text: string) => {
    try {
      parse(text);
    } catch (e) {
      expect(e).toBeInstanceOf(ScenarioError);
      return (e as Error).message;
    }
    throw new Error(`accepted ${JSON.stringify(text)}`);
  };

  it('reads prompts from the dataset through the tokenizer, scored by the math verifier; paths are relative to the file', () => {
    const s = parse(data);
    expect(s.data!.train).toBe(join(dir, 'train.jsonl'));
    const task = taskOf(s);
    expect(task.name).toBe('data');
    expect([task.promptLen, task.responseLen, task.vocab]).toEqual([24, 8, 99]);
    expect(policySpec(s)).toMatchObject({ vocab: 99, context: 32, layers: 2, width: 64 });
    const llama = parse(`${data}model: {family: llama, heads: 4, kv_heads: 2, rope_theta: 500}`);
    expect(policySpec(llama)).toMatchObject({ family: 'llama', kvHeads: 2, ffn: 256, ropeTheta: 500 });
  });

  it('starts the policy from a checkpoint, whose config.json sets the shape and the vocabulary', () => {
    const s = parse(`${data}model: {from: .}`);
    expect(s.model.from).toBe(dir);
    expect(policySpec(s)).toMatchObject({ family: 'llama', vocab: 128, context: 64, layers: 2, width: 16, heads: 4, kvHeads: 2, ffn: 24 });
    expect(taskOf(s).vocab).toBe(128);
  });

  it('refuses, naming the key: a shape beside model.from, llama keys on gpt2, a rule that does not fit the prompts', () => {
    expect(refused(`${data}model: {from: ., layers: 4}`)).toMatch(
      /model\.layers: 4, but the checkpoint's config\.json sets the shape of a model that starts from model\.from \(its layers is 2\); leave layers out/,
    );
    // Its own values are no conflict: that is what scenario.json holds after a run.
    expect(parse(`${data}model: {from: ., layers: 2, family: llama}`).model).toMatchObject({ family: 'llama', layers: 2, width: 16, heads: 4, kv_heads: 2, ffn: 24 });
    expect(refused(`${data}model: {kv_heads: 2}`)).toMatch(/model\.kv_heads: only the llama family has it/);
    expect(refused('reward: {rule: math}')).toMatch(/reward\.rule: 'math' checks the answers of a dataset; this scenario has no data:/);
    expect(refused(`${data}reward: {rule: sort}`)).toMatch(/reward\.rule: a dataset's answers are checked by a verifier \(exact or math\); got 'sort'/);
    expect(refused(`${data}model: {family: llama, heads: 4, kv_heads: 3}`)).toMatch(/model: 4 query heads do not divide into 3 key\/value heads/);
    expect(refused(`${data}model: {family: llama, heads: 4, kv_heads: 2}\nplan: {actor.train: {mesh: "0:0-3", tp: 4}}`)).toMatch(/plan\.actor\.train: tp=4 must divide the model's 2 key\/value heads/);
  });

  it('refuses a dataset line without its field, a missing tokenizer, a context the checkpoint lacks, and demonstrations no call carries', () => {
    expect(refused(data.replace('train.jsonl', 'bad.jsonl'))).toMatch(/data\.train: .*bad\.jsonl:2: expected the answer field "a", the line has "q"/);
    expect(refused(data.replace('tokenizer: .', 'tokenizer: nowhere'))).toMatch(/data\.tokenizer: .*nowhere: expected tokenizer\.json, found none/);
    expect(refused(data.replace(', tokenizer: .', ''))).toMatch(/data\.tokenizer: a dataset is read through a tokenizer/);
    expect(refused(`${data.replace('max_new_tokens: 8', 'max_new_tokens: 48')}model: {from: .}`)).toMatch(/data\.prompt_tokens \+ task\.max_new_tokens: 24 \+ 48 = 72 positions; the model has 64/);
    expect(refused(`${data}rl: {batch: 4096}`)).toMatch(
      /rl\.batch: a train call of 4096 rows of 32 tokens, with their per-token data, is about 1048576 bytes, more than one call carries \(983040\); at most 3840 prompts per iteration/,
    );
    expect(refused(`${data}warmup: {demos: 10000}`)).toMatch(/warmup\.demos: 10000 demonstrations of 32 tokens are 1280000 bytes, more than one call carries .*; at most 7680/);
    expect(refused(data.replace('prompt_tokens: 24', 'prompt_tokens: 24, chat: true'))).toMatch(/data\.chat: .* has no chat_template in tokenizer_config\.json/);
  });
});
