/**
 * What `.ci/run` gives jest on each Node line (`ci_jest_args` of .ci/node.sh), asked of jest
 * itself: every test file runs on every line, except the install-path tests (`npm pack` into
 * consumer projects, the install from git), which run on exactly one.
 */
import { describe, expect, it } from '@jest/globals';
import { execFileSync } from 'node:child_process';
import { join, relative } from 'node:path';

const ROOT = join(__dirname, '..');
const JEST = join(ROOT, 'node_modules', 'jest', 'bin', 'jest.js');

/** A bash line run with .ci/node.sh sourced, its output's lines. */
function ciShell(line: string): string[] {
  return execFileSync('bash', ['-c', `source .ci/node.sh && ${line}`], { cwd: ROOT, encoding: 'utf8' }).split('\n').filter(Boolean);
}

/** The test files jest runs with these arguments, relative to the repository. */
function testFiles(args: readonly string[]): string[] {
  const listed = execFileSync(process.execPath, [JEST, '--selectProjects', 'express5', '--listTests', ...args], { cwd: ROOT, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
  return listed.split('\n').filter((line) => line.endsWith('.ts')).map((file) => relative(ROOT, file)).sort();
}

describe('.ci/run on each Node line', () => {
  it('48.22: runs every test file on every line, and the install-path tests (__tests__/external) on exactly one', () => {
    const majors = ciShell('echo "${CI_NODE_MAJORS[@]}"')[0].split(' ');
    expect(majors.length).toBeGreaterThan(1);
    const all = testFiles([]);
    const install = all.filter((file) => file.startsWith('__tests__/external/'));
    expect(install).toEqual(['__tests__/external/consumers.test.ts', '__tests__/external/folder-install.test.ts', '__tests__/external/git-install.test.ts']);
    const linesWithInstall: string[] = [];
    for (const major of majors) {
      const files = testFiles(ciShell(`ci_jest_args ${major}`));
      if (files.some((file) => install.includes(file))) linesWithInstall.push(major);
      expect([major, all.filter((file) => !files.includes(file) && !install.includes(file))]).toEqual([major, []]);
    }
    expect(linesWithInstall).toEqual([ciShell('echo "$CI_INSTALL_TESTS_MAJOR"')[0]]);
  }, 60_000);
});
