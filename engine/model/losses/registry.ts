// Losses by name: the built-in ones, and those a user's algorithm file exports (registered when
// the file is loaded, in the supervisor's process and in every worker that trains with them).
import { isAbsolute, relative, resolve } from 'node:path';
import { cispo } from './cispo.ts';
import { clipPolicy } from './clip-policy.ts';
import { clipValue } from './clip-value.ts';
import { decoupled } from './decoupled.ts';
import { LossError, type Loss } from './define.ts';
import { gspo } from './gspo.ts';
import { pairSigmoid } from './pair-sigmoid.ts';

export const BUILTIN_LOSSES: readonly Loss[] = [clipPolicy, clipValue, pairSigmoid, gspo, cispo, decoupled] as Loss[];

/** Where a user's loss came from: its file (absolute) and that file's SHA-256 when it was loaded. */
export interface LossSource {
  file: string;
  sha256: string;
}

const registry = new Map<string, { loss: Loss; source?: LossSource }>(BUILTIN_LOSSES.map((l) => [l.name, { loss: l }]));

/** Adds a user's loss; its name must not be taken by a built-in or by another file's loss. */
export function registerLoss(loss: Loss, source: LossSource): void {
  const known = registry.get(loss.name);
  if (known && known.loss !== loss && known.source?.file !== source.file) {
    throw new LossError(`${source.file} exports the loss '${loss.name}', a name already taken by ${known.source ? known.source.file : 'a built-in loss'}; rename it`);
  }
  registry.set(loss.name, { loss, source });
}

export function lossOf(name: string): Loss {
  const found = registry.get(name);
  if (!found) throw new LossError(`unknown loss '${name}'; known: ${lossNames().join(', ')} (or a loss exported by the algorithm's file, made with defineLoss)`);
  return found.loss;
}

/** The file a user's loss came from (undefined for a built-in). */
export const lossSource = (name: string): LossSource | undefined => registry.get(name)?.source;

export const lossNames = (): string[] => [...registry.keys()];

/**
 * A loss module's path as it travels: relative to the working directory when it lies inside it
 * (each process resolves it against its own checkout, `npm run` starts every one at its root),
 * absolute otherwise.
 */
export function portablePath(file: string, cwd = process.cwd()): string {
  const rel = relative(cwd, file);
  return rel === '' || rel.startsWith('..') || isAbsolute(rel) ? file : rel;
}

/** A travelling path back to a file of this process. */
export const localPath = (file: string, cwd = process.cwd()) => (isAbsolute(file) ? file : resolve(cwd, file));
