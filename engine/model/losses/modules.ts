// A user's loss module on a worker: the file the supervisor planned with, by path and SHA-256.
// The worker reads its own copy, refuses it when the digests differ (a worker joined from another
// checkout must not train with another loss), then imports it and registers the losses it
// exports. Nothing travels as code: only the path and the digest. The supervisor and the workers
// import a user's file the one way (importUserModule), inside the checkout or anywhere else.
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { register } from 'node:module';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { LossError, isLoss, type Loss } from './define.ts';
import { localPath, registerLoss } from './registry.ts';

/** The SHA-256 of a file's bytes. */
export const fileDigest = (file: string): string => createHash('sha256').update(readFileSync(file)).digest('hex');

/**
 * Node's module hooks that make a user's file an ES module wherever it lies. A `.ts` or `.js` file
 * is CommonJS unless the nearest package.json says `"type": "module"`: ferry's does, a folder of
 * the user's own (no package.json, or one without `type`) does not. There tsx compiled the file to
 * CommonJS, and its `import … from '/…/engine/api.ts'` became a `require`, which tsx answers by
 * compiling ferry's modules once more as CommonJS: a second copy of the engine, with a loss
 * registry of its own, in which a built-in graph looked the file's loss up, found nothing and bound
 * none of its ports. As an ES module the file shares the one copy the process runs, exactly as
 * inside the checkout. A package.json that says `"type": "commonjs"` is obeyed; node_modules is
 * left alone.
 */
const ESM_HOOKS = `
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
let ferry;
export function initialize(data) {
  const source = pathToFileURL(data.source).href;
  const root = new URL('../', source).href;
  ferry = { source, api: data.api && pathToFileURL(data.api).href, inside: ['engine/', 'mesh/'].map((d) => root + d), bundle: data.api && pathToFileURL(dirname(data.api)).href + '/' };
}
const isFerry = (url) => ferry.inside.some((d) => url.startsWith(d)) || (ferry.bundle !== undefined && url.startsWith(ferry.bundle));
const declaredType = (file) => {
  for (let dir = dirname(file); ; dir = dirname(dir)) {
    try {
      return JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')).type;
    } catch (e) {
      if (e.code !== 'ENOENT') return undefined;
    }
    if (dirname(dir) === dir) return undefined;
  }
};
export async function resolve(specifier, context, next) {
  const r = await next(specifier, context);
  // A user's file (one outside ferry's engine/ and mesh/, which hold every module a process imports,
  // and outside the bundle) imports ferry through api.ts alone:
  // any other of ferry's files would be, in a bundled process, a second copy of ferry's modules
  // with registries of its own, so it is refused the same way in every process.
  const fromUser = context.parentURL !== undefined && context.parentURL.startsWith('file:') && !isFerry(context.parentURL) && !/[\\/]node_modules[\\/]/.test(context.parentURL);
  if (fromUser && r.url === ferry.source && ferry.api) return { url: ferry.api, format: 'module', shortCircuit: true };
  if (fromUser && r.url !== ferry.source && ferry.inside.some((d) => r.url.startsWith(d))) {
    throw new Error(
      fileURLToPath(context.parentURL) + ' imports ' + fileURLToPath(r.url) +
        ": a user's file imports ferry through " + fileURLToPath(ferry.source) + ' alone (it exports the algorithms, BUILTIN, the losses and their helpers, tf and z)',
    );
  }
  if (!/^commonjs(-typescript)?$/.test(r.format ?? '') || !r.url.startsWith('file:')) return r;
  const file = fileURLToPath(r.url);
  if (!/\\.[jt]sx?$/.test(file) || /[\\\\/]node_modules[\\\\/]/.test(file) || declaredType(file) === 'commonjs') return r;
  return { ...r, format: 'module' };
}
`;
let hooked = false;

/**
 * Set by the launcher on a process it starts from a bundle (engine/cli/process-bundle.ts): ferry's
 * engine/api.ts by path, and the bundle's api.mjs that shares the process's modules.
 */
export const BUNDLE_ENV = 'FERRY_BUNDLE';

function bundledProcess(): { source: string; api: string } | undefined {
  const raw = process.env[BUNDLE_ENV];
  if (!raw) return undefined;
  const b = JSON.parse(raw) as { source?: unknown; api?: unknown };
  if (typeof b.source !== 'string' || typeof b.api !== 'string') throw new LossError(`${BUNDLE_ENV}: expected {"source": PATH, "api": PATH}, got ${raw}`);
  return { source: b.source, api: b.api };
}

/**
 * Imports a user's module (an algorithm's file) as an ES module, so that what it imports from
 * ferry, by a relative or an absolute path, is the copy this process runs (ESM_HOOKS says why).
 */
export async function importUserModule(file: string): Promise<Record<string, unknown>> {
  if (!hooked) {
    const bundle = bundledProcess();
    // A process started from a bundle has no TypeScript loader of its own: tsx's hooks first, then
    // ours, which run before them and send ferry's api.ts to the bundle's api.mjs.
    if (bundle) ((await import('tsx/esm/api')) as { register: () => unknown }).register();
    register(`data:text/javascript,${encodeURIComponent(ESM_HOOKS)}`, { data: bundle ?? { source: fileURLToPath(new URL('../../api.ts', import.meta.url)) } });
    hooked = true;
  }
  return (await import(pathToFileURL(file).href)) as Record<string, unknown>;
}

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
    mod = await importUserModule(file);
  } catch (e) {
    throw new LossError(`cannot load the loss module ${m.file}: ${(e as Error).message}`);
  }
  return registerModuleLosses(mod, file, digest);
}
