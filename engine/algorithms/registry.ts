// Algorithms by name, and a user's own from a file. `algorithm:` in a scenario is a name, a path
// to a module whose default export is an Algorithm (defineAlgorithm), or `{ name, ...options }`.
import { isAbsolute, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { fileDigest, importUserModule, registerModuleLosses } from '../model/index.ts';
import { madeByAnotherCopy, type Algorithm } from './algorithm.ts';
import { dpo } from './dpo.ts';
import { grpo } from './grpo.ts';
import { ppo } from './ppo.ts';
import { reinforcePP } from './reinforce-pp.ts';
import { remax } from './remax.ts';
import { rloo } from './rloo.ts';

export const BUILTIN: Record<string, Algorithm> = Object.fromEntries([ppo, grpo, rloo, remax, reinforcePP, dpo].map((a) => [a.name, a as unknown as Algorithm]));

/** Algorithms loaded from files this process, by their absolute path. */
const loaded = new Map<string, Algorithm>();

export class AlgorithmError extends Error {
  override name = 'AlgorithmError';
}

/** Whether `algorithm:` names a file rather than a built-in. */
export const isPath = (name: string) => /[\\/]/.test(name) || /\.(m?[jt]s)$/.test(name);

/** A file's absolute path, relative to the scenario's directory. */
export const algorithmPath = (name: string, baseDir: string) => (isAbsolute(name) ? name : resolve(baseDir, name));

/** What a value is, in a few words, for an error that says what came instead of what was expected. */
function what(x: unknown): string {
  if (x === undefined) return 'nothing';
  if (x === null) return 'null';
  if (typeof x === 'function') return `a function${x.name ? ` (${x.name})` : ''}`;
  if (Array.isArray(x)) return `an array of ${x.length}`;
  if (typeof x === 'object') {
    const keys = Object.keys(x);
    return keys.length ? `an object with ${keys.join(', ')}` : 'an empty object';
  }
  const text = JSON.stringify(x);
  return `${typeof x} ${text.length > 40 ? `${text.slice(0, 40)}…` : text}`;
}

/** What an algorithm has, each with what it must be. */
const FIELDS: Array<[keyof Algorithm, string, (v: unknown) => boolean]> = [
  ['name', 'a string', (v) => typeof v === 'string' && v.length > 0],
  ['summary', 'a string', (v) => typeof v === 'string'],
  ['options', 'a zod schema (z.strictObject({...}))', (v) => typeof (v as { safeParse?: unknown } | undefined)?.safeParse === 'function'],
  ['graph', 'a function (options, rl) => Graph', (v) => typeof v === 'function'],
];

/** The module's default export as an algorithm, or an error naming the file, what it lacks and what came. */
function algorithmExport(mod: Record<string, unknown>, file: string): Algorithm {
  const expected = `${file}: expected a default export made with defineAlgorithm({ name, summary, options, graph })`;
  const a = mod.default;
  if (a === undefined) {
    const names = Object.keys(mod);
    throw new AlgorithmError(`${expected}, got no default export (${names.length ? `it exports ${names.join(', ')}` : 'it exports nothing'})`);
  }
  if (typeof a !== 'object' || a === null) throw new AlgorithmError(`${expected}, got ${what(a)}`);
  const wrong = FIELDS.filter(([key, , ok]) => !ok((a as Record<string, unknown>)[key])).map(([key, want]) => `${key}: expected ${want}, got ${what((a as Record<string, unknown>)[key])}`);
  if (wrong.length) throw new AlgorithmError(`${expected}; its default export is wrong: ${wrong.join('; ')}`);
  const other = madeByAnotherCopy(a);
  if (other !== undefined) {
    const api = fileURLToPath(new URL('../api.ts', import.meta.url));
    const theirs = other.startsWith('file:') ? fileURLToPath(new URL('../api.ts', other)) : other;
    const running = 'not the one running this scenario, whose losses, graphs and tf it would not share';
    throw new AlgorithmError(
      theirs === api
        ? `${file}: its defineAlgorithm came from a second instance of ferry's modules (${api}, loaded twice), ${running}; is the file CommonJS (a .cts, or a package.json above it that says "type": "commonjs")?`
        : `${file}: its defineAlgorithm came from another copy of ferry (${theirs}), ${running}; import ${api}`,
    );
  }
  return a as Algorithm;
}

/**
 * Imports a user's algorithm module (once per process) so that `algorithmOf` finds it, and
 * registers the losses it exports (made with defineLoss) with the file's SHA-256, which every
 * worker that trains with them checks its own copy against.
 */
export async function loadAlgorithmFile(file: string): Promise<Algorithm> {
  const known = loaded.get(file);
  if (known) return known;
  let mod: { default?: unknown } & Record<string, unknown>;
  let sha256: string;
  try {
    sha256 = fileDigest(file);
    mod = await importUserModule(file);
  } catch (e) {
    throw new AlgorithmError(`cannot load the algorithm in ${file}: ${(e as Error).message}`);
  }
  const a = algorithmExport(mod, file);
  try {
    registerModuleLosses(mod, file, sha256);
  } catch (e) {
    throw new AlgorithmError(`${file}: ${(e as Error).message}`);
  }
  loaded.set(file, a);
  return a;
}

/** A built-in by name, or a file loaded before; anything else lists what is known. */
export function algorithmOf(name: string): Algorithm {
  const a = BUILTIN[name] ?? loaded.get(name);
  if (a) return a;
  if (isPath(name)) throw new AlgorithmError(`the algorithm file ${name} was not loaded (loadAlgorithmFile first)`);
  throw new AlgorithmError(`unknown algorithm '${name}'; known: ${Object.keys(BUILTIN).join(', ')}, or a path to a module that default-exports defineAlgorithm({...})`);
}
