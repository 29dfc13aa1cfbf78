// Progress on a terminal (a bar) or in a log (one plain line per iteration).
import { SingleBar, Presets } from 'cli-progress';
import type { Metrics } from '../../mesh/wire/index.ts';

export interface Progress {
  phase(phase: string, detail: string): void;
  iteration(m: Metrics, total: number): void;
  stop(): void;
}

const fmt = (m: Metrics) => ({
  reward: m.reward_mean.toFixed(3),
  kl: typeof m.kl === 'number' ? m.kl.toFixed(3) : '-',
  sec: m.seconds.toFixed(2),
});

export function progress(stream: NodeJS.WriteStream = process.stdout): Progress {
  if (!stream.isTTY) {
    // The supervisor enters its iterating state at every iteration: a log says a phase when it
    // differs from the last phase said (iteration lines in between do not count).
    let last = '';
    return {
      phase: (p, d) => {
        const line = `[${p}] ${d}\n`;
        if (line !== last) stream.write(line);
        last = line;
      },
      iteration: (m, total) => {
        const f = fmt(m);
        stream.write(`iteration ${m.iteration + 1}/${total}  reward ${f.reward}  kl ${f.kl}  ${f.sec} s/it  ${Math.round(m.tokens_per_second)} tok/s\n`);
      },
      stop: () => {},
    };
  }
  let bar: SingleBar | undefined;
  return {
    phase: (p, d) => {
      if (!bar) stream.write(`[${p}] ${d}\n`);
    },
    iteration: (m, total) => {
      if (!bar) {
        bar = new SingleBar({ format: 'PPO {bar} {value}/{total} | reward {reward} | kl {kl} | {sec} s/it | eta {eta_formatted}', hideCursor: true, stream }, Presets.shades_classic);
        bar.start(total, 0, fmt(m));
      }
      bar.update(m.iteration + 1, fmt(m));
    },
    stop: () => bar?.stop(),
  };
}
