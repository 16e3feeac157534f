/**
 * npx tsx bench/stream/profile.ts [contender] [seconds] [--tsx] [--no-pin]
 *
 * Where a contender's CPU goes per streamed chunk: runs it under `--cpu-prof` (same layout as
 * bench:stream) while 64 streams of 200 chunks, one every 2 ms, run through it back to back,
 * and prints the functions with the most self time, grouped by area (bench/lib/cpu-profile.ts).
 * e.g. npx tsx bench/stream/profile.ts router:least-outstanding+tokens 10
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { coreCount, hasTaskset, pinSelf, startChild } from '../lib/cpu';
import { summarizeProfile } from '../lib/cpu-profile';
import { describeBuild, libraryBuildFrom, prepareLibrary, startContender } from '../overhead/contender-process';
import { createStreamClient } from './client';

async function main(): Promise<void> {
  const { build, rest: args } = libraryBuildFrom(process.argv.slice(2));
  const rest = args.filter((arg) => arg !== '--no-pin');
  const [id = 'router:least-outstanding', seconds = '10'] = rest;
  prepareLibrary(build, [id]);
  // Unpinned on a machine whose core 0 other benchmarks pin their load to as well.
  const pinned = rest.length === args.length && coreCount() >= 2 && hasTaskset() && pinSelf(0);
  const dir = mkdtempSync(join(tmpdir(), 'dp-router-stream-prof-'));
  const upstream = await startChild('upstream', join(__dirname, 'upstream.ts'), [], pinned ? 0 : undefined);
  const child = await startContender(id, upstream.url, build, pinned ? 1 : undefined, ['--cpu-prof', `--cpu-prof-dir=${dir}`]);
  const client = createStreamClient();
  let events = 0;
  try {
    const until = Date.now() + Number(seconds) * 1000;
    await Promise.all(
      Array.from({ length: 64 }, async () => {
        while (Date.now() < until) {
          const { events: relayed } = await client.stream(child.port, 200, 2, false);
          events += relayed;
        }
      }),
    );
    process.stdout.write(`${id}, ${describeBuild(build)}: ${events} chunks relayed\n\n`);
  } finally {
    client.close();
    await child.stop();
    await upstream.stop();
  }
  process.stdout.write(summarizeProfile(dir));
}

main().catch((error: unknown) => {
  process.stderr.write(`${String(error instanceof Error ? error.stack : error)}\n`);
  process.exit(1);
});
