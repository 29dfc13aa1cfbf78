// What every ferry process needs: arguments, a logger with the process's name, and a clean exit.
import { parseArgs, type ParseArgsConfig } from 'node:util';

export class UsageError extends Error {
  override name = 'UsageError';
}

export function args<T extends ParseArgsConfig['options']>(usage: string, options: T) {
  try {
    return parseArgs({ options: { ...options, help: { type: 'boolean' } }, allowPositionals: true, strict: true });
  } catch (e) {
    throw new UsageError(`${(e as Error).message}\n${usage}`);
  }
}

export function logger(name: string): (line: string) => void {
  return (line) => process.stderr.write(`${new Date().toISOString()} ${name} ${line}\n`);
}

/** Runs `main`; a thrown error is printed as one clear line and the process exits non-zero. */
export function runMain(main: () => Promise<number>): void {
  main().then(
    (code) => process.exit(code),
    (e: unknown) => {
      process.stderr.write(`${e instanceof Error ? `${e.name}: ${e.message}` : String(e)}\n`);
      if (process.env.FERRY_DEBUG && e instanceof Error) process.stderr.write(`${e.stack}\n`);
      process.exit(e instanceof UsageError ? 2 : 1);
    },
  );
}

export const DEFAULT_NATS = 'nats://127.0.0.1:4222';
