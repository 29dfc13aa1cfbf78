// npm run scenario [-- FILE] [--plan PLAN.yaml] [--resume RUN_DIR] [--replay RUN_DIR] [--out DIR] [--nats URL] [--workers N] [--backend NAME]
// Runs a scenario: a private NATS server (unless NATS_URL or --nats names one), the supervisor
// and one worker process per device. Exit code 0 only when the run succeeded.
import { basename, join } from 'node:path';
import { runId } from '../../mesh/wire/index.ts';
import { BACKENDS } from '../model/index.ts';
import { loadScenarioFile, planOnly, stalenessLine } from '../runtime/index.ts';
import { UsageError, args, runMain } from '../../actors/host.ts';
import { describeUnfired } from '../supervision/index.ts';
import { launch } from './launch.ts';
import { replayOf, replayVerdict } from './replay.ts';

const USAGE = `usage: npm run scenario [-- FILE] [--plan PLAN.yaml] [--resume RUN_DIR] [--replay RUN_DIR] [--out DIR] [--nats URL] [--workers N] [--backend ${BACKENDS.join('|')}] [--open]
  FILE       scenario file (default scenarios/quickstart.yaml)
  --plan     a plan (as npm run plan --write writes it) that replaces the scenario's
  --resume   a run directory to go on from its last checkpoint (FILE defaults to its scenario.json)
  --replay   a free-running run's directory (rl.staleness) to run again on the schedule it recorded,
             without timing, into a new directory; exits 0 only when it ends with the same digests
  --out      run directory (default runs/<scenario>-<timestamp>)
  --nats     NATS server to use (default: $NATS_URL, else a private nats-server)
  --workers  worker processes to start here (default: one per device; others join with npm run worker)
  --backend  TensorFlow.js backend for the workers started here (default: the scenario's)
  --open     an open bus: the private server takes connections without credentials (by default it
             requires per-role ones, written to DIR/credentials.json)`;

runMain(async () => {
  const { values, positionals } = args(USAGE, {
    out: { type: 'string' },
    plan: { type: 'string' },
    resume: { type: 'string' },
    replay: { type: 'string' },
    nats: { type: 'string' },
    workers: { type: 'string' },
    backend: { type: 'string' },
    open: { type: 'boolean', default: false },
  });
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  if (positionals.length > 1) throw new UsageError(`expected one scenario file, got ${positionals.length}: ${positionals.join(' ')}\n${USAGE}`);
  if (values.replay !== undefined && (positionals.length || values.resume || values.plan))
    throw new UsageError(`--replay runs the recorded run's own scenario and plan; it takes no FILE, --plan or --resume\n${USAGE}`);
  const file = positionals[0] ?? (values.resume ? join(values.resume, 'scenario.json') : 'scenarios/quickstart.yaml');
  if (values.backend !== undefined && !(BACKENDS as readonly string[]).includes(values.backend)) {
    throw new UsageError(`--backend: expected one of ${BACKENDS.join(', ')}, got ${values.backend}`);
  }
  const workers = values.workers === undefined ? undefined : Number(values.workers);
  if (workers !== undefined && !(Number.isInteger(workers) && workers >= 0)) {
    throw new UsageError(`--workers: expected a whole number >= 0, got ${values.workers}`);
  }
  const replayOut = values.replay !== undefined ? (values.out ?? join('runs', runId(`replay-${basename(values.replay)}`))) : undefined;
  const replay = values.replay !== undefined ? await replayOf(values.replay, replayOut!) : undefined;
  const scenario = replay?.scenario ?? (await loadScenarioFile(file, values.plan));
  const planning = planOnly(scenario);
  if (planning) throw new UsageError(`${file} is a scenario to plan, not to run here: ${planning}. Plan it with: npm run plan -- ${file}`);
  const run = runId(scenario.name ?? 'run');
  if (values.resume && values.out && values.out !== values.resume) throw new UsageError(`--resume goes on in its own run directory; --out ${values.out} differs from ${values.resume}`);
  const out = replayOut ?? values.resume ?? values.out ?? join('runs', run);
  console.log(
    replay
      ? `ferry: replaying ${values.replay} on its recorded schedule (versions ${scenario.rl.versions!.join(' ')}), run ${run}, output in ${out}`
      : `ferry: scenario ${file}, run ${run}, output in ${out}`,
  );
  const t0 = Date.now();
  const result = await launch({
    scenario,
    run,
    out,
    natsUrl: values.nats ?? process.env.NATS_URL,
    workers,
    backend: values.backend,
    resume: values.resume !== undefined,
    open: values.open,
  });
  const s = result.summary;
  const secs = ((Date.now() - t0) / 1000).toFixed(1);
  if (s) {
    const r = (x: number | null) => (x === null ? 'n/a' : x.toFixed(3));
    console.log(`${s.status}: ${s.iterations} iterations in ${secs} s on ${s.backend}; reward ${r(s.reward_first5)} (first 5) -> ${r(s.reward_last5)} (last 5)${s.error ? `\nerror: ${s.error}` : ''}`);
    // Asynchrony: how old the rollouts were when trained on; in flight, their tokens too.
    if (s.staleness) console.log(stalenessLine(s.staleness));
  } else {
    console.log(`failed after ${secs} s: no summary was written (see ${join(out, 'logs')})`);
  }
  const chaos = result.chaos;
  const events = chaos.kills.length + chaos.joins.length + chaos.unfired.length;
  if (events > 0) {
    console.log(
      `chaos: ${events - chaos.unfired.length} of ${events} event(s) fired${chaos.unfired.length ? `; never fired:\n${chaos.unfired.map((u) => `  ${describeUnfired(u)}`).join('\n')}` : ''}`,
    );
  }
  console.log(`run directory: ${out}`);
  if (result.code === 130) return 130;
  const ok = result.code === 0 && s?.status === 'succeeded';
  if (replay && ok) {
    const verdict = replayVerdict(replay.digests, s?.digests);
    console.log(`replay of ${values.replay}: ${verdict.equal ? 'the same digests' : 'the digests differ'}\n  ${verdict.lines.join('\n  ')}`);
    return verdict.equal ? 0 : 1;
  }
  return ok ? 0 : 1;
});
