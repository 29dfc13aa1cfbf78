// The environment of `npm run bench -- env`, in a process of its own as a user's environment is
// (not in the device's process, where its work on every request would count as the device's idle
// time): for each latency L given, the environment `bench-L`, whose reset answers at once with
// the observation "1" and whose every step answers "42" after L ms; an episode is 4 turns.
//
//   tsx engine/bench/bench-env-server.ts --nats URL --latencies 0,20,100
//
// Prints "ready" once every environment is served; stops on SIGTERM.
import { parseArgs } from 'node:util';
import { serveEnvironment } from '../../mesh/wire/index.ts';

const { values } = parseArgs({ options: { nats: { type: 'string' }, latencies: { type: 'string' } } });
const latencies = (values.latencies ?? '')
  .split(',')
  .filter(Boolean)
  .map((x) => {
    const ms = Number(x);
    if (!Number.isInteger(ms) || ms < 0) throw new Error(`--latencies: expected whole milliseconds separated by commas, got ${JSON.stringify(values.latencies)}`);
    return ms;
  });
if (!values.nats || !latencies.length) throw new Error('usage: bench-env-server.ts --nats URL --latencies 0,20,100');
const servers = await Promise.all(
  latencies.map((latency) =>
    serveEnvironment<{ turn: number }>({
      nats: values.nats!,
      name: `bench-${latency}`,
      reset: () => ({ state: { turn: 0 }, observation: '1' }),
      step: async (s) => {
        await new Promise((r) => setTimeout(r, latency));
        s.turn += 1;
        return { observation: '42', reward: 0, done: s.turn >= 4 };
      },
    }),
  ),
);
console.log('ready');
process.on('SIGTERM', () => void Promise.all(servers.map((s) => s.stop())).finally(() => process.exit(0)));
