import { describe, expect, it } from '@jest/globals';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';

// The house rules a reviewer would otherwise check by hand (issue 41 item 24): small files in
// lib/, a README that stays a front page, and tests that do not lean on the benchmarks' code.
const ROOT = join(__dirname, '..');

function filesUnder(dir: string, suffix: string): string[] {
  return readdirSync(dir, { withFileTypes: true, recursive: true })
    .filter((entry) => entry.isFile() && entry.name.endsWith(suffix))
    .map((entry) => join(entry.parentPath, entry.name));
}

function lineCount(file: string): number {
  const text = readFileSync(file, 'utf8');
  return text.split('\n').length - (text.endsWith('\n') ? 1 : 0);
}

/** The relative imports of each file in lib/ (type-only, re-exports and `declare module` augmentations count), as lib-relative paths. */
function libImports(): Array<readonly [string, string]> {
  const lib = join(ROOT, 'lib');
  const IMPORT = /(?:^|[\s;])(?:import|export)\s+(?:type\s+)?(?:[^'";]*?\sfrom\s+)?['"](\.[^'"]+)['"]|import\(\s*['"](\.[^'"]+)['"]\s*\)|declare\s+module\s+['"](\.[^'"]+)['"]/g;
  const edges: Array<readonly [string, string]> = [];
  for (const file of filesUnder(lib, '.ts')) {
    const text = readFileSync(file, 'utf8').replace(/\/\*[\s\S]*?\*\//g, '').replace(/^\s*\/\/.*$/gm, '');
    for (const match of text.matchAll(IMPORT)) {
      const base = join(file, '..', match[1] ?? match[2] ?? match[3]);
      const target = [`${base}.ts`, join(base, 'index.ts')].find((candidate) => existsSync(candidate));
      if (target !== undefined) edges.push([relative(lib, file), relative(lib, target)]);
    }
  }
  return edges;
}

/** A lib/ file's unit in the layering: its top folder (`request/`), or itself for a root file (`options.ts`). */
function unitOf(file: string): string {
  const slash = file.indexOf('/');
  return slash === -1 ? file : file.slice(0, slash + 1);
}

/**
 * The floors and the core of lib/ (issue 45, docs/architecture.md); every other folder is a
 * feature, a new one included, and is reached through its registration, its options and the
 * exports only.
 */
// `verdicts/` is a service, not a feature: the one rule every check that changes routing for
// everyone consults (issue 46), so each of those checks imports it.
const LAYERS = new Set(['http/', 'observe/', 'verdicts/', 'upstreams/', 'policies/', 'request/', 'forward/', 'compose/']);

describe('the house', () => {
  it('keeps every file in lib/ at 400 lines or fewer', () => {
    const long = filesUnder(join(ROOT, 'lib'), '.ts')
      .map((file) => [relative(ROOT, file), lineCount(file)] as const)
      .filter(([, lines]) => lines > 400);
    expect(long).toEqual([]);
  });

  it('keeps the README under 450 lines', () => {
    expect(lineCount(join(ROOT, 'README.md'))).toBeLessThan(450);
  });

  it('has no test outside __tests__/bench import from bench/', () => {
    const benchDir = join(ROOT, 'bench');
    const importsBench = filesUnder(join(ROOT, '__tests__'), '.ts')
      .filter((file) => !file.startsWith(join(ROOT, '__tests__', 'bench')))
      .filter((file) => {
        for (const match of readFileSync(file, 'utf8').matchAll(/\bfrom\s+['"](\.[^'"]+)['"]|import\(\s*['"](\.[^'"]+)['"]\s*\)/g)) {
          const target = join(file, '..', match[1] ?? match[2]);
          if (target === benchDir || target.startsWith(benchDir + '/')) return true;
        }
        return false;
      })
      .map((file) => relative(ROOT, file));
    expect(importsBench).toEqual([]);
  });

  it('has at most 3 pairs of lib/ folders that import each other (a root file counts as one)', () => {
    const units = new Set(libImports().map(([from, to]) => `${unitOf(from)} ${unitOf(to)}`));
    const mutual = [...units]
      .map((pair) => pair.split(' '))
      .filter(([from, to]) => from < to && units.has(`${to} ${from}`))
      .map(([from, to]) => `${from} <-> ${to}`);
    expect(mutual.length > 3 ? mutual : []).toEqual([]);
  });

  it('has each feature folder imported by at most 4 lib files outside it (its registration, options, exports)', () => {
    const edges = libImports();
    const features = [...new Set(edges.map(([from]) => unitOf(from)))].filter((unit) => unit.endsWith('/') && !LAYERS.has(unit));
    // The ones the issue named are features whatever the folders hold.
    expect(features).toEqual(expect.arrayContaining(['admission/', 'peers/', 'receipts/', 'pools/', 'exact-prefix/', 'disaggregation/']));
    const crowded = features
      .map((feature) => [feature, [...new Set(edges.filter(([from, to]) => unitOf(to) === feature && unitOf(from) !== feature).map(([from]) => from))]] as const)
      .filter(([, importers]) => importers.length > 4);
    expect(crowded).toEqual([]);
  });
});
