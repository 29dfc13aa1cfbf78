// npm run cordon -- RUN_DIR DEVICE [--reason TEXT]
// Takes a device out of a running elastic run for good (its machine is going away, it misbehaves):
// the supervisor re-plans onto the devices left at once, restores the last snapshot onto the new
// plan and goes on; the device's worker is stopped and not restarted. The run directory says where
// the run's bus is (bus.json) and, on a closed bus, holds the launcher's credential
// (credentials.json), which this uses. Refused, with the reason, and nothing changed: a run that is
// not elastic, a device the run does not have or has lost already, its last device, a loss no plan
// on the devices left survives.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { UsageError, args, runMain } from '../../actors/host.ts';
import { connectBus, subjects } from '../../mesh/wire/index.ts';
import { askCordon } from '../elastic/index.ts';

const USAGE = 'usage: npm run cordon -- RUN_DIR DEVICE [--reason TEXT]';

/** A JSON file of the run directory, or a message that says what was expected there. */
function readRunFile<T>(dir: string, name: string, what: string): T {
  const file = join(dir, name);
  if (!existsSync(file)) throw new UsageError(`${file}: not found; expected ${what} (the launcher writes it when a run starts: is ${dir} the directory of a running run?)`);
  try {
    return JSON.parse(readFileSync(file, 'utf8')) as T;
  } catch (e) {
    throw new UsageError(`${file}: expected ${what} as JSON, got text that does not parse (${(e as Error).message})`);
  }
}

runMain(async () => {
  const { values, positionals } = args(USAGE, { reason: { type: 'string' } });
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  if (positionals.length !== 2) throw new UsageError(`expected a run directory and a device, got ${positionals.length} argument(s)\n${USAGE}`);
  const [dir, deviceText] = positionals as [string, string];
  if (!/^\d+$/.test(deviceText)) throw new UsageError(`DEVICE: expected a device number (e.g. 3), got ${JSON.stringify(deviceText)}\n${USAGE}`);
  const bus = readRunFile<{ url?: unknown; run?: unknown }>(dir, 'bus.json', "the run's bus: { url, run }");
  if (typeof bus.url !== 'string' || typeof bus.run !== 'string') throw new UsageError(`${join(dir, 'bus.json')}: expected { url, run } as strings, got ${JSON.stringify(bus)}`);
  const creds = existsSync(join(dir, 'credentials.json')) ? readRunFile<{ launcher?: { user: string; pass: string } }>(dir, 'credentials.json', "the run's credentials").launcher : undefined;
  const nc = await connectBus(bus.url, `ferry-cordon-${bus.run}`, creds ?? {});
  try {
    const device = Number(deviceText);
    const reason = (values.reason as string | undefined) ?? 'cordoned by an operator';
    const answer = await askCordon(nc, subjects(bus.run), { device, trigger: 'cordon', reason }, 10_000);
    if (!answer.ok) {
      console.error(`refused: ${answer.problem}`);
      return 1;
    }
    console.log(`device ${device} is out of run ${bus.run}: it re-plans onto devices ${answer.left.join(', ')} (its summary's replans say how it went)`);
    return 0;
  } finally {
    await nc.drain().catch(() => {});
  }
});
