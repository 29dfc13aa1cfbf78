// npm run scenario -- --replay RUN_DIR: a free-running run (rl.staleness) again, on the schedule
// it recorded — which policy version generated which iteration's rollouts — without timing. Its
// summary says the schedule (staleness.versions) and the digests the replay must end with.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { UsageError } from '../../actors/host.ts';
import { ALGORITHM_NAMES, BUS_DIGEST, digestAlgorithm, shortDigest } from '../../mesh/wire/index.ts';

import { loadScenarioFile, type Scenario, type Summary } from '../runtime/index.ts';

/** The protocol version whose summaries first recorded BLAKE3 digests (SHA-256 before). */
const BLAKE3_SINCE = 7;

export interface Replay {
  scenario: Scenario;
  /** The recorded run's digests: what the replay ends with. */
  digests: Record<string, string>;
}

/** The scenario of `dir`'s run with its recorded schedule (rl.versions), written to `out`. */
export async function replayOf(dir: string, out: string): Promise<Replay> {
  const summaryFile = join(dir, 'summary.json');
  const scenarioFile = join(dir, 'scenario.json');
  if (!existsSync(scenarioFile) || !existsSync(summaryFile))
    throw new UsageError(`--replay: expected a run directory with scenario.json and summary.json, ${dir} has ${existsSync(scenarioFile) ? 'no summary.json' : 'no scenario.json'}`);
  const summary = JSON.parse(readFileSync(summaryFile, 'utf8')) as Partial<Summary>;
  const raw = JSON.parse(readFileSync(scenarioFile, 'utf8')) as { rl?: { staleness?: number; lag?: number; iterations?: number } };
  if (!raw.rl?.staleness) {
    throw new UsageError(
      `--replay: ${dir} is not a free-running run (its rl.staleness is ${raw.rl?.staleness ?? 0}); ${raw.rl?.lag ? `a lagged run's schedule is a function of rl.lag, so running its scenario again replays it: npm run scenario -- ${scenarioFile}` : 'a lock-step run replays by running its scenario again'}`,
    );
  }
  if (summary.status !== 'succeeded' || !summary.digests)
    throw new UsageError(`--replay: ${dir}'s run did not succeed (status ${summary.status ?? 'missing'}); only a finished run has the digests a replay must end with`);
  // A replay's digests are this ferry's (BLAKE3, named in each); a run recorded with another
  // algorithm's (SHA-256 alone, before protocol version 7) could never be found equal.
  const other = Object.entries(summary.digests).filter(([, d]) => digestAlgorithm(d) !== BUS_DIGEST);
  if (other.length) {
    const named = other.map(([model, d]) => {
      const algorithm = digestAlgorithm(d);
      return `${model}: ${algorithm ? shortDigest(d) : `${JSON.stringify(d)}, no digest`}`;
    });
    const algorithms = [...new Set(other.map(([, d]) => digestAlgorithm(d)))].map((a) => (a ? ALGORITHM_NAMES[a] : 'unknown'));
    throw new UsageError(
      `--replay: ${summaryFile} records its models' digests in ${algorithms.join(' and ')} (${named.join('; ')}), not in ${ALGORITHM_NAMES[BUS_DIGEST]}, which this ferry writes (since protocol version ${BLAKE3_SINCE}; SHA-256 before): a replay's digests could never equal them. Replay it with the ferry that ran it, or run its scenario again (npm run scenario -- ${scenarioFile}) to record a run this one can replay`,
    );
  }
  const versions = summary.staleness?.versions;
  if (!Array.isArray(versions)) throw new UsageError(`--replay: ${summaryFile} has no staleness.versions (the schedule the run recorded)`);
  // The recorded run's resolved scenario with its schedule; the launcher validates it like any.
  mkdirSync(out, { recursive: true });
  const file = join(out, 'scenario.json');
  // In flight, the passes its generations switched version at, too.
  const switches = summary.staleness?.switches;
  writeFileSync(file, `${JSON.stringify({ ...raw, rl: { ...raw.rl, versions, ...(switches ? { switches } : {}) } }, null, 2)}\n`);
  return { scenario: await loadScenarioFile(file), digests: summary.digests };
}

/** Whether the replay ended where the recorded run did, model by model. */
export function replayVerdict(recorded: Record<string, string>, replayed: Record<string, string> | undefined): { equal: boolean; lines: string[] } {
  const models = [...new Set([...Object.keys(recorded), ...Object.keys(replayed ?? {})])].sort();
  const lines = models.map((m) => {
    const a = recorded[m];
    const b = replayed?.[m];
    return `${m}: ${a === b ? `equal (${shortDigest(a!)})` : `DIFFERENT: recorded ${a === undefined ? 'none' : shortDigest(a)}, replayed ${b === undefined ? 'none' : shortDigest(b)}`}`;
  });
  return { equal: models.length > 0 && models.every((m) => recorded[m] === replayed?.[m]), lines };
}
