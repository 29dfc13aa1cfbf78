// The layout shows the architecture: each layer imports only from the layers below it, and only
// through their one public entry (index.ts); nothing below the algorithms knows an algorithm.
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, normalize, relative } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ROOT } from './helpers.ts';

/** Bottom to top; processes, command lines and benchmarks (actors/, engine/cli/, engine/bench/) sit above them all. */
const LAYERS = [
  'mesh/wire',
  'mesh/parallel',
  'engine/adapters',
  'engine/model',
  'engine/episodes',
  'engine/generation',
  'engine/device',
  'engine/algorithms',
  'engine/environments',
  'engine/asynchrony',
  'engine/runtime',
  'engine/elastic',
  'engine/supervision',
];
const TOP = ['actors', 'engine/cli', 'engine/bench'];

function sources(dir: string): string[] {
  return readdirSync(join(ROOT, dir)).flatMap((f) => {
    const path = join(dir, f);
    if (statSync(join(ROOT, path)).isDirectory()) return sources(path);
    return f.endsWith('.ts') && !f.endsWith('.test.ts') ? [path] : [];
  });
}

const rank = (path: string) => {
  const i = LAYERS.findIndex((l) => path.startsWith(`${l}/`));
  if (i >= 0) return i;
  return TOP.some((t) => path.startsWith(`${t}/`)) ? LAYERS.length : -1;
};
const layerOf = (path: string) => LAYERS.find((l) => path.startsWith(`${l}/`)) ?? TOP.find((t) => path.startsWith(`${t}/`));

const files = [...LAYERS, ...TOP].flatMap(sources);
const imports = files.flatMap((file) =>
  [...readFileSync(join(ROOT, file), 'utf8').matchAll(/(?:from|import)\s*\(?\s*'(\.{1,2}\/[^']+)'/g)].map((m) => ({ file, target: normalize(join(dirname(file), m[1]!)) })),
);

describe('layers', () => {
  it('every source file belongs to a layer', () => {
    expect(files.filter((f) => rank(f) < 0)).toEqual([]);
    expect(files.length).toBeGreaterThan(60);
  });

  it('imports point down (or within a layer), never up', () => {
    const up = imports.filter(({ file, target }) => rank(target) > rank(file)).map(({ file, target }) => `${file} → ${target}`);
    expect(up).toEqual([]);
  });

  it('an import into another layer goes through its index.ts', () => {
    const inside = imports
      .filter(({ file, target }) => layerOf(target) !== layerOf(file) && LAYERS.includes(layerOf(target)!) && relative(layerOf(target)!, target) !== 'index.ts')
      .map(({ file, target }) => `${file} → ${target}`);
    expect(inside).toEqual([]);
  });

  it('below the algorithms, no code names an algorithm or its roles', () => {
    const below = files.filter((f) => rank(f) < LAYERS.indexOf('engine/algorithms'));
    const hits = below.flatMap((f) =>
      readFileSync(join(ROOT, f), 'utf8')
        .split('\n')
        .map((line, i) => ({ line, where: `${f}:${i + 1}` }))
        // "reward actor" is the reward protocol's word for a service on the bus, not a policy.
        .filter(({ line }) => /\b(ppo|grpo|rloo|remax|dpo|critics?)\b/i.test(line) || /(?<!reward )\bactors?\b/i.test(line.replace(/reward actors?/gi, ''))),
    );
    expect(hits.map((h) => `${h.where}: ${h.line.trim()}`)).toEqual([]);
  });
});
