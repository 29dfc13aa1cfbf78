// A worker process starts from one bundle of ferry's modules instead of three hundred TypeScript
// files compiled one by one through tsx's module hooks: on the 2-core machines here that is
// 0.45 s of CPU to start a worker instead of 1.25 s, and about half the seconds from a kill to the
// restarted worker joining. esbuild (tsx's own compiler) writes the bundle once per state of the
// sources, keyed by the sources' paths, sizes and modification times, into node_modules/.cache/
// (where tools keep their caches): dependencies stay packages, imported from there as usual.
//
// engine/api.ts is bundled beside the worker, sharing its modules: a user's loss module imports
// ferry's api.ts by path, and the module hook (engine/model/losses/modules.ts) answers that path
// with the bundle's api.mjs, so that the losses it defines land in the registry the worker reads.
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, renameSync, rmSync, statSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { build } from 'esbuild';
import { BUNDLE_ENV } from '../model/index.ts';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
/** The folders whose sources the bundled entry points import. */
const SOURCES = ['actors', 'engine', 'mesh'];

/** Each source file's path, size and modification time: the bundle's key. */
function sourceStamp(): string {
  const hash = createHash('sha256');
  const walk = (dir: string) => {
    for (const entry of readdirSync(dir, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1))) {
      const path = join(dir, entry.name);
      if (entry.isDirectory()) walk(path);
      else if (entry.name.endsWith('.ts') && !entry.name.endsWith('.test.ts')) {
        const s = statSync(path);
        hash.update(`${path}\0${s.size}\0${s.mtimeMs}\n`);
      }
    }
  };
  for (const dir of SOURCES) walk(join(ROOT, dir));
  return hash.digest('hex').slice(0, 16);
}

export interface ProcessBundle {
  /** The bundled worker entry point (actors/worker.ts). */
  worker: string;
  /** engine/api.ts, sharing the worker's modules. */
  api: string;
}

let built: Promise<ProcessBundle> | undefined;
let builtFor = '';

/** The worker's bundle for the sources as they are now, built if the cache lacks it. */
export function processBundle(): Promise<ProcessBundle> {
  const stamp = sourceStamp();
  if (built && builtFor === stamp) return built;
  builtFor = stamp;
  built = buildBundle(stamp);
  built.catch(() => {
    builtFor = '';
  });
  return built;
}

async function buildBundle(stamp: string): Promise<ProcessBundle> {
  const dir = join(ROOT, 'node_modules', '.cache', 'ferry', 'bundles', stamp);
  const bundle = { worker: join(dir, 'worker.mjs'), api: join(dir, 'api.mjs') };
  if (existsSync(bundle.worker) && existsSync(bundle.api)) return bundle;
  // Written beside, then renamed into place: a process reading the cache never sees half a bundle.
  const tmp = `${dir}.${process.pid}.${Date.now()}`;
  mkdirSync(tmp, { recursive: true });
  try {
    await build({
      entryPoints: { worker: join(ROOT, 'actors/worker.ts'), api: join(ROOT, 'engine/api.ts') },
      outdir: tmp,
      outExtension: { '.js': '.mjs' },
      bundle: true,
      splitting: true,
      format: 'esm',
      platform: 'node',
      target: 'node20',
      packages: 'external',
      // Stack traces in the workers' logs name ferry's files and lines.
      sourcemap: 'linked',
      sourcesContent: false,
      logLevel: 'silent',
    });
    mkdirSync(dirname(dir), { recursive: true });
    try {
      renameSync(tmp, dir);
    } catch (e) {
      // Another process put the same bundle there first.
      if (!existsSync(bundle.worker)) throw e;
    }
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
  return bundle;
}

/** The command line and environment that start `script` from its bundle, where it has one. */
export function bundledStart(script: string, bundle: ProcessBundle | undefined): { entry: string; env: NodeJS.ProcessEnv; loader: string[] } {
  if (!bundle || script !== 'actors/worker.ts') return { entry: join(ROOT, script), env: {}, loader: ['--import', 'tsx'] };
  return { entry: bundle.worker, env: { [BUNDLE_ENV]: JSON.stringify({ source: join(ROOT, 'engine/api.ts'), api: bundle.api }) }, loader: ['--enable-source-maps'] };
}
