import { afterAll, beforeAll, expect, it } from '@jest/globals';
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import packageJson from '../../package.json';
import { SCENARIO_CJS } from './consumer-sources';

/**
 * The README's install from git, as a user runs it: npm clones the repository, installs its
 * dependencies, runs only its `prepare` script, and packs what that left. The repository is a
 * clone of this working tree as it is now (tracked and untracked files, less what .gitignore
 * leaves out), reached by a `git+file://` URL in place of the README's `git+https://` one; the
 * packages the README's line names come at the versions this repository pins.
 */

const run = promisify(execFile);
const repo = join(__dirname, '..', '..');
const SLOW = 240_000;

let workspace: string;
let installed: { stderr: string } | undefined;

/** The README's `npm install` lines of its Install section: the tarball's and the git one. */
function readmeInstallLines(): { tarball: string[]; git: string[] } {
  const readme = readFileSync(join(repo, 'README.md'), 'utf8');
  const section = readme.slice(readme.indexOf('## Install'), readme.indexOf('\n## ', readme.indexOf('## Install') + 1));
  const packagesAfter = (pattern: RegExp): string[] => {
    const match = pattern.exec(section);
    if (match === null) throw new Error(`README.md's Install section has no line matching ${pattern}`);
    return match[1].trim().split(/\s+/);
  };
  return {
    tarball: packagesAfter(/npm install \.\.\/express-dp-router\/express-dp-router-\S+\.tgz ([^\n]*)/),
    git: packagesAfter(/^npm install git\+https:\/\/\S+ ([^\n]*)/m),
  };
}

/** A commit of the working tree as it is (`git add -A` into a private index), so that the clone is what a push would carry. */
async function workingTreeCommit(): Promise<string> {
  const env = { ...process.env, GIT_INDEX_FILE: join(workspace, 'index') };
  const git = async (...args: string[]) => (await run('git', args, { cwd: repo, env })).stdout.trim();
  await git('read-tree', 'HEAD');
  await git('add', '-A');
  const tree = await git('write-tree');
  return git('commit-tree', tree, '-p', 'HEAD', '-m', 'the working tree, for the git install test');
}

beforeAll(async () => {
  workspace = mkdtempSync(join(tmpdir(), 'dp-router-git-install-'));
  const commit = await workingTreeCommit();
  const clone = join(workspace, 'express-dp-router');
  await run('git', ['clone', '--quiet', '--shared', '--no-checkout', repo, clone]);
  await run('git', ['-C', clone, 'checkout', '--quiet', '--detach', commit]);

  const app = join(workspace, 'your-app');
  mkdirSync(app);
  writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'your-app', private: true }));
  const dev = packageJson.devDependencies as Record<string, string>;
  const pinned = readmeInstallLines().git.map((name) => (dev[name] === undefined ? name : `${name}@${dev[name]}`));
  // From the npm cache this repository's own install filled; a cache without some package's
  // metadata fills it once from the registry. `npm ci` caches tarballs but not every package's
  // metadata: offline, npm 11 then reports the missing metadata as ENOTCACHED or, for a peer
  // dependency, as an ERESOLVE that found the package at `undefined`.
  const install = (mode: string) =>
    run('npm', ['install', mode, '--no-audit', '--no-fund', '--loglevel=error', `git+file://${clone}`, ...pinned], { cwd: app, maxBuffer: 16 << 20, timeout: SLOW });
  installed = await install('--offline').catch((error: { stderr?: string }) => {
    const uncached = error.stderr?.includes('ENOTCACHED') === true || /ERESOLVE[\s\S]*Found: [\w@/.-]+@undefined/.test(error.stderr ?? '');
    if (!uncached) throw error;
    return install('--prefer-offline');
  });
  writeFileSync(join(app, 'scenario.cjs'), SCENARIO_CJS);
  writeFileSync(
    join(app, 'index.cjs'),
    `require('./scenario.cjs').run(require('express'), require('express-dp-router')).then((result) => process.stdout.write(JSON.stringify(result)), (error) => { console.error(error); process.exit(1); });\n`,
  );
}, SLOW);

afterAll(() => {
  if (workspace) rmSync(workspace, { recursive: true, force: true });
});

it('names the same packages in both README install lines, express and prom-client among them', () => {
  const { tarball, git } = readmeInstallLines();
  expect(git).toEqual(tarball);
  expect(git).toEqual(expect.arrayContaining(['express', 'prom-client']));
});

it(
  'installs a built package from git, which routes with the express the README line installs',
  async () => {
    expect(installed).toBeDefined();
    const app = join(workspace, 'your-app');
    const installedPackage = join(app, 'node_modules', 'express-dp-router');
    for (const file of ['dist/cjs/index.js', 'dist/cjs/index.d.ts', 'dist/esm/index.mjs', 'dist/esm/index.d.mts']) {
      expect([file, existsSync(join(installedPackage, file))]).toEqual([file, true]);
    }
    // What npm packed: the `files` of package.json, no sources or tests.
    expect(existsSync(join(installedPackage, 'lib'))).toBe(false);
    expect(existsSync(join(installedPackage, '__tests__'))).toBe(false);
    const { stdout } = await run(process.execPath, ['index.cjs'], { cwd: app, timeout: 20_000 });
    const result = JSON.parse(stdout) as { router: { status: number; seen: Array<{ lines: string[] }> } };
    expect(result.router.status).toBe(200);
    expect(result.router.seen).toHaveLength(1);
    expect(['0', '2', '4', '6']).toContain(result.router.seen[0].lines[0]);
  },
  SLOW,
);
