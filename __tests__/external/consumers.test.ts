import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { execFile } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import packageJson from '../../package.json';
import {
  CJS_CONSUMER,
  ESM_CONSUMER,
  EXACT_ROUTING_CONSUMER,
  SCENARIO_CJS,
  TS_CJS_CONSUMER,
  TS_CONFIG,
  TS_DEFAULT_CONFIG,
  TS_DEFAULT_CONSUMER,
  TS_ESM_CONSUMER,
  TS_WRONG_OPTIONS,
} from './consumer-sources';

/**
 * The package as users get it: `npm pack` (which builds through `prepare`), then the tarball
 * installed into a throwaway directory in os.tmpdir() with three consumer projects sharing its
 * node_modules: CommonJS, ESM and TypeScript. The install is `npm ci --offline`, from the npm
 * cache that this repository's own `npm ci` filled, with the exact versions it pins.
 */

const run = promisify(execFile);
const repo = join(__dirname, '..', '..');
const tsc = join(repo, 'node_modules', 'typescript', 'bin', 'tsc');
const SLOW = 120_000;

let workspace: string;
let packedFiles: string[];

interface ScenarioResult {
  router: { status: number; decision: string; seen: Array<{ url: string; lines: string[] }>; metricsHaveRank6: boolean };
  rank: { status: number; seen: Array<{ url: string; lines: string[] }>; decision: Record<string, unknown>; inflightAfter: number };
}

const node = async (file: string): Promise<any> => JSON.parse((await run(process.execPath, [file], { cwd: workspace, timeout: 20_000 })).stdout);

/** A run started early and awaited by its test, so the consumers run side by side. */
type Started<T> = Promise<{ value: T } | { error: unknown }>;
const start = <T>(work: Promise<T>): Started<T> => work.then((value) => ({ value }), (error: unknown) => ({ error }));
async function finished<T>(started: Started<T> | undefined): Promise<T> {
  if (started === undefined) throw new Error('the consumer projects were not set up: see the first failure');
  const outcome = await started;
  if ('error' in outcome) throw outcome.error;
  return outcome.value;
}

let cjsRun: Started<any>;
let esmRun: Started<any>;
/** tsc's error lines; noEmitOnError is off, so the good files are emitted though wrong.ts fails. */
let tscRun: Started<string[]>;
/** tsc's error lines for the project compiled with the compiler's default target. */
let tscDefaultRun: Started<string[]>;

interface PackResult {
  filename: string;
  integrity: string;
  version: string;
  files: Array<{ path: string }>;
}

type LockEntry = Record<string, unknown> & {
  dependencies?: Record<string, string>;
  optionalDependencies?: Record<string, string>;
  peerDependencies?: Record<string, string>;
};

/**
 * The consumer's lockfile: the tarball, plus the entries of this repository's lockfile that
 * the consumer's dependencies reach, at the same locations (so the same versions, resolved
 * the same way, all already in the npm cache).
 */
function consumerLockfile(dependencies: Record<string, string>, packed: PackResult): object {
  const ours = JSON.parse(readFileSync(join(repo, 'package-lock.json'), 'utf8')) as { packages: Record<string, LockEntry> };
  const available: Record<string, LockEntry> = {
    ...ours.packages,
    'node_modules/express-dp-router': {
      name: 'express-dp-router',
      version: packed.version,
      resolved: `file:${packed.filename}`,
      integrity: packed.integrity,
      license: packageJson.license,
      dependencies: packageJson.dependencies,
      peerDependencies: packageJson.peerDependencies,
      peerDependenciesMeta: packageJson.peerDependenciesMeta,
      engines: packageJson.engines,
    },
  };
  const picked: Record<string, LockEntry> = {};
  /** Node's lookup: the nearest node_modules/<name> from `location` up to the root. */
  const resolveFrom = (location: string, name: string): string | undefined => {
    for (let dir = location; ; ) {
      const candidate = `${dir === '' ? '' : `${dir}/`}node_modules/${name}`;
      if (available[candidate] !== undefined) return candidate;
      if (dir === '') return undefined;
      const parent = dir.lastIndexOf('/node_modules/');
      dir = parent < 0 ? '' : dir.slice(0, parent);
    }
  };
  const visit = (location: string): void => {
    if (picked[location] !== undefined) return;
    const { dev, devOptional, peer, ...entry } = available[location];
    void [dev, devOptional, peer];
    picked[location] = entry;
    for (const name of Object.keys({ ...entry.dependencies, ...entry.optionalDependencies, ...entry.peerDependencies })) {
      const found = resolveFrom(location, name);
      if (found !== undefined) visit(found);
    }
  };
  for (const name of Object.keys(dependencies)) visit(`node_modules/${name}`);
  return { name: 'consumers', lockfileVersion: 3, requires: true, packages: { '': { name: 'consumers', dependencies }, ...picked } };
}

beforeAll(async () => {
  workspace = mkdtempSync(join(tmpdir(), 'dp-router-consumers-'));
  const packed = await run('npm', ['pack', '--json', '--pack-destination', workspace], { cwd: repo, maxBuffer: 16 << 20 });
  const [info] = JSON.parse(packed.stdout) as PackResult[];
  packedFiles = info.files.map((file) => file.path).sort();

  const dev = packageJson.devDependencies;
  const dependencies: Record<string, string> = {
    'express-dp-router': `file:${info.filename}`,
    express: dev.express,
    express4: dev.express4,
    'prom-client': dev['prom-client'],
    '@types/express': dev['@types/express'],
    '@types/express4': dev['@types/express4'],
    '@types/node': dev['@types/node'],
  };
  writeFileSync(join(workspace, 'package.json'), JSON.stringify({ name: 'consumers', private: true, dependencies }, null, 2));
  writeFileSync(join(workspace, 'package-lock.json'), JSON.stringify(consumerLockfile(dependencies, info), null, 2));
  // `npm ci` with a lockfile reads the same package metadata our own `npm ci` cached (a plain
  // `npm install` would want full packuments, which that cache does not hold). A cache filled
  // some other way (`npm install` on a workstation) may lack an entry: then fill it once.
  const install = (mode: string) =>
    run('npm', ['ci', mode, '--no-audit', '--no-fund', '--ignore-scripts', '--loglevel=error'], { cwd: workspace, maxBuffer: 16 << 20 });
  await install('--offline').catch((error: { stderr?: string }) => {
    if (!error.stderr?.includes('ENOTCACHED')) throw error;
    return install('--prefer-offline');
  });

  const write = (path: string, text: string) => {
    mkdirSync(join(workspace, path, '..'), { recursive: true });
    writeFileSync(join(workspace, path), text);
  };
  write('shared/scenario.cjs', SCENARIO_CJS);
  write('cjs/package.json', '{ "type": "commonjs" }');
  write('cjs/index.js', CJS_CONSUMER);
  write('cjs/exact.js', EXACT_ROUTING_CONSUMER);
  write('esm/package.json', '{ "type": "module" }');
  write('esm/index.js', ESM_CONSUMER);
  write('ts/package.json', '{ "type": "module" }');
  write('ts/tsconfig.json', TS_CONFIG);
  write('ts/src/app.ts', TS_ESM_CONSUMER);
  write('ts/src/legacy.cts', TS_CJS_CONSUMER);
  write('ts/src/wrong.ts', TS_WRONG_OPTIONS);
  write('ts-default/tsconfig.json', TS_DEFAULT_CONFIG);
  write('ts-default/app.ts', TS_DEFAULT_CONSUMER);

  cjsRun = start(node('cjs/index.js'));
  esmRun = start(node('esm/index.js'));
  const compile = (project: string): Promise<string[]> =>
    run(process.execPath, [tsc, '-p', '.', '--pretty', 'false'], { cwd: join(workspace, project) }).then(
      () => [],
      (error: { stdout?: string }) => (error.stdout ?? String(error)).split('\n').filter((line) => /error TS\d+/.test(line)),
    );
  tscRun = start(compile('ts'));
  tscDefaultRun = start(compile('ts-default'));
}, SLOW);

afterAll(() => {
  if (workspace) rmSync(workspace, { recursive: true, force: true });
});

it('packs only what users need', () => {
  expect(packedFiles.filter((path) => !path.startsWith('dist/'))).toEqual(['CHANGELOG.md', 'LICENSE', 'README.md', 'package.json']);
  expect(packedFiles).toEqual(expect.arrayContaining(['dist/cjs/index.js', 'dist/cjs/index.d.ts', 'dist/esm/index.mjs', 'dist/esm/index.d.mts']));
  expect(packedFiles.some((path) => /\.test\.|__tests__|example-server|bench\//.test(path))).toBe(false);
});

/** The checks each consumer makes of one gateway pass, on Express 5 and on Express 4. */
function expectCleanRouting(result: ScenarioResult): void {
  expect(result.router.status).toBe(200);
  expect(result.router.seen).toHaveLength(1);
  expect(result.router.seen[0].url).toBe('/v1/chat/completions');
  expect(result.router.seen[0].lines).toHaveLength(1);
  expect(['0', '2', '4', '6']).toContain(result.router.seen[0].lines[0]);
  expect(result.router.decision).toBe(`upstream=node-a; rank=${result.router.seen[0].lines[0]}; source=assigned`);
  expect(result.router.metricsHaveRank6).toBe(true);

  expect(result.rank.status).toBe(200);
  expect(result.rank.seen).toHaveLength(1);
  expect(result.rank.seen[0].lines).toEqual([String(result.rank.decision.rank)]);
  expect(result.rank.decision).toMatchObject({ upstream: 'node-a', source: 'assigned', headerValue: result.rank.seen[0].lines[0] });
  expect(result.rank.inflightAfter).toBe(0);
}

describe('CommonJS consumer (require)', () => {
  it(
    'loads dist/cjs, keeps internals private, and routes on Express 5 and 4',
    async () => {
      const { facts, express5, express4 } = await finished(cjsRun);
      expect(facts.entry).toMatch(/node_modules[/\\]express-dp-router[/\\]dist[/\\]cjs[/\\]index\.js$/);
      expect(facts.defaultIsDpRouter).toBe(true);
      expect(facts.dpRankType).toBe('function');
      expect(facts.version).toBe(packageJson.version);
      expect(facts.deepImport).toBe('ERR_PACKAGE_PATH_NOT_EXPORTED');
      expect(facts.exportNames).toContain('dpRank');
      expectCleanRouting(express5);
      expectCleanRouting(express4);
    },
    SLOW,
  );
});

describe('ESM consumer (import)', () => {
  it(
    'loads dist/esm, shares one implementation with require, and routes on Express 5 and 4',
    async () => {
      const { facts, express5, express4 } = await finished(esmRun);
      const cjs = await finished(cjsRun);
      expect(facts.entry).toMatch(/node_modules\/express-dp-router\/dist\/esm\/index\.mjs$/);
      expect(facts.defaultIsDpRouter).toBe(true);
      expect(facts.sameImplementationAsRequire).toBe(true);
      expect(facts.parsed).toEqual({ ok: true, rank: 4 });
      expect(facts.exportNames).toEqual(cjs.facts.exportNames);
      expectCleanRouting(express5);
      expectCleanRouting(express4);
    },
    SLOW,
  );
});

describe('TypeScript consumer (tsc, module nodenext)', () => {
  let diagnostics: string[];

  beforeAll(async () => {
    diagnostics = await finished(tscRun);
  }, SLOW);

  it('compiles every option, the default export and req.dpRank on Express 5 and 4 without an error', () => {
    expect(diagnostics.filter((line) => !line.startsWith('src/wrong.ts('))).toEqual([]);
  });

  it('fails to compile a wrong option, one error per wrong line', () => {
    const byLine = new Map(diagnostics.map((line) => [Number(/^src\/wrong\.ts\((\d+),/.exec(line)?.[1]), line]));
    expect([...byLine.keys()].sort()).toEqual([4, 5, 6, 7]);
    expect(byLine.get(4)).toMatch(/"fastest"/);
    expect(byLine.get(5)).toMatch(/dataParalelSize.*Did you mean to write 'dataParallelSize'/);
    expect(byLine.get(6)).toMatch(/'string' is not assignable to type 'boolean \| \(\(req: IncomingMessage\) => boolean\)/);
    expect(byLine.get(7)).toMatch(/"local-rank"/);
  });

  it(
    'runs the compiled ESM and CommonJS output',
    async () => {
      const esm = await node('ts/out/app.js');
      expect(esm.routed).toEqual({ status: 200, decision: 'upstream=node-a; rank=4; source=hint' });
      expect(esm.ranked).toEqual({ status: 200, decision: 'upstream=node-a; rank=6; source=hint' });
      expect(esm.seen).toEqual(['4', '6']);
      expect(esm.decision).toMatchObject({ upstream: 'node-a', rank: 6, source: 'hint', headerValue: '6' });
      expect(esm.parsed).toEqual({ ok: false, reason: 'malformed' });
      expect(await node('ts/out/legacy.cjs')).toEqual({ router: 'function', rank: 2 });
    },
    SLOW,
  );
});

describe('TypeScript consumer with the compiler\'s defaults (no target: ES5, declarations checked)', () => {
  it(
    'compiles the README\'s "Mount it" without an error',
    async () => {
      expect(await finished(tscDefaultRun)).toEqual([]);
    },
    SLOW,
  );
});

describe('a consumer without the optional packages of exact routing', () => {
  it(
    '48.14: is told every missing package in one line, with one install command and no require stack',
    async () => {
      const tokenizer = join(repo, 'example-server', 'mock-vllm', 'tokenizer');
      const { stdout } = await run(process.execPath, [join(workspace, 'cjs', 'exact.js'), tokenizer], { cwd: workspace, timeout: 20_000 });
      const thrown = JSON.parse(stdout) as { name: string; code: string; message: string };
      expect(thrown).toMatchObject({ name: 'OptionError', code: 'ERR_DPR_OPTION' });
      expect(thrown.message).not.toContain('\n');
      expect(thrown.message).not.toMatch(/Require stack|node_modules/);
      expect(thrown.message).toMatch(/^express-dp-router: `prefixAware\.tokenizer` cannot be read: Tokenizing prompts needs the optional package "@huggingface\/tokenizers", which is not installed; "zeromq" and "@huggingface\/jinja" are not installed either\. Install them with: npm install zeromq @huggingface\/tokenizers @huggingface\/jinja\.$/);
    },
    SLOW,
  );
});
