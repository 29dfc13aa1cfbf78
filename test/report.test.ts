// report.html in a real browser: Debian's chromium, driven by playwright-core (no browser is
// downloaded). A short run with a kill and a realloc plan writes its report; every section must
// render with data; a screenshot is kept beside the report. npm run plan --html draws a
// cluster-scale plan and its estimated timeline the same way.
import { existsSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { chromium, type Browser } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { launch, type LaunchResult } from '../engine/cli/launch.ts';
import { loadScenario } from '../engine/runtime/scenario/scenario.ts';
import { ensureChromium, spawnTs, tempDir } from './helpers.ts';

const SECTIONS = ['summary', 'plan', 'timeline', 'estimate', 'curves', 'chaos'] as const;

describe('report.html', () => {
  let browser: Browser;
  let dir: string;
  let run: LaunchResult;
  const out = () => join(dir, 'run');

  beforeAll(async () => {
    browser = await chromium.launch({ executablePath: ensureChromium(), args: ['--no-sandbox'] });
    dir = tempDir();
    const file = join(dir, 'reported.yaml');
    const text = readFileSync('scenarios/chaos.yaml', 'utf8')
      .replace(/chaos:\n(.|\n)*$/, 'chaos:\n  kills:\n    - { actor: critic, call: train, iteration: 1 }\n')
      .replace('iterations: 6', 'iterations: 4');
    (await import('node:fs')).writeFileSync(file, text);
    run = await launch({ scenario: loadScenario(file), run: `report${Date.now()}`, out: out(), progress: { phase() {}, iteration() {}, stop() {} }, say: () => {} });
  }, 180_000);
  afterAll(() => browser?.close());

  it('is written at the end of every run, one file that needs nothing else', () => {
    expect(run.summary?.error).toBeUndefined();
    const html = readFileSync(join(out(), 'report.html'), 'utf8');
    expect(html).toMatch(/^<!doctype html>/);
    // Self-contained: no script, stylesheet or image is fetched.
    expect(html).not.toMatch(/<script|<link |src="http|href="http|url\(http/i);
  });

  it('renders every section with data in headless Chromium, and a screenshot is kept', async () => {
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    const errors: string[] = [];
    page.on('pageerror', (e) => errors.push(e.message));
    page.on('console', (m) => m.type() === 'error' && errors.push(m.text()));
    await page.goto(`file://${join(out(), 'report.html')}`);
    for (const id of SECTIONS) {
      const section = page.locator(`section#${id}`);
      await expect(section.isVisible()).resolves.toBe(true);
      expect(Number(await section.getAttribute('data-items')), `section ${id}`).toBeGreaterThan(0);
    }
    // Drawn, not only counted: the plan's cells, the timeline's spans, a recovery band and a kill
    // marker, the estimate's spans, the curves' lines; each with a size on the page.
    const count = (sel: string) => page.locator(sel).count();
    expect(await count('#plan rect.cell')).toBeGreaterThanOrEqual(6);
    expect(await count('#timeline rect.span')).toBeGreaterThan(20);
    expect(await count('#timeline rect.band')).toBeGreaterThanOrEqual(1);
    expect(await count('#timeline g.mark')).toBe(1);
    expect(await count('#estimate rect.span')).toBeGreaterThan(6);
    // Every curve the quickstart's metrics have, the actor's and the critic's clip fractions among them.
    expect(await count('#curves polyline.series')).toBe(8);
    const box = await page.locator('#timeline svg').boundingBox();
    expect(box!.width).toBeGreaterThan(500);
    expect(await page.locator('#timeline').textContent()).toMatch(/reallocation/);
    expect(await page.locator('#chaos').textContent()).toMatch(/critic/);
    expect(await page.locator('#summary').textContent()).toMatch(/succeeded/);
    const shot = join(out(), 'report.png');
    await page.screenshot({ path: shot, fullPage: true });
    expect(statSync(shot).size).toBeGreaterThan(20_000);
    expect(errors).toEqual([]);
    await page.close();
  });

  it('npm run report -- RUN_DIR writes it again; a directory that is not a run is refused', async () => {
    const again = spawnTs('engine/cli/report.ts', [out()]);
    expect(await again.exited).toBe(0);
    expect(again.output()).toContain(join(out(), 'report.html'));
    const bad = spawnTs('engine/cli/report.ts', [dir]);
    expect(await bad.exited).toBe(1);
    expect(bad.output()).toMatch(/is not a run directory: it has no scenario\.json/);
  });

  it('npm run plan -- FILE --html OUT.html draws a cluster-scale plan and its estimated timeline', async () => {
    const html = join(dir, 'plan.html');
    const p = spawnTs('engine/cli/plan.ts', ['scenarios/cluster/llama70b-64gpu-h100.yaml', '--placement', 'colocate', '--html', html]);
    expect(await p.exited).toBe(0);
    expect(existsSync(html)).toBe(true);
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    await page.goto(`file://${html}`);
    for (const id of ['plan', 'estimate']) expect(Number(await page.locator(`section#${id}`).getAttribute('data-items'))).toBeGreaterThan(0);
    expect(await page.locator('#plan rect.cell').count()).toBeGreaterThanOrEqual(6 * 64);
    expect(await page.locator('#estimate rect.span').count()).toBeGreaterThan(64);
    await page.screenshot({ path: join(dir, 'plan.png'), fullPage: true });
    await page.close();
  }, 120_000);
});
