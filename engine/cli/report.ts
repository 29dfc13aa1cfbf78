// npm run report -- RUN_DIR
// Writes RUN_DIR/report.html again from what the run directory holds (every run writes it at its end).
import { UsageError, args, runMain } from '../../actors/host.ts';
import { writeRunReport } from '../runtime/index.ts';

const USAGE = 'usage: npm run report -- RUN_DIR';

runMain(async () => {
  const { values, positionals } = args(USAGE, {});
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  if (positionals.length !== 1) throw new UsageError(`expected one run directory, got ${positionals.length}\n${USAGE}`);
  console.log(`wrote ${writeRunReport(positionals[0]!)}`);
  return 0;
});
