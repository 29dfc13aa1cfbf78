// The processes of a run (workers and the supervisor) start from one bundle of ferry's modules
// instead of three hundred TypeScript files compiled one by one through tsx's module hooks: on the
// 2-core machines here that is 0.45 s of CPU to start a worker instead of 1.25 s, and about half
// the seconds from a kill to the restarted process joining. esbuild (tsx's own compiler) writes
// the bundle once per state of the sources, keyed by the sources' paths, sizes and modification
// times, into node_modules/.cache/ (where tools keep their caches): dependencies stay packages,
// imported from there as usual.
//
// engine/api.ts is bundled beside them, sharing their modules: a user's algorithm or loss module
// imports ferry's api.ts by path, and the module hook (engine/model/losses/modules.ts) answers that
// path with the bundle's api.mjs, so that what it defines lands in the registries the process reads.
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, renameSync, rmSync, statSync, utimesSync } from 'node:fs';
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
  /** The bundled entry points of the processes: actors/worker.ts and actors/supervisor.ts. */
  worker: string;
  supervisor: string;
  /** engine/api.ts, sharing the processes' modules. */
  api: string;
}

let built: Promise<ProcessBundle> | undefined;
let builtFor = '';

/** The processes' bundle for the sources as they are now, built if the cache lacks it. */
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
  const bundles = join(ROOT, 'node_modules', '.cache', 'ferry', 'bundles');
  const dir = join(bundles, stamp);
  const bundle = { worker: join(dir, 'worker.mjs'), supervisor: join(dir, 'supervisor.mjs'), api: join(dir, 'api.mjs') };
  if (existsSync(bundle.worker) && existsSync(bundle.supervisor) && existsSync(bundle.api)) {
    // Marked as used: bundles of older sources go once unused for a day, never one a run may restart from.
    const now = new Date();
    utimesSync(dir, now, now);
    return bundle;
  }
  forgetOldBundles(bundles);
  // Written beside, then renamed into place: a process reading the cache never sees half a bundle.
  const tmp = `${dir}.${process.pid}.${Date.now()}`;
  mkdirSync(tmp, { recursive: true });
  try {
    await build({
      // The search thread's own entry: it imports its module by that module's URL (search-thread.ts),
      // which must then be a chunk of shared modules, never the supervisor's entry that starts a run.
      entryPoints: {
        worker: join(ROOT, 'actors/worker.ts'),
        supervisor: join(ROOT, 'actors/supervisor.ts'),
        api: join(ROOT, 'engine/api.ts'),
        'search-thread': join(ROOT, 'engine/elastic/search-thread.ts'),
      },
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
  const entry = script === 'actors/worker.ts' ? bundle?.worker : script === 'actors/supervisor.ts' ? bundle?.supervisor : undefined;
  // Through tsx where there is no bundle for it, or where its bundle is gone (removed by hand).
  if (!bundle || !entry || !existsSync(entry)) return { entry: join(ROOT, script), env: {}, loader: ['--import', 'tsx'] };
  // Every start marks the bundle as used: a run restarting its processes keeps its bundle.
  const now = new Date();
  utimesSync(dirname(entry), now, now);
  return { entry, env: { [BUNDLE_ENV]: JSON.stringify({ source: join(ROOT, 'engine/api.ts'), api: bundle.api }) }, loader: ['--enable-source-maps'] };
}

/** Bundles of sources as they were, unused for a day (a run started from one may restart its processes from it until then). */
function forgetOldBundles(bundles: string, maxAgeMs = 24 * 3600 * 1000): void {
  if (!existsSync(bundles)) return;
  for (const name of readdirSync(bundles)) {
    const path = join(bundles, name);
    try {
      if (Date.now() - statSync(path).mtimeMs > maxAgeMs) rmSync(path, { recursive: true, force: true });
    } catch {
      // Removed by another process meanwhile.
    }
  }
}
