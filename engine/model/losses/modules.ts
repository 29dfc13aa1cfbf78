// A user's loss module on a worker: the file the supervisor planned with, by path and SHA-256.
// The worker reads its own copy, refuses it when the digests differ (a worker joined from another
// checkout must not train with another loss), then imports it and registers the losses it
// exports. Nothing travels as code: only the path and the digest.
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import { LossError, isLoss, type Loss } from './define.ts';
import { localPath, registerLoss } from './registry.ts';

/** The SHA-256 of a file's bytes. */
export const fileDigest = (file: string): string => createHash('sha256').update(readFileSync(file)).digest('hex');

/** Modules imported by this process: absolute path → the digest they were imported at. */
const imported = new Map<string, string>();

/**
 * Registers the losses a module exports (every export made with defineLoss). `file` is absolute,
 * `sha256` its digest when it was read; the returned list is what it exports.
 */
export function registerModuleLosses(mod: Record<string, unknown>, file: string, sha256: string): Loss[] {
  const losses = Object.values(mod).filter(isLoss);
  for (const loss of losses) registerLoss(loss, { file, sha256 });
  imported.set(file, sha256);
  return losses;
}

/** Reads, checks and imports a loss module (once per process), registering its losses. */
export async function loadLossModule(m: { file: string; sha256: string }): Promise<Loss[]> {
  const file = localPath(m.file);
  let digest: string;
  try {
    digest = fileDigest(file);
  } catch (e) {
    throw new LossError(`cannot read the loss module ${m.file} (${file}) on this worker: ${(e as Error).message}`);
  }
  if (digest !== m.sha256) {
    throw new LossError(
      `the loss module ${m.file}: this worker's copy (${file}) has SHA-256 ${digest}, the supervisor planned with ${m.sha256}; every process of a run must load the same file (is this worker from another checkout?)`,
    );
  }
  const before = imported.get(file);
  if (before !== undefined && before !== digest) {
    throw new LossError(`the loss module ${m.file} changed since this process imported it (SHA-256 ${before}, now ${digest}); restart the worker to load the new file`);
  }
  let mod: Record<string, unknown>;
  try {
    mod = (await import(pathToFileURL(file).href)) as Record<string, unknown>;
  } catch (e) {
    throw new LossError(`cannot load the loss module ${m.file}: ${(e as Error).message}`);
  }
  return registerModuleLosses(mod, file, digest);
}
