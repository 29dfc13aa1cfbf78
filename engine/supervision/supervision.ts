// Supervision in Erlang/OTP's terms, as pure functions: which exits a restart policy restarts,
// which processes a strategy restarts with a dead one, and the intensity past which a supervisor
// stops restarting and escalates. The launcher applies them to processes, the supervisor machine
// to recoveries.
import type { POLICIES, STRATEGIES } from '../runtime/index.ts';

export type Policy = (typeof POLICIES)[number];
export type Strategy = (typeof STRATEGIES)[number];

export interface Exit {
  code: number | null;
  signal: string | null;
}

export const abnormal = (e: Exit) => e.signal !== null || e.code !== 0;

export function describeExit(e: Exit): string {
  return e.signal !== null ? `killed by ${e.signal}` : `exited with code ${e.code}`;
}

/** permanent: always; transient: after an abnormal exit; temporary: never. */
export function restarts(policy: Policy, exit: Exit): boolean {
  return policy === 'permanent' || (policy === 'transient' && abnormal(exit));
}

/**
 * The children to restart when `dead` exits, in start order: itself (one_for_one), every child
 * (one_for_all), or it and those started after it (rest_for_one).
 */
export function toRestart<T>(strategy: Strategy, children: readonly T[], dead: T): T[] {
  const at = children.indexOf(dead);
  if (at < 0) return [];
  if (strategy === 'one_for_one') return [dead];
  if (strategy === 'one_for_all') return [...children];
  return children.slice(at);
}

export interface Failure {
  at: number;
  actor: string;
  reason: string;
}

/** At most `intensity` restarts in any `periodSeconds`: one more escalates. */
export class Intensity {
  private readonly failures: Failure[] = [];

  constructor(
    readonly intensity: number,
    readonly periodSeconds: number,
  ) {}

  /** Records a failure; returns the escalation message when it is one too many, else undefined. */
  record(f: Failure): string | undefined {
    this.failures.push(f);
    const recent = this.failures.filter((x) => x.at > f.at - this.periodSeconds * 1000);
    if (recent.length <= this.intensity) return undefined;
    const last = recent.slice(-5).map((x) => `${x.actor}: ${x.reason}`);
    return (
      `${f.actor} failed, and that is ${recent.length} failures within ${this.periodSeconds} s ` + `(supervision.intensity allows ${this.intensity}); giving up. Last failures:\n  ${last.join('\n  ')}`
    );
  }

  get count(): number {
    return this.failures.length;
  }
}
