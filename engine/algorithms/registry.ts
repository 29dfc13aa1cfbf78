// Algorithms by name, and a user's own from a file. `algorithm:` in a scenario is a name, a path
// to a module whose default export is an Algorithm (defineAlgorithm), or `{ name, ...options }`.
import { isAbsolute, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { fileDigest, registerModuleLosses } from '../model/index.ts';
import type { Algorithm } from './algorithm.ts';
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
    mod = (await import(pathToFileURL(file).href)) as { default?: unknown };
  } catch (e) {
    throw new AlgorithmError(`cannot load the algorithm in ${file}: ${(e as Error).message}`);
  }
  const a = mod.default as Partial<Algorithm> | undefined;
  if (!a || typeof a.name !== 'string' || typeof a.graph !== 'function' || typeof a.options?.safeParse !== 'function') {
    throw new AlgorithmError(`${file}: expected a default export made with defineAlgorithm({ name, summary, options, graph }), got ${a === undefined ? 'no default export' : typeof a}`);
  }
  try {
    registerModuleLosses(mod, file, sha256);
  } catch (e) {
    throw new AlgorithmError(`${file}: ${(e as Error).message}`);
  }
  loaded.set(file, a as Algorithm);
  return a as Algorithm;
}

/** A built-in by name, or a file loaded before; anything else lists what is known. */
export function algorithmOf(name: string): Algorithm {
  const a = BUILTIN[name] ?? loaded.get(name);
  if (a) return a;
  if (isPath(name)) throw new AlgorithmError(`the algorithm file ${name} was not loaded (loadAlgorithmFile first)`);
  throw new AlgorithmError(`unknown algorithm '${name}'; known: ${Object.keys(BUILTIN).join(', ')}, or a path to a module that default-exports defineAlgorithm({...})`);
}
