import { describe, expect, it } from 'vitest';
import type { Metrics } from '../../mesh/wire/index.ts';
import { progress } from './progress.ts';

/** A stream that is not a terminal, as a log or a pipe is. */
function log() {
  const lines: string[] = [];
  const stream = { isTTY: false, write: (s: string) => lines.push(s) } as unknown as NodeJS.WriteStream;
  return { lines, stream };
}

const metrics = (iteration: number) => ({ iteration, reward_mean: 0.5, kl: 0.01, seconds: 0.2, tokens_per_second: 100 }) as unknown as Metrics;

describe('progress without a terminal', () => {
  it('says a phase once while it lasts, not before every iteration line', () => {
    const { lines, stream } = log();
    const p = progress(stream);
    p.phase('setting up', 'loading the models');
    for (let i = 0; i < 3; i++) {
      p.phase('iterating', 'iterating');
      p.iteration(metrics(i), 3);
    }
    expect(lines.filter((l) => l.startsWith('[iterating]'))).toHaveLength(1);
    expect(lines.filter((l) => l.startsWith('iteration '))).toHaveLength(3);
  });

  it('says a phase again once another phase came between, and every new detail', () => {
    const { lines, stream } = log();
    const p = progress(stream);
    p.phase('iterating', 'iterating');
    p.iteration(metrics(0), 4);
    p.phase('recovering', 'worker 1 exited (recovery 1)');
    p.phase('recovering', 'restoring the snapshot of iteration 0');
    p.phase('iterating', 'iterating');
    p.iteration(metrics(1), 4);
    expect(lines.filter((l) => l.startsWith('['))).toEqual([
      '[iterating] iterating\n',
      '[recovering] worker 1 exited (recovery 1)\n',
      '[recovering] restoring the snapshot of iteration 0\n',
      '[iterating] iterating\n',
    ]);
  });
});
