/**
 * npx tsx bench/overhead/instructions.ts [contenderA] [contenderB] [requests] [bytes]
 * (npm run bench:instructions -- ...)
 *
 * Instructions per request, counted by valgrind (callgrind), for two contenders side by side:
 * unlike time, an instruction count does not move with a noisy neighbour, so differences of
 * a percent or two can be seen. Each contender runs under callgrind with counting switched
 * on only for `requests` requests after a warm-up; the main thread (JavaScript, and the
 * garbage collection it triggers) and the total over all threads (with the concurrent
 * compiler and marker, which vary from run to run) are reported. Needs valgrind (Debian:
 * `apt-get install valgrind`); each contender runs about 50 times slower under it.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startChild, type BenchChild } from '../lib/cpu';
import { fixed, markdownTable } from '../lib/stats';
import { createPoster } from './client';
import { contenderKind } from './scenario';

const WARM_UP = 3000;

async function main(): Promise<void> {
  const [a = 'baseline', b = 'router:round-robin', requests = '5000', bytes = '256'] = process.argv.slice(2);
  try {
    execFileSync('valgrind', ['--version'], { stdio: 'ignore' });
  } catch {
    throw new Error('valgrind is not installed (Debian: apt-get install valgrind)');
  }
  const upstream = await startChild('upstream', join(__dirname, 'upstream.ts'), [], undefined);
  const dir = mkdtempSync(join(tmpdir(), 'dp-router-instructions-'));
  try {
    // Both at once: instruction counts do not depend on sharing the machine.
    const counts = await Promise.all([a, b].map((id, index) => count(id, upstream.url, join(dir, `${index}.out`), Number(requests), Number(bytes))));
    const [base] = counts;
    const rows = counts.map(({ id, main, total }) => [id, fixed(main / 1000, 1), fixed(main / base.main, 3), fixed(total / 1000, 1), fixed(total / base.total, 3)]);
    process.stdout.write(`${requests} requests of ${bytes} B after ${WARM_UP} to warm up:\n\n`);
    process.stdout.write(`${markdownTable(['contender', 'k instr/req, main thread', `× ${a}`, 'k instr/req, all threads', `× ${a}`], rows)}\n`);
  } finally {
    await upstream.stop();
  }
}

async function count(id: string, upstreamUrl: string, outFile: string, requests: number, bytes: number) {
  const callgrind = ['valgrind', '-q', '--tool=callgrind', '--instr-atstart=no', '--smc-check=all-non-file', '--separate-threads=yes', `--callgrind-out-file=${outFile}`];
  const child: BenchChild = await startChild(id, join(__dirname, 'contender.ts'), [contenderKind(id), upstreamUrl], undefined, {}, [], callgrind);
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
