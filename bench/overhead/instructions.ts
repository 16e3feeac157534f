/**
 * npx tsx bench/overhead/instructions.ts [contenderA] [contenderB…] [requests] [bytes] [--tsx] [--keep] [--functions] [--warm-up=N]
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
 * prints where. `--functions` runs each contender with `--perf-basic-prof` (so that JIT code
 * is named) and prints the main thread's self instructions per request by area and by
 * function, and what each contender spends more than the first, function by function.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startChild, type BenchChild } from '../lib/cpu';
import { fixed, markdownTable } from '../lib/stats';
import { createPoster } from './client';
import { describeBuild, libraryBuildFrom, prepareLibrary, startContender, type LibraryBuild } from './contender-process';
import { areaOf, functionCosts, type FunctionCosts } from './instruction-functions';

/** Requests before counting starts (`--warm-up=N`): enough for V8 to have optimized the request path. */
let WARM_UP = 3000;

async function main(): Promise<void> {
  const warmUp = process.argv.find((arg) => arg.startsWith('--warm-up='));
  if (warmUp !== undefined) WARM_UP = Number(warmUp.slice('--warm-up='.length));
  const functions = process.argv.includes('--functions');
  const keep = process.argv.includes('--keep');
  const { build, rest } = libraryBuildFrom(process.argv.slice(2).filter((arg) => arg !== '--keep' && arg !== '--functions' && arg !== warmUp));
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
    // Settled, not raced: a contender that fails must not leave the others starting unseen.
    const settled = await Promise.allSettled(ids.map((id, index) => count(id, build, upstream.url, join(dir, `${index}.out`), Number(requests), Number(bytes), functions, keep)));
    const failure = settled.find((result) => result.status === 'rejected');
    if (failure !== undefined) throw failure.reason;
    const counts = settled.map((result) => (result as PromiseFulfilledResult<Awaited<ReturnType<typeof count>>>).value);
    const [base] = counts;
    const rows = counts.map(({ id, main, total }) => [id, fixed(main / 1000, 1), fixed(main / base.main, 3), fixed(total / 1000, 1), fixed(total / base.total, 3)]);
    process.stdout.write(`${requests} requests of ${bytes} B after ${WARM_UP} to warm up, ${describeBuild(build)}:\n\n`);
    process.stdout.write(`${markdownTable(['contender', 'k instr/req, main thread', `× ${a}`, 'k instr/req, all threads', `× ${a}`], rows)}\n`);
    if (functions) printFunctions(counts.map(({ id, functions: costs }) => ({ id, costs: costs! })), Number(requests));
    if (keep) process.stdout.write(`\ncallgrind files (${ids.map((id, index) => `${index}: ${id}`).join(', ')}; .1-01 is the main thread): ${dir}\n`);
  } finally {
    // A contender that failed to start leaves the others running: none may outlive the run.
    for (const child of running) child.kill();
    if (!keep) rmSync(dir, { recursive: true, force: true });
    await upstream.stop();
  }
}

const running = new Set<BenchChild>();

async function count(id: string, build: LibraryBuild, upstreamUrl: string, outFile: string, requests: number, bytes: number, functions: boolean, keep: boolean) {
  const callgrind = ['valgrind', '-q', '--tool=callgrind', '--instr-atstart=no', '--smc-check=all-non-file', '--separate-threads=yes', `--callgrind-out-file=${outFile}`];
  const child: BenchChild = await startContender(id, upstreamUrl, build, undefined, functions ? ['--perf-basic-prof', '--no-logfile-per-isolate', `--logfile=${outFile}.v8.log`] : [], callgrind);
  running.add(child);
  const poster = createPoster(bytes);
  try {
    await poster.run(WARM_UP, () => child.port);
    execFileSync('callgrind_control', ['--instr=on', String(child.process.pid)], { stdio: 'ignore' });
    await poster.run(requests, () => child.port);
    execFileSync('callgrind_control', ['--dump', String(child.process.pid)], { stdio: 'ignore' });
  } finally {
    poster.close();
    child.kill();
    running.delete(child);
  }
  // One dump file per thread: `<out>.1-01` is the main thread.
  let main = 0;
  let total = 0;
  let costs: FunctionCosts | undefined;
  const prefix = outFile.split('/').pop()!;
  for (const name of readdirSync(join(outFile, '..'))) {
    if (!name.startsWith(`${prefix}.`)) continue;
    const file = join(outFile, '..', name);
    const summary = /^(?:summary|totals):\s+(\d+)/m.exec(readFileSync(file, 'utf8'));
    if (!summary) continue;
    total += Number(summary[1]);
    if (!name.endsWith('-01')) continue;
    main += Number(summary[1]);
    if (functions) costs = functionCosts(file, `/tmp/perf-${child.process.pid}.map`);
  }
  if (main === 0) throw new Error(`${id}: callgrind wrote no counts`);
  // With --keep, the map goes next to the dump it names (callgrind_annotate shows JIT code by address).
  if (functions) renameOrRemove(`/tmp/perf-${child.process.pid}.map`, keep ? `${outFile}.perf.map` : undefined);
  return { id, main: main / requests, total: total / requests, functions: costs };
}

function renameOrRemove(from: string, to: string | undefined): void {
  if (to !== undefined && existsSync(from)) renameSync(from, to);
  else rmSync(from, { force: true });
}

/** Main-thread self instructions per request by area and by function; for each later contender, where it spends more than the first. */
function printFunctions(all: ReadonlyArray<{ id: string; costs: FunctionCosts }>, requests: number): void {
  const perRequest = (ir: number | undefined) => fixed((ir ?? 0) / requests / 1000, 2);
  const areas = all.map(({ costs }) => {
    const byArea = new Map<string, number>();
    for (const [label, ir] of costs) byArea.set(areaOf(label), (byArea.get(areaOf(label)) ?? 0) + ir);
    return byArea;
  });
  const areaNames = [...new Set(areas.flatMap((byArea) => [...byArea.keys()]))].sort((x, y) => (areas.at(-1)!.get(y) ?? 0) - (areas.at(-1)!.get(x) ?? 0));
  const areaRows = areaNames.map((area) => [area, ...areas.map((byArea) => perRequest(byArea.get(area)))]);
  process.stdout.write(`\nmain thread, k instructions per request by area:\n\n${markdownTable(['area', ...all.map(({ id }) => id)], areaRows)}\n`);
  const [base, ...others] = all;
  for (const { id, costs } of others) {
    const labels = new Set([...costs.keys(), ...base.costs.keys()]);
    const rows = [...labels]
      .map((label) => ({ label, diff: (costs.get(label) ?? 0) - (base.costs.get(label) ?? 0) }))
      .sort((x, y) => Math.abs(y.diff) - Math.abs(x.diff))
      .slice(0, 40)
      .map(({ label, diff }) => [label.slice(0, 110), perRequest(base.costs.get(label)), perRequest(costs.get(label)), perRequest(diff)]);
    process.stdout.write(`\n${id} − ${base.id}, main thread, k instructions per request, largest differences:\n\n${markdownTable(['function', base.id, id, 'difference'], rows)}\n`);
  }
}

main().catch((error: unknown) => {
  process.stderr.write(`${String(error instanceof Error ? error.message : error)}\n`);
  process.exit(1);
});
