// Guess the number, as a multi-turn environment on ferry's bus, in TypeScript: the secret is a
// digit drawn from the episode's seed; each wrong guess is answered "1" (higher) or "0" (lower), a
// guess that is not a digit with "|"; finding it at turn k pays max(0, 1 − 0.25·(k − 1)), not finding it
// within the turn budget pays 0. The policy speaks digits (the count task's vocabulary), so the
// observations are digits too. Its expert (binary search on the answers so far) plays the episodes
// the warm-up learns from.
//
// ferry starts it for scenarios/env/guess.yaml (environment.command) with the run's bus and
// credentials in FERRY_NATS_URL, FERRY_NATS_USER and FERRY_NATS_PASS; started by hand, point
// those at a run (its credentials.json's `environment`).
import { serveEnvironment, type EnvStepResult } from '../../engine/api.ts';

const env = await serveEnvironment<{ secret: number; turn: number }>({
  nats: process.env.FERRY_NATS_URL ?? 'nats://127.0.0.1:4222',
  user: process.env.FERRY_NATS_USER,
  pass: process.env.FERRY_NATS_PASS,
  name: process.env.FERRY_ENV_NAME ?? 'guess',
  instance: process.env.FERRY_ENV_INSTANCE,
  reset: (task) => ({ state: { secret: task.seed % 10, turn: 0 }, observation: '' }),
  step: (s, action): EnvStepResult => {
    s.turn += 1;
    const digit = action.match(/[0-9]/)?.[0];
    if (digit === undefined) return { observation: '|', done: false, info: { invalid: 1 } };
    const guess = Number(digit);
    if (guess === s.secret) return { observation: '', reward: Math.max(0, 1 - 0.25 * (s.turn - 1)), done: true, info: { found: 1, invalid: 0 } };
    return { observation: guess < s.secret ? '1' : '0', done: false, info: { invalid: 0 } };
  },
  // Binary search on what the policy sees (never the secret), for a warm-up to learn from.
  expert: ({ turns }) => {
    let [lo, hi] = [0, 9];
    for (const t of turns) {
      const g = Number(t.action.match(/[0-9]/)?.[0] ?? Number.NaN);
      if (t.observation === '1') lo = g + 1;
      else if (t.observation === '0') hi = g - 1;
    }
    return String(Math.floor((lo + hi) / 2));
  },
  log: (line) => process.stderr.write(`${line}\n`),
});

const stop = async () => {
  await env.stop();
  process.exit(0);
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
