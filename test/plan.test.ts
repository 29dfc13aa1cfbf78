// `npm run plan` as a real process: JSON and table output, named strategies, --write, usage
// errors, and the time budget on the 128-GPU scenario.
import { spawn } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { beforeAll, describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { loadScenario, parseScenario, planOnly, resolvePlan } from '../engine/runtime/scenario/scenario.ts';
import { PLACEMENTS } from '../engine/runtime/plan/planner.ts';
import { evaluationsFor } from '../engine/runtime/plan/search.ts';
import { ROOT, spawnTs, tempDir } from './helpers.ts';

const CLI = 'engine/cli/plan.ts';
const LLAMA7B = join(ROOT, 'scenarios/cluster/llama7b-8gpu.yaml');
const LLAMA70B = join(ROOT, 'scenarios/cluster/llama70b-128gpu.yaml');
/** PPO's calls, in its graph's order. */
const CALLS = ['actor.generate', 'reference.inference', 'reward.inference', 'critic.inference', 'actor.train', 'critic.train'];

interface Result {
  code: number | null;
  stdout: string;
  stderr: string;
}

/**
 * Runs the plan command. In the repository root by default (as `npm run plan` does); with `cwd`,
 * somewhere else, so that `profiles/local.json` is looked up there.
 */
async function plan(args: string[], cwd?: string): Promise<Result> {
  let stdout = '';
  let stderr = '';
  let exited: Promise<number | null>;
  if (cwd === undefined) {
    const p = spawnTs(CLI, args);
    p.child.stdout!.on('data', (b: Buffer) => (stdout += b.toString()));
    p.child.stderr!.on('data', (b: Buffer) => (stderr += b.toString()));
    exited = p.exited;
  } else {
    const tsx = pathToFileURL(createRequire(join(ROOT, 'package.json')).resolve('tsx')).href;
    const child = spawn(process.execPath, ['--import', tsx, join(ROOT, CLI), ...args], { cwd, stdio: ['ignore', 'pipe', 'pipe'] });
    child.stdout.on('data', (b: Buffer) => (stdout += b.toString()));
    child.stderr.on('data', (b: Buffer) => (stderr += b.toString()));
    exited = new Promise((r) => child.once('exit', (code) => r(code)));
  }
  const code = await exited;
  return { code, stdout, stderr };
}

interface PlanJson {
  scenario: string;
  device: string;
  devices: number;
  placement: string;
  feasible: boolean;
  why?: string;
  iteration_seconds: number;
  search_seconds: number;
  search_seed: number | null;
  plans_evaluated: number;
  calls: Record<string, { mesh: string; dp: number; tp: number; pp: number; seconds: number; realloc_seconds: number; memory_gb_per_device: number }>;
  baselines: Record<string, number | null>;
  lag: number;
  slots?: number;
  pools: { rollout: number[]; train: number[]; shared: boolean };
  estimated_period: number;
  sync_iteration_seconds: number;
  estimated_speedup: number;
  lags: Array<{ lag: number; slots?: number; iteration_seconds: number; feasible: boolean }>;
  asynchrony: string;
}

/** Exactly one JSON object on stdout. */
function json(r: Result): PlanJson {
  const lines = r.stdout.trim().split('\n');
  expect(lines, r.stdout + r.stderr).toHaveLength(1);
  return JSON.parse(lines[0]!) as PlanJson;
}

function expectShape(out: PlanJson) {
  expect(Object.keys(out.calls).sort()).toEqual([...CALLS].sort());
  for (const call of CALLS) {
    const c = out.calls[call]!;
    expect(typeof c.mesh).toBe('string');
    for (const k of ['dp', 'tp', 'pp'] as const) expect(Number.isInteger(c[k]) && c[k] >= 1, `${call}.${k}`).toBe(true);
    expect(c.seconds).toBeGreaterThanOrEqual(0);
    expect(c.realloc_seconds).toBeGreaterThanOrEqual(0);
    expect(c.memory_gb_per_device).toBeGreaterThanOrEqual(0);
  }
  expect(Object.keys(out.baselines).sort()).toEqual([...PLACEMENTS].sort());
  // Infeasible baselines have no time (Infinity, written as null in JSON).
  for (const n of PLACEMENTS) {
    const t = out.baselines[n];
    expect(t === null || (typeof t === 'number' && t > 0 && Number.isFinite(t)), `${n}: ${t}`).toBe(true);
  }
  expect(Object.values(out.baselines).some((t) => t !== null)).toBe(true);
}

/**
 * A hand-written profiles/local.json in `dir`, standing in for `npm run profile` (a clean clone
 * has none): a plan run there (`plan(args, dir)`) looks it up from its working directory.
 */
function writeLocalProfile(dir: string): void {
  mkdirSync(join(dir, 'profiles'));
  writeFileSync(
    join(dir, 'profiles', 'local.json'),
    JSON.stringify({
      name: 'local',
      flops: 2e10,
      memBandwidth: 1e10,
      memoryBytes: 2e9,
      intraBandwidth: 1e8,
      interBandwidth: 1e8,
      latency: 1e-4,
      layerOverhead: 1e-4,
      sharedCores: 2,
      source: 'hand-written for a test',
    }),
  );
}

/** The best finite baseline. */
const bestBaseline = (out: PlanJson) => Math.min(...Object.values(out.baselines).filter((t): t is number => t !== null));

/** The written plan: a `plan` key with six calls, each with mesh/dp/tp/pp, matching the JSON. */
function expectWritten(file: string, out: PlanJson) {
  const doc = parse(readFileSync(file, 'utf8')) as { plan: Record<string, { mesh: unknown; dp: unknown; tp: unknown; pp: unknown }> };
  expect(Object.keys(doc)).toEqual(['plan']);
  expect(Object.keys(doc.plan).sort()).toEqual([...CALLS].sort());
  for (const call of CALLS) {
    const p = doc.plan[call]!;
    expect(Object.keys(p).sort()).toEqual(['dp', 'mesh', 'pp', 'tp']);
    const c = out.calls[call]!;
    expect(p).toEqual({ mesh: c.mesh, dp: c.dp, tp: c.tp, pp: c.pp });
  }
}

describe('npm run plan for other algorithms', () => {
  it('plans a GRPO cluster scenario: its four calls only, every named placement, and a page drawn with --html', async () => {
    const dir = tempDir();
    const html = join(dir, 'grpo.html');
    const r = await plan([join(ROOT, 'scenarios/cluster/grpo-llama7b-8gpu.yaml'), '--budget', '1', '--max-lag', '0', '--json', '--html', html]);
    expect(r.code, r.stderr).toBe(0);
    const out = JSON.parse(r.stdout) as { calls: Record<string, unknown>; baselines: Record<string, number | null>; feasible: boolean };
    expect(Object.keys(out.calls)).toEqual(['actor.generate', 'reference.inference', 'reward.inference', 'actor.train']);
    expect(Object.keys(out.baselines).sort()).toEqual([...PLACEMENTS].sort());
    expect(out.feasible).toBe(true);
    const page = readFileSync(html, 'utf8');
    for (const call of Object.keys(out.calls)) expect(page).toContain(call);
    expect(page).not.toContain('critic');
  }, 120_000);

  it('--lose re-plans on the devices left: no lost device in the new plan, the move at the minimum bytes, the period before and after; --join takes a device back', async () => {
    const r = await plan([join(ROOT, 'scenarios/cluster/grpo-llama7b-8gpu.yaml'), '--budget', '1', '--max-lag', '0', '--lose', '6,7', '--remaining', '40', '--json']);
    expect(r.code, r.stderr).toBe(0);
    const out = JSON.parse(r.stdout) as {
      iteration_seconds: number;
      replan: {
        lost: number[];
        devices: number[];
        plan: Record<string, { mesh: string }>;
        period_before: number;
        period_after: number;
        migration_bytes_ratio: number;
        migration_seconds: number;
        remaining: number;
        objective_seconds: number;
      };
    };
    const rp = out.replan;
    expect(rp.lost).toEqual([6, 7]);
    expect(rp.devices).toEqual([0, 1, 2, 3, 4, 5]);
    expect(Object.keys(rp.plan)).toEqual(['actor.generate', 'reference.inference', 'reward.inference', 'actor.train']);
    // Device 6 is 0:6, device 7 is 0:7: no mesh of the new plan may reach them.
    for (const p of Object.values(rp.plan)) expect(p.mesh).not.toMatch(/^0:(6|7)$|^0:(0-7|4-7|6-7)$/);
    expect(rp.period_before).toBeCloseTo(out.iteration_seconds, 9);
    expect(rp.period_after).toBeGreaterThanOrEqual(rp.period_before * 0.999);
    expect(rp.migration_bytes_ratio).toBe(1);
    expect(rp.objective_seconds).toBeCloseTo(rp.migration_seconds + 40 * rp.period_after, 6);
    // A lost device whose worker joins again is taken back where it pays over the iterations left.
    const back = await plan([join(ROOT, 'scenarios/cluster/grpo-llama7b-8gpu.yaml'), '--budget', '1', '--max-lag', '0', '--join', '7', '--remaining', '50', '--json']);
    expect(back.code, back.stderr).toBe(0);
    const both = JSON.parse(back.stdout) as {
      replan: { lost: number[]; period_after: number };
      rejoin: { lost: number[]; changed: boolean; gain_seconds: number; migration_seconds: number; period_before: number; why: string };
    };
    expect(both.replan.lost).toEqual([7]);
    expect(both.rejoin.lost).toEqual([]);
    expect(both.rejoin.period_before).toBeCloseTo(both.replan.period_after, 9);
    expect(both.rejoin.changed).toBe(true);
    expect(both.rejoin.gain_seconds).toBeGreaterThan(both.rejoin.migration_seconds);
    expect(both.rejoin.why).toMatch(/^device\(s\) 7 joined and are used/);
    const bad = await plan([join(ROOT, 'scenarios/cluster/grpo-llama7b-8gpu.yaml'), '--budget', '1', '--max-lag', '0', '--lose', '8']);
    expect(bad.code).toBe(1);
    expect(bad.stderr).toContain('device 8: the cluster has devices 0-7');
    const syntax = await plan([join(ROOT, 'scenarios/cluster/grpo-llama7b-8gpu.yaml'), '--lose', 'five']);
    expect(syntax.code).toBe(2);
    expect(syntax.stderr).toContain('--lose: expected device numbers separated by commas');
  }, 120_000);

  it('refuses a plan key the algorithm lacks, listing the calls it has', async () => {
    const dir = tempDir();
    const file = join(dir, 'grpo.yaml');
    writeFileSync(file, 'algorithm: grpo\nplan:\n  critic.train: { mesh: "0:1" }\n');
    const r = await plan([file, '--placement', 'colocate', '--json']);
    expect(r.code).not.toBe(0);
    expect(r.stderr).toContain("plan.critic.train: 'grpo' has no call 'critic.train'; its calls are actor.generate, reference.inference, reward.inference, actor.train");
  }, 60_000);
});

describe('npm run plan', () => {
  it('--budget 2 --json prints one JSON object: placement, times, all six calls, all five baselines', async () => {
    const r = await plan([LLAMA7B, '--budget', '2', '--max-lag', '1', '--json']);
    expect(r.code, r.stderr).toBe(0);
    const out = json(r);
    expect(out.placement).toBe('search');
    expect(out.scenario).toBe('llama7b-8gpu');
    expect(out.devices).toBe(8);
    expect(out.feasible).toBe(true);
    expect(out.iteration_seconds).toBeGreaterThan(0);
    expect(Number.isFinite(out.iteration_seconds)).toBe(true);
    expect(out.plans_evaluated).toBeGreaterThan(PLACEMENTS.length);
    // One budget for the whole search: the lags it tries share it.
    expect(out.lags.map((l) => l.lag)).toEqual([0, 1]);
    expect(out.plans_evaluated).toBeLessThanOrEqual(evaluationsFor(2));
    expectShape(out);
    // The search starts from the named plans: it is never slower than the best of them.
    expect(out.iteration_seconds).toBeLessThanOrEqual(bestBaseline(out) * (1 + 1e-9));
  }, 120_000);

  it('--placement colocate --json --write returns the colocate plan and writes it as a scenario plan', async () => {
    const dir = tempDir('ferry-plan-');
    const file = join(dir, 'colocate.yaml');
    const r = await plan([LLAMA7B, '--placement', 'colocate', '--json', '--write', file]);
    expect(r.code, r.stderr).toBe(0);
    const out = json(r);
    expect(out.placement).toBe('colocate');
    expect(out.feasible).toBe(true);
    expect(out.iteration_seconds).toBe(out.baselines.colocate);
    expect(out.search_seconds).toBe(0);
    expectShape(out);
    // verl's colocation: one mesh for every model.
    for (const call of Object.keys(out.calls).filter((c) => c !== 'reward.inference')) expect(out.calls[call]!.mesh).toBe('0:0-7');
    expectWritten(file, out);
    // Merged into its scenario, the plan passes the scenario checks.
    const merged = `${readFileSync(LLAMA7B, 'utf8')}\n${readFileSync(file, 'utf8')}`;
    const s = parseScenario(merged, 'merged');
    const resolved = resolvePlan(s);
    for (const call of CALLS) {
      const c = out.calls[call]!;
      expect({ mesh: resolved[call].mesh, dp: resolved[call].dp, tp: resolved[call].tp, pp: resolved[call].pp }).toEqual({ mesh: c.mesh, dp: c.dp, tp: c.tp, pp: c.pp });
    }
  });

  it('prints a table per call, the iteration time and every named placement', async () => {
    const r = await plan([LLAMA7B, '--placement', 'interleaving']);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/placement interleaving/);
    for (const call of CALLS) expect(r.stdout).toMatch(new RegExp(`^${call.replace('.', '\\.')}\\s+\\S+\\s+\\d+/\\d+/\\d+\\s+[\\d.]+\\s+[\\d.]+\\s+[\\d.]+ GB$`, 'm'));
    expect(r.stdout).toMatch(/^iteration: [\d.]+ s \(estimated\)$/m);
    for (const n of PLACEMENTS) expect(r.stdout).toMatch(new RegExp(`^  ${n}\\s+(?:[\\d.]+ s|infeasible: .+)`, 'm'));
  });

  it('--write on a local scenario writes a plan that the scenario accepts and can run', async () => {
    // A local device needs a fitted profile (profiles/local.json, looked up from the working
    // directory): a hand-written one in a scratch directory stands in for `npm run profile`.
    const dir = tempDir('ferry-plan-local-');
    writeLocalProfile(dir);
    const scenario = join(dir, 'small-local.yaml');
    const text = 'name: small-local\ncluster: { nodes: 1, devices_per_node: 4, device: local }\nrl: { batch: 16 }\n';
    writeFileSync(scenario, text);
    const file = join(dir, 'plan.yaml');
    const r = await plan([scenario, '--budget', '1', '--max-lag', '0', '--json', '--write', file], dir);
    expect(r.code, r.stderr).toBe(0);
    const out = json(r);
    expect(out.device).toBe('local');
    expect(out.feasible).toBe(true);
    expectShape(out);
    expect(out.iteration_seconds).toBeLessThanOrEqual(bestBaseline(out) * (1 + 1e-9));
    expectWritten(file, out);
    const s = parseScenario(`${text}${readFileSync(file, 'utf8')}`, 'merged');
    expect(planOnly(s)).toBeUndefined();
    const resolved = resolvePlan(s);
    for (const call of CALLS) expect(resolved[call].mesh).toBe(out.calls[call]!.mesh);
    expect(resolved['reward.inference'].devices).toHaveLength(1);
  });

  it('a local scenario without a fitted profile fails and says how to make one', async () => {
    const dir = tempDir('ferry-plan-noprofile-');
    const scenario = join(dir, 'small-local.yaml');
    writeFileSync(scenario, 'cluster: { nodes: 1, devices_per_node: 4, device: local }\n');
    const r = await plan([scenario, '--placement', 'colocate', '--json'], dir);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/ProfileError: .*profiles\/local\.json.*npm run profile/);
    expect(r.stdout).toBe('');
  });

  it('a bad --placement exits with code 2 and names the allowed ones', async () => {
    const r = await plan([LLAMA7B, '--placement', 'bogus', '--json']);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/bogus/);
    for (const n of ['search', ...PLACEMENTS]) expect(r.stderr).toContain(n);
    expect(r.stdout).toBe('');
  });

  it('a bad --budget or a missing file is refused', async () => {
    const zero = await plan([LLAMA7B, '--budget', '0']);
    expect(zero.code).toBe(2);
    expect(zero.stderr).toMatch(/--budget/);
    const missing = await plan([join(ROOT, 'scenarios/cluster/no-such-file.yaml'), '--json']);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toMatch(/no-such-file\.yaml/);
  });

  it('a scenario in flight on a named placement: priced at its own η against the same placement lock-step, each generation with its switch', async () => {
    const dir = tempDir('ferry-plan-inflight-');
    // A scenario in flight, on a named placement (priced at its own η: this crashed before): the
    // switch's pause per generation. Its devices are local: a hand-written profile stands in for
    // `npm run profile` (a clean clone has none), looked up from the scratch directory.
    writeLocalProfile(dir);
    const named = await plan([join(ROOT, 'scenarios/inflight.yaml'), '--placement', 'separation', '--json'], dir);
    expect(named.code, named.stderr).toBe(0);
    const n = json(named) as ReturnType<typeof json> & { calls: Record<string, { switch_seconds?: number }> };
    expect(n.asynchrony).toMatch(/^the scenario's own rl\.staleness 1, in flight \(rl\.inflight_kv keep\), at which a named placement is priced: \d+\.\d\d× the same placement lock-step$/);
    expect(n.calls['actor.generate']!.switch_seconds).toBeCloseTo(4 * 1e-4, 12);
    expect(n.calls['actor.train']!.switch_seconds).toBeUndefined();
  });

  it('chooses the lag too: the best plan at each lag, the pools, and asynchrony only where it pays; --write keeps the lag for --plan', async () => {
    const dir = tempDir('ferry-plan-lag-');
    const file = join(dir, 'plan.yaml');
    const scenario = join(ROOT, 'scenarios/cluster/grpo-llama7b-8gpu.yaml');
    const r = await plan([scenario, '--budget', '1', '--max-lag', '1', '--json', '--write', file]);
    expect(r.code, r.stderr).toBe(0);
    const out = json(r);
    expect(out.lags.map((l) => l.lag)).toEqual([0, 1]);
    expect(out.sync_iteration_seconds).toBe(out.lags[0]!.iteration_seconds);
    expect(out.estimated_period).toBe(out.iteration_seconds);
    expect(out.estimated_period).toBe(out.lags.find((l) => l.lag === out.lag)!.iteration_seconds);
    if (out.lag > 0) {
      expect(out.estimated_speedup).toBeCloseTo(out.sync_iteration_seconds / out.estimated_period, 12);
      expect(out.estimated_speedup).toBeGreaterThanOrEqual(1.1);
      expect(Object.keys(out.calls)).toContain('actor.prox');
    } else expect(out.estimated_speedup).toBe(1);
    expect(out.asynchrony).toMatch(out.lag > 0 ? /^lag \d is/ : /^lock-step kept/);
    expect(out.pools.rollout.length).toBeGreaterThan(0);
    expect(out.pools.train.length).toBeGreaterThan(0);
    expect(out.pools.shared).toBe(out.pools.rollout.some((d) => out.pools.train.includes(d)));
    const written = parse(readFileSync(file, 'utf8')) as { lag?: number };
    expect(written.lag ?? 0).toBe(out.lag);
    const s = loadScenario(scenario, file);
    expect(s.rl.lag).toBe(out.lag);
    // Lock-step only, on request.
    const sync = json(await plan([scenario, '--budget', '1', '--json', '--max-lag', '0']));
    expect(sync.lag).toBe(0);
    expect(sync.lags.map((l) => l.lag)).toEqual([0]);
    const bad = await plan([scenario, '--max-lag', 'two']);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/--max-lag: expected a whole number >= 0, got two/);
  }, 120_000);

  describe('on the 128-GPU scenario with --budget 3', () => {
    let r: Result;
    let out: PlanJson;
    let file: string;
    beforeAll(async () => {
      file = join(tempDir('ferry-plan-128-'), 'plan.yaml');
      r = await plan([LLAMA70B, '--budget', '3', '--max-lag', '0', '--json', '--write', file]);
      out = json(r);
    }, 180_000);

    it('finds a feasible plan no slower than the named ones', () => {
      expect(r.code, r.stderr).toBe(0);
      expect(out.devices).toBe(128);
      expect(out.feasible).toBe(true);
      expectShape(out);
      expect(out.iteration_seconds).toBeLessThanOrEqual(bestBaseline(out) * (1 + 1e-9));
    });

    it('keeps the search within its budget of evaluations, and says which seed it used', () => {
      // A budget of 3 s is 3 × EVALUATIONS_PER_SECOND plans, however fast the machine is today.
      expect(out.plans_evaluated).toBeGreaterThan(0);
      expect(out.plans_evaluated).toBeLessThanOrEqual(evaluationsFor(3));
      expect(out.search_seed).toBe(1);
    });

    it('writes whole-node meshes that its scenario accepts', () => {
      expectWritten(file, out);
      const s = parseScenario(`${readFileSync(LLAMA70B, 'utf8')}\n${readFileSync(file, 'utf8')}`, 'merged');
      expect(() => resolvePlan(s)).not.toThrow();
    });
  });
});
