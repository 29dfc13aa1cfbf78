// Elastic runs, end to end over a real NATS server with worker processes: a device lost for good —
// by a chaos event, past the restart intensity, not back within the grace period, or cordoned by
// an operator — and the run re-plans onto the devices left, restores its last snapshot there
// (the parameters checked bit for bit), and succeeds, no rollout lost or trained twice. A run
// that lost a device ends where the same run, stopped before the re-plan's iteration and resumed
// from that checkpoint on the new plan, ends.
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { runChaos } from '../engine/cli/chaos-run.ts';
import { launch } from '../engine/cli/launch.ts';
import { loadScenario } from '../engine/runtime/scenario/scenario.ts';
import type { Summary } from '../engine/runtime/index.ts';
import { unfiredProblem } from '../engine/supervision/index.ts';
import { ROOT, spawnTs, tempDir } from './helpers.ts';

const quiet = { phase() {}, iteration() {}, stop() {} };

/** scenarios/elastic.yaml's run without its chaos section, with `extra` appended. */
function elastic(dir: string, name: string, extra: string, iterations = 6, batch = 32): string {
  const text = readFileSync(join(ROOT, 'scenarios', 'elastic.yaml'), 'utf8')
    .replace(/^chaos:[\s\S]*$/m, '')
    .replace(/rl: \{ iterations: \d+, batch: 32 \}/, `rl: { iterations: ${iterations}, batch: ${batch} }`)
    .replace('name: elastic', `name: ${name}`);
  const file = join(dir, `${name}.yaml`);
  writeFileSync(file, `${text}\n${extra}\n`);
  return file;
}

const meshes = (plan: Record<string, { mesh: string }>) => Object.values(plan).map((p) => p.mesh);

describe('elastic runs', () => {
  it('scenarios/elastic.yaml: device 3 lost for good in iteration 3, the supervisor killed in the migration, a worker back for device 3 later; the run ends where a resume on the new plan ends, and an event that cannot fire is named', async () => {
    const dir = tempDir();
    // The scenario's own events, and the supervisor killed while it restores the snapshot onto the
    // new plan: the one that takes the run over reads the decision written ahead, and migrates again.
    // And an event that can never fire: device 3 lost again in iteration 6, when it is gone already.
    const chaos = readFileSync(join(ROOT, 'scenarios', 'elastic.yaml'), 'utf8').match(/^chaos:[\s\S]*$/m)![0];
    const events = chaos
      .replace('  kills:\n', '  kills:\n    - { actor: supervisor, call: restore, iteration: -1 }\n')
      .replace('    - { lose: 3, call: generate, iteration: 3 }\n', '    - { lose: 3, call: generate, iteration: 3 }\n    - { lose: 3, call: generate, iteration: 6 }\n')
      // The scenario's join after iteration 17 keeps its measured period clear of a worker's start;
      // here fewer: back after iteration 5, of 24 (the worker's start and the boundary it is offered at
      // must come before the run ends: with 16, a worker slow to start on a busy machine missed it).
      .replace(/- \{ device: 3, iteration: 18 \}/, '- { device: 3, iteration: 6 }');
    expect(events).toMatch(/device: 3, iteration: 6/);
    const scenario = loadScenario(elastic(dir, 'elastic', events, 24));
    const report = await runChaos(scenario, join(dir, 'chaos'));
    const log = readFileSync(join(report.runs.chaos, 'logs', 'supervisor.log'), 'utf8');
    expect(report.chaos.status, `${report.chaos.error}\n${log}`).toBe('succeeded');
    expect(report.reference).toBe('resumed on each re-plan');
    expect(report.clean.status).toBe('succeeded');
    expect(report.digests_equal).toBe(true);
    expect(report.rollouts_lost).toBe(0);
    expect(report.rollouts_duplicated).toBe(0);
    expect(report.parameters_equal_after_migration).toBe(true);
    expect(report.kills_by_actor).toEqual({ device: 1, supervisor: 1 });
    // The event that could not fire is named, with why, and fails the chaos run (it is not optional).
    expect(report.unfired).toEqual([
      {
        event: 'chaos.kills[2]',
        id: 'k2',
        expected: "device 3 lost for good in 'generate' of iteration 6",
        why: 'device 3 was lost for good at the re-plan of iteration 3 (chaos: device(s) 3 lost)',
        optional: false,
      },
    ]);
    expect(unfiredProblem(report.unfired)).toMatch(/^1 chaos event\(s\) never fired that the scenario does not mark optional \(chaos\.kills\[2\]\)/);
    expect(JSON.parse(readFileSync(join(report.runs.chaos, 'chaos.json'), 'utf8')).unfired).toEqual(report.unfired);
    const [r, back] = report.replans!;
    expect(report.replans).toHaveLength(2);
    expect(r).toMatchObject({ iteration: 3, trigger: 'chaos', lost: [3], joined: [], changed: true, parameters_equal_after_migration: true });
    // The worker that came back was offered to the planner at a boundary, and the decision says why, with both estimates.
    expect(back).toMatchObject({ trigger: 'join', lost: [], joined: [3] });
    expect(back!.iteration).toBeGreaterThan(5);
    expect(back!.why).toMatch(back!.changed ? /device\(s\) 3 joined and are used: they save [\d.]+ s over \d+ iterations, more than the migration's/ : /device\(s\) 3 joined and are left idle/);
    expect(meshes(r!.plan_before)).toContain('0:3');
    for (const mesh of meshes(r!.plan_after)) expect(['0:0', '0:1', '0:2', '0:0-1']).toContain(mesh);
    expect(r!.plans_evaluated).toBeGreaterThan(0);
    expect(r!.migration_bytes).toBeGreaterThan(0);
    expect(r!.measured_period_after).toBeGreaterThan(0);
    expect(report.migration_bytes_ratio).toBe(r!.migration_bytes! / r!.migration_minimum_bytes!);
    // Taken over mid-migration: the devices the first supervisor had moved already are sent nothing again.
    expect(report.migration_bytes_ratio).toBeLessThanOrEqual(1);
    // The decision was written ahead: the supervisor that took over migrated onto it.
    const logs = join(report.runs.chaos, 'logs');
    const takenOver = readdirSync(logs).filter((f) => /^supervisor\.\d+\.log$/.test(f));
    expect(takenOver.map((f) => readFileSync(join(logs, f), 'utf8')).join('\n')).toMatch(/taking over the migration onto devices 0, 1, 2 \(the plan written ahead\)/);
    const summary = JSON.parse(readFileSync(join(report.runs.chaos, 'summary.json'), 'utf8')) as Summary;
    expect(summary.lost).toEqual([3]);
    // The report draws each re-plan: its figures, and the plan before and after.
    const html = readFileSync(join(report.runs.chaos, 'report.html'), 'utf8');
    expect(html).toMatch(/<section id="replans" data-items="2">/);
    expect(html).toMatch(/<h3>1\. Iteration 3: chaos, device\(s\) 3 lost<\/h3>.*<p>Before:<\/p><svg.*<p>After:<\/p><svg/s);
    expect(html).toMatch(/parameters equal after the migration<\/th><td>true/);
    expect(html).toMatch(/<h3>Events that never fired<\/h3>.*<td>chaos\.kills\[2\]<\/td><td>device 3 lost for good in 'generate' of iteration 6<\/td>/s);
    expect(summary.plan).toEqual(back!.changed ? back!.plan_after : r!.plan_after);
  }, 300_000);

  it.each([
    {
      trigger: 'intensity',
      // Two deaths of device 3's worker within a minute: one more than supervision.intensity allows.
      extra: 'supervision: { intensity: 1, period_seconds: 60 }\nchaos:\n  kills:\n    - { actor: reward, call: inference, iteration: 1 }\n    - { actor: reward, call: inference, iteration: 2 }',
    },
    {
      trigger: 'grace',
      // Workers are never restarted: device 3's does not come back within elastic.grace_seconds.
      extra: 'supervision: { restart: { worker: temporary } }\nchaos:\n  kills:\n    - { actor: reward, call: inference, iteration: 1 }',
    },
  ])(
    'a device lost for good by $trigger: re-planned without it, and the run succeeds',
    async ({ trigger, extra }) => {
      const dir = tempDir();
      const file = elastic(dir, `lost-by-${trigger}`, extra);
      // Only the grace case waits briefly: the other must not lose the device to a slow restart first.
      const grace = trigger === 'grace' ? 2 : 120;
      writeFileSync(file, readFileSync(file, 'utf8').replace('elastic: { grace_seconds: 20, search_seconds: 1 }', `elastic: { grace_seconds: ${grace}, search_seconds: 1 }`));
      const out = join(dir, 'run');
      const res = await launch({ scenario: loadScenario(file), run: `${trigger}${Date.now()}`, out, progress: quiet, say: () => {} });
      const log = readFileSync(join(out, 'logs', 'supervisor.log'), 'utf8');
      expect(res.code, log).toBe(0);
      const s = res.summary!;
      expect(s.iterations).toBe(6);
      expect(s.replans).toHaveLength(1);
      expect(s.replans![0]).toMatchObject({ trigger, lost: [3], parameters_equal_after_migration: true });
      // Each device was sent only what it lacked: the least any migration could send.
      expect(s.replans![0]!.migration_bytes).toBe(s.replans![0]!.migration_minimum_bytes);
      expect(s.rollouts).toMatchObject({ lost: 0, duplicated: 0 });
      for (const mesh of meshes(s.plan)) expect(mesh).not.toMatch(/3/);
    },
    180_000,
  );

  it('npm run cordon: an operator takes a device out of a running run; bad requests are refused, named, and change nothing', async () => {
    const dir = tempDir();
    const out = join(dir, 'run');
    const cordon = async (...argv: string[]) => {
      const p = spawnTs('engine/cli/cordon.ts', argv);
      return { code: await p.exited, output: p.output() };
    };
    // Refused whatever runs: no run there, a device that is not a number (asked while the run starts).
    const refusals = Promise.all([cordon(join(dir, 'nowhere'), '1'), cordon(out, 'two')]);
    // Many short iterations (8 prompts each): the run goes on while the two requests' processes start.
    const running = launch({ scenario: loadScenario(elastic(dir, 'cordoned', '', 50, 8)), run: `cordon${Date.now()}`, out, progress: quiet, say: () => {} });
    const [missing, two] = await refusals;
    expect(missing.code).not.toBe(0);
    expect(missing.output).toMatch(/nowhere\/bus\.json: not found; expected the run's bus/);
    expect(two.code).not.toBe(0);
    expect(two.output).toMatch(/DEVICE: expected a device number \(e\.g\. 3\), got "two"/);
    const metrics = join(out, 'metrics.jsonl');
    const deadline = Date.now() + 120_000;
    while (!(existsSync(metrics) && readFileSync(metrics, 'utf8').trim().split('\n').length >= 1) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
    // Both asked at once, while the run goes on (each a process of its own, which takes a while
    // to start on a busy machine): a device the run does not have is refused, whichever comes first.
    const [bad, ok] = await Promise.all([cordon(out, '9'), cordon(out, '2', '--reason', 'maintenance')]);
    expect(bad.code).toBe(1);
    expect(bad.output).toMatch(/refused: device 9 is not one of this run's devices \((0, 1, 2, 3|0, 1, 3)\)/);
    expect(ok.code, ok.output).toBe(0);
    expect(ok.output).toMatch(/device 2 is out of run \S+: it re-plans onto devices 0, 1, 3/);
    const res = await running;
    expect(res.code, readFileSync(join(out, 'logs', 'supervisor.log'), 'utf8')).toBe(0);
    const s = res.summary!;
    expect(s.iterations).toBe(50);
    expect(s.replans).toHaveLength(1);
    expect(s.replans![0]).toMatchObject({ trigger: 'cordon', lost: [2], reason: 'maintenance', parameters_equal_after_migration: true });
    // Drained (the iteration it came in ended and was snapshotted first): the devices left kept their shards.
    expect(s.replans![0]!.migration_bytes).toBe(s.replans![0]!.migration_minimum_bytes);
    expect(s.rollouts).toMatchObject({ lost: 0, duplicated: 0 });
    for (const mesh of meshes(s.plan)) expect(['0:0', '0:1', '0:3', '0:0-1']).toContain(mesh);
  }, 300_000);
});
