import { afterAll, beforeAll, expect, it } from '@jest/globals';
import { execFile } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import packageJson from '../../package.json';

/**
 * Installed from a folder (`npm install ../express-dp-router`, as `npm link` does), the package
 * is a symlink to the clone, whose own node_modules/prom-client is what the router loads: the
 * app's `require('prom-client').register` never shows its series. The router says so at
 * creation; installed from the packed tarball (README, Install) it has the app's prom-client and
 * says nothing. Real npm installs into temporary apps, from the npm cache this repository's own
 * install filled (a cache without some package's metadata fills it once from the registry).
 */

const run = promisify(execFile);
const repo = join(__dirname, '..', '..');
const SLOW = 240_000;
const dev = packageJson.devDependencies as Record<string, string>;
const PEERS = [`express@${dev.express}`, `prom-client@${dev['prom-client']}`];

let workspace: string;

/** An app that installed `spec` and the README's peers. */
async function app(name: string, spec: string): Promise<string> {
  const dir = join(workspace, name);
  mkdirSync(dir);
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ name, private: true }));
  const install = (mode: string) => run('npm', ['install', mode, '--no-audit', '--no-fund', '--loglevel=error', spec, ...PEERS], { cwd: dir, maxBuffer: 16 << 20, timeout: SLOW });
  await install('--offline').catch((error: { stderr?: string }) => {
    if (!error.stderr?.includes('ENOTCACHED')) throw error;
    return install('--prefer-offline');
  });
  // The README's mount, on the global registry, and a second router given the app's registry.
  writeFileSync(
    join(dir, 'index.cjs'),
    `const { register } = require('prom-client');
const { dpRouter } = require('express-dp-router');
const upstreams = [{ url: 'http://127.0.0.1:9', dataParallelSize: 2 }];
const warnings = { defaulted: [], given: [] };
const defaulted = dpRouter({ upstreams, logger: { warn: (message) => warnings.defaulted.push(message) } });
(async () => {
  const seen = (await register.metrics()).includes('dp_router_requests_total');
  await defaulted.close();
  const given = dpRouter({ upstreams, metrics: { registry: register, prefix: 'given_' }, logger: { warn: (message) => warnings.given.push(message) } });
  const seenGiven = (await register.metrics()).includes('given_requests_total');
  await given.close();
  process.stdout.write(JSON.stringify({ warnings, seen, seenGiven }));
})().catch((error) => { console.error(error); process.exit(1); });
`,
  );
  return dir;
}

async function runApp(dir: string): Promise<{ warnings: { defaulted: string[]; given: string[] }; seen: boolean; seenGiven: boolean }> {
  const { stdout } = await run(process.execPath, ['index.cjs'], { cwd: dir, timeout: 20_000 });
  return JSON.parse(stdout);
}

beforeAll(async () => {
  workspace = mkdtempSync(join(tmpdir(), 'dp-router-folder-install-'));
  // A folder install links the clone as it is: its dist/ as `prepare` builds it (skipped when built from these sources).
  await run('npm', ['run', 'build', '--silent'], { cwd: repo, timeout: SLOW });
}, SLOW);

afterAll(() => {
  if (workspace) rmSync(workspace, { recursive: true, force: true });
});

it(
  '48.15: warns at creation when installed from a folder, whose prom-client is not the app\'s; the app\'s registry given, the series are there and nothing is said',
  async () => {
    const result = await runApp(await app('folder-app', repo));
    expect(result.seen).toBe(false);
    expect(result.warnings.defaulted).toHaveLength(1);
    expect(result.warnings.defaulted[0]).toMatch(/^express-dp-router: its metrics go to the global registry of the prom-client at .+, but this app's require\('prom-client'\) is the one at .+folder-app\/node_modules\/prom-client: .*install the packed tarball instead/);
    expect(result.seenGiven).toBe(true);
    expect(result.warnings.given).toEqual([]);
  },
  SLOW,
);

it(
  '48.15: says nothing when installed from the packed tarball: the router counts on the app\'s registry',
  async () => {
    await run('npm', ['pack', '--silent', '--pack-destination', workspace], { cwd: repo, timeout: SLOW });
    const tarball = readdirSync(workspace).find((file) => file.endsWith('.tgz'))!;
    const result = await runApp(await app('tarball-app', join(workspace, tarball)));
    expect(result.warnings).toEqual({ defaulted: [], given: [] });
    expect(result.seen).toBe(true);
  },
  SLOW,
);
