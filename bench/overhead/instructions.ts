/**
 * npx tsx bench/overhead/instructions.ts [contenderA] [contenderB…] [requests] [bytes] [--tsx] [--keep]
 * (npm run bench:instructions -- ...)
 *
 * Instructions per request, counted by valgrind (callgrind), for contenders side by side (the
 * first is the one the others are divided by):
 * unlike time, an instruction count does not move with a noisy neighbour, so differences of
 * a percent or two can be seen. Each contender runs under callgrind with counting switched
 * on only for `requests` requests after a warm-up; the main thread (JavaScript, and the
 * garbage collection it triggers) and the total over all threads (with the concurrent
 * compiler and marker, which vary from run to run) are reported. Needs valgrind (Debian:
 * `apt-get install valgrind`); each contender runs about 50 times slower under it.
 *
 * Contenders run the compiled package (dist/, rebuilt when lib/ is newer); `--tsx` runs the
 * sources through tsx instead (diagnostic). `<contender>@<git-ref>` runs that revision's router
 * (contender-process.ts): `router:round-robin@main router:round-robin` is a branch's cost per
 * request next to main's. `--keep` keeps the callgrind files (for callgrind_annotate) and
 * prints where.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startChild, type BenchChild } from '../lib/cpu';
import { fixed, markdownTable } from '../lib/stats';
import { createPoster } from './client';
import { describeBuild, libraryBuildFrom, prepareLibrary, startContender, type LibraryBuild } from './contender-process';

const WARM_UP = 3000;

async function main(): Promise<void> {
  const keep = process.argv.includes('--keep');
  const { build, rest } = libraryBuildFrom(process.argv.slice(2).filter((arg) => arg !== '--keep'));
  // Any number of contenders (the first is the reference), then requests and body bytes.
  const ids = rest.filter((arg) => !/^\d+$/.test(arg));
  const [requests = '5000', bytes = '256'] = rest.filter((arg) => /^\d+$/.test(arg));
  if (ids.length === 0) ids.push('baseline');
  if (ids.length === 1) ids.push('router:round-robin');
  const [a] = ids;
  try {
    execFileSync('valgrind', ['--version'], { stdio: 'ignore' });
  } catch {
    throw new Error('valgrind is not installed (Debian: apt-get install valgrind)');
  }
  prepareLibrary(build, ids);
  const upstream = await startChild('upstream', join(__dirname, 'upstream.ts'), [], undefined);
  const dir = mkdtempSync(join(tmpdir(), 'dp-router-instructions-'));
  try {
    // Both at once: instruction counts do not depend on sharing the machine.
    const counts = await Promise.all(ids.map((id, index) => count(id, build, upstream.url, join(dir, `${index}.out`), Number(requests), Number(bytes))));
    const [base] = counts;
    const rows = counts.map(({ id, main, total }) => [id, fixed(main / 1000, 1), fixed(main / base.main, 3), fixed(total / 1000, 1), fixed(total / base.total, 3)]);
    process.stdout.write(`${requests} requests of ${bytes} B after ${WARM_UP} to warm up, ${describeBuild(build)}:\n\n`);
    process.stdout.write(`${markdownTable(['contender', 'k instr/req, main thread', `× ${a}`, 'k instr/req, all threads', `× ${a}`], rows)}\n`);
    if (keep) process.stdout.write(`\ncallgrind files (${ids.map((id, index) => `${index}: ${id}`).join(', ')}; .1-01 is the main thread): ${dir}\n`);
  } finally {
    if (!keep) rmSync(dir, { recursive: true, force: true });
    await upstream.stop();
  }
}

async function count(id: string, build: LibraryBuild, upstreamUrl: string, outFile: string, requests: number, bytes: number) {
  const callgrind = ['valgrind', '-q', '--tool=callgrind', '--instr-atstart=no', '--smc-check=all-non-file', '--separate-threads=yes', `--callgrind-out-file=${outFile}`];
  const child: BenchChild = await startContender(id, upstreamUrl, build, undefined, [], callgrind);
  const poster = createPoster(bytes);
  try {
    await poster.run(WARM_UP, () => child.port);
    execFileSync('callgrind_control', ['--instr=on', String(child.process.pid)], { stdio: 'ignore' });
    await poster.run(requests, () => child.port);
    execFileSync('callgrind_control', ['--dump', String(child.process.pid)], { stdio: 'ignore' });
  } finally {
    poster.close();
    child.process.kill('SIGKILL');
  }
  // One dump file per thread: `<out>.1-01` is the main thread.
  let main = 0;
  let total = 0;
  const prefix = outFile.split('/').pop()!;
  for (const name of readdirSync(join(outFile, '..'))) {
    if (!name.startsWith(`${prefix}.`)) continue;
    const summary = /^(?:summary|totals):\s+(\d+)/m.exec(readFileSync(join(outFile, '..', name), 'utf8'));
    if (!summary) continue;
    total += Number(summary[1]);
    if (name.endsWith('-01')) main += Number(summary[1]);
  }
  if (main === 0) throw new Error(`${id}: callgrind wrote no counts`);
  return { id, main: main / requests, total: total / requests };
}

main().catch((error: unknown) => {
  process.stderr.write(`${String(error instanceof Error ? error.message : error)}\n`);
  process.exit(1);
});
