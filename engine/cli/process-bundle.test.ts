import { existsSync, readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { BUNDLE_ENV } from '../model/index.ts';
import { bundledStart, processBundle } from './process-bundle.ts';

describe('the processes’ bundle', () => {
  it('is built once for the sources as they are, and starts the worker and the supervisor from it; anything else, through tsx', async () => {
    const bundle = await processBundle();
    for (const file of [bundle.worker, bundle.supervisor, bundle.api]) expect(existsSync(file), file).toBe(true);
    // The same sources, the same bundle.
    expect(await processBundle()).toEqual(bundle);
    // The search thread imports its module's chunk, never the supervisor's entry that starts a run.
    expect(readFileSync(bundle.supervisor, 'utf8')).not.toContain('workerData: { serve: true }');
    const worker = bundledStart('actors/worker.ts', bundle);
    expect(worker).toMatchObject({ entry: bundle.worker, loader: ['--enable-source-maps'] });
    expect(JSON.parse(worker.env[BUNDLE_ENV]!)).toMatchObject({ api: bundle.api });
    expect(JSON.parse(worker.env[BUNDLE_ENV]!).source).toMatch(/engine\/api\.ts$/);
    expect(bundledStart('actors/supervisor.ts', bundle).entry).toBe(bundle.supervisor);
    expect(bundledStart('engine/cli/scenario.ts', bundle)).toMatchObject({ loader: ['--import', 'tsx'], env: {} });
    expect(bundledStart('actors/worker.ts', undefined)).toMatchObject({ loader: ['--import', 'tsx'], env: {} });
  });

  it('starts through tsx when its bundle is gone from under a run', () => {
    const gone = { worker: '/nonexistent/ferry-bundle/worker.mjs', supervisor: '/nonexistent/ferry-bundle/supervisor.mjs', api: '/nonexistent/ferry-bundle/api.mjs' };
    expect(bundledStart('actors/worker.ts', gone)).toMatchObject({ entry: expect.stringMatching(/actors\/worker\.ts$/), loader: ['--import', 'tsx'], env: {} });
    expect(bundledStart('actors/supervisor.ts', gone)).toMatchObject({ entry: expect.stringMatching(/actors\/supervisor\.ts$/), loader: ['--import', 'tsx'] });
  });
});
