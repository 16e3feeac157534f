import { execFile } from 'node:child_process';
import { resolve } from 'node:path';

/** The repository root: benchmarks run from there, as `npm run bench:*` runs them. */
export const ROOT = resolve(__dirname, '..', '..');

export interface BenchRun {
  code: number;
  stdout: string;
  stderr: string;
}

/**
 * Runs a benchmark script as `npm run` does (`node --import tsx bench/…`), so the tests drive the
 * benchmarks through their command lines and import nothing from bench/. Resolves with the exit
 * code whatever it is, so a test can read what the run wrote before judging it.
 */
export function runBench(script: string, args: readonly string[], timeoutMs: number): Promise<BenchRun> {
  return new Promise((done, fail) => {
    execFile(
      process.execPath,
      // http-proxy (under http-proxy-middleware 3) calls util._extend, which Node 22 and later
      // deprecate with one DEP0060 line on stderr; anything else a bench writes there still shows.
      ['--disable-warning=DEP0060', '--import', 'tsx', resolve(ROOT, script), ...args],
      { cwd: ROOT, maxBuffer: 16 * 1024 * 1024, timeout: timeoutMs },
      (error, stdout, stderr) => {
        const code = error ? error.code : 0;
        if (typeof code !== 'number') fail(new Error(`${script} did not finish: ${error?.message}\n${stderr}`));
        else done({ code, stdout, stderr });
      },
    );
  });
}
