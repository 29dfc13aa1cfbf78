// A calculator as a tool, on ferry's bus: the policy may end an action with a call such as
// `<calc>37 * 12</calc>` (the scenario's stop string ends the action there), and the calculator
// answers `<result>444</result>`, which the policy reads and goes on from. An action without a call
// is the final answer: the episode ends, and the task's verifier (the math rule) scores what follows
// `####`. The calculator pays nothing itself; it only answers.
//
// ferry starts it for scenarios/env/calculator.yaml (environment.command); started by hand, set
// FERRY_NATS_URL, FERRY_NATS_USER and FERRY_NATS_PASS from a run's credentials.json (`environment`).
import { serveEnvironment, type EnvStepResult } from '../../engine/api.ts';

/** The value of `a op b` with integers and + − × ÷ (exact division only), or undefined. */
export function calculate(expression: string): number | undefined {
  const m = expression.match(/^\s*(-?\d{1,9})\s*([-+*/x×÷])\s*(-?\d{1,9})\s*$/);
  if (!m) return undefined;
  const [a, b] = [Number(m[1]), Number(m[3])];
  switch (m[2]) {
    case '+':
      return a + b;
    case '-':
      return a - b;
    case '*':
    case 'x':
    case '×':
      return a * b;
    default:
      return b !== 0 && a % b === 0 ? a / b : undefined;
  }
}

export function answer(action: string): EnvStepResult {
  const call = action.match(/<calc>([^<]*)<\/calc>\s*$/);
  if (!call) return { observation: '', done: true, info: { calls: 0 } };
  const value = calculate(call[1]!);
  return { observation: `<result>${value ?? 'error'}</result>`, done: false, info: { calls: 1, errors: value === undefined ? 1 : 0 } };
}

if (process.env.FERRY_NATS_URL !== undefined || process.argv.includes('--serve')) {
  const env = await serveEnvironment<Record<string, never>>({
    nats: process.env.FERRY_NATS_URL ?? 'nats://127.0.0.1:4222',
    user: process.env.FERRY_NATS_USER,
    pass: process.env.FERRY_NATS_PASS,
    name: process.env.FERRY_ENV_NAME ?? 'calculator',
    instance: process.env.FERRY_ENV_INSTANCE,
    reset: () => ({ state: {}, observation: '' }),
    step: (_s, action) => answer(action),
    log: (line) => process.stderr.write(`${line}\n`),
  });
  const stop = async () => {
    await env.stop();
    process.exit(0);
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}
