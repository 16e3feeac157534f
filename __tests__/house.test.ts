import { describe, expect, it } from '@jest/globals';
import { readdirSync, readFileSync } from 'node:fs';
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
});
