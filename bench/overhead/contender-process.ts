/**
 * How the overhead benchmarks start a contender: by default on the compiled package, as users
 * run it (`dist/cjs`, built by `npm run build` when any lib/ source is newer, and the contender
 * itself transpiled to plain JavaScript, so that no tsx loader is in the process); with `--tsx`,
 * on the TypeScript sources through tsx (a diagnostic: tsx adds an export getter per call into
 * another module and a `defineProperty` per named arrow function, which the package does not pay).
 *
 * A contender named `<contender>@<git-ref>` (e.g. `router:round-robin@main`) runs the router of
 * that revision: its lib/ is extracted to bench/results/.rev-<commit>/ and compiled there, so
 * that one command compares a branch's request path with main's, stage by stage.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { startChild, type BenchChild } from '../lib/cpu';
import { contenderKind } from './scenario';

/** What the router contenders load: the compiled package, or the sources through tsx. */
export type LibraryBuild = 'dist' | 'tsx';

const ROOT = resolve(__dirname, '..', '..');
const DIST_ENTRY = join(ROOT, 'dist', 'cjs', 'index.js');
/** Inside the repository (ignored by git), so that the transpiled contender resolves node_modules. */
const COMPILED_DIR = join(ROOT, 'bench', 'results', '.contender');

/** Takes `--tsx` out of a benchmark's arguments. */
export function libraryBuildFrom(args: readonly string[]): { build: LibraryBuild; rest: string[] } {
  const rest = args.filter((arg) => arg !== '--tsx');
  return { build: rest.length === args.length ? 'dist' : 'tsx', rest };
}

/**
 * Makes the chosen build ready once per benchmark run: for `dist`, runs `npm run build` when
 * dist/ is missing or older than a lib/ source, and transpiles the contender next to it.
 */
export function prepareLibrary(build: LibraryBuild, ids: readonly string[]): void {
  for (const id of ids) {
    const ref = revisionOf(id);
    if (ref !== undefined) prepareRevision(ref, build);
  }
  if (build === 'tsx') return;
  const built = existsMtime(DIST_ENTRY);
  if (built === undefined || newestSource(join(ROOT, 'lib')) > built) {
    process.stderr.write('dist/ is missing or older than lib/: npm run build\n');
    execFileSync('npm', ['run', '--silent', 'build'], { cwd: ROOT, stdio: ['ignore', 'ignore', 'inherit'] });
  }
  const ts = require('typescript') as typeof import('typescript');
  mkdirSync(COMPILED_DIR, { recursive: true });
  for (const name of ['contender', 'scenario']) {
    const source = readFileSync(join(__dirname, `${name}.ts`), 'utf8');
    const { outputText } = ts.transpileModule(source, {
      compilerOptions: { module: ts.ModuleKind.CommonJS, target: ts.ScriptTarget.ES2022, esModuleInterop: true },
      fileName: `${name}.ts`,
    });
    writeFileSync(join(COMPILED_DIR, `${name}.js`), outputText);
  }
}

/** Starts one contender on the chosen build (see {@link prepareLibrary}, called first). */
export function startContender(
  id: string,
  upstreamUrl: string,
  build: LibraryBuild,
  core: number | undefined,
  nodeArgs: readonly string[] = [],
  launcher: readonly string[] = [],
  env: NodeJS.ProcessEnv = {},
): Promise<BenchChild> {
  const script = build === 'dist' ? join(COMPILED_DIR, 'contender.js') : join(__dirname, 'contender.ts');
  const ref = revisionOf(id);
  const root = ref === undefined ? ROOT : revisionDir(ref);
  const library = build === 'dist' ? join(root, 'dist', 'cjs', 'index.js') : join(root, 'lib', 'index.ts');
  const kind = contenderKind(ref === undefined ? id : id.slice(0, id.lastIndexOf('@')));
  return startChild(id, script, [kind, upstreamUrl], core, { ...env, DP_ROUTER_BENCH_LIB: library }, nodeArgs, launcher);
}

/** The git ref of a `<contender>@<ref>` name, if it has one. */
function revisionOf(id: string): string | undefined {
  const at = id.lastIndexOf('@');
  return at > 0 ? id.slice(at + 1) : undefined;
}

function revisionDir(ref: string): string {
  return join(ROOT, 'bench', 'results', `.rev-${commitOf(ref)}`);
}

function commitOf(ref: string): string {
  return execFileSync('git', ['rev-parse', '--verify', `${ref}^{commit}`], { cwd: ROOT, encoding: 'utf8' }).trim();
}

/** That revision's lib/ (and, for `dist`, its build with this checkout's compiler settings), kept for later runs. */
function prepareRevision(ref: string, build: LibraryBuild): void {
  const dir = revisionDir(ref);
  if (!existsSync(join(dir, 'lib', 'index.ts'))) {
    rmSync(dir, { recursive: true, force: true });
    mkdirSync(dir, { recursive: true });
    const archive = execFileSync('git', ['archive', '--format=tar', commitOf(ref), 'lib'], { cwd: ROOT, maxBuffer: 1 << 28 });
    execFileSync('tar', ['-x', '-C', dir], { input: archive });
  }
  if (build === 'tsx' || existsSync(join(dir, 'dist', 'cjs', 'index.js'))) return;
  process.stderr.write(`building ${ref} (${dir})\n`);
  const ts = require('typescript') as typeof import('typescript');
  const parsed = ts.getParsedCommandLineOfConfigFile(join(ROOT, 'tsconfig.json'), { noEmit: false, declaration: false, rootDir: join(dir, 'lib'), outDir: join(dir, 'dist', 'cjs') }, {
    ...ts.sys,
    onUnRecoverableConfigFileDiagnostic: () => undefined,
  });
  // Emitted whatever its type errors: that revision's own CI judged those.
  ts.createProgram({ rootNames: [join(dir, 'lib', 'index.ts')], options: parsed!.options }).emit();
}

/** How a run's figures were taken, for its first line. */
export function describeBuild(build: LibraryBuild): string {
  return build === 'dist' ? 'compiled package (dist/cjs), plain node' : 'TypeScript sources through tsx (diagnostic; the package does not pay tsx\'s costs)';
}

function existsMtime(path: string): number | undefined {
  try {
    return statSync(path).mtimeMs;
  } catch {
    return undefined;
  }
}

function newestSource(dir: string): number {
  let newest = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    newest = Math.max(newest, entry.isDirectory() ? newestSource(path) : statSync(path).mtimeMs);
  }
  return newest;
}
