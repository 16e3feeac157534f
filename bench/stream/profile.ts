/**
 * npx tsx bench/stream/profile.ts [contender] [seconds] [--tsx] [--no-pin]
 *
 * Where a contender's CPU goes per streamed chunk: runs it under `--cpu-prof` (same layout as
 * bench:stream) while 64 streams of 200 chunks, one every 2 ms, run through it back to back,
 * and prints the functions with the most self time, grouped by area (bench/lib/cpu-profile.ts).
 * e.g. npx tsx bench/stream/profile.ts router:least-outstanding+tokens 10
 */
import { join } from 'node:path';
import { profileContender } from '../lib/cpu-profile';
import { describeBuild, libraryBuildFrom } from '../overhead/contender-process';
import { createStreamClient } from './client';

async function main(): Promise<void> {
  const { build, rest: args } = libraryBuildFrom(process.argv.slice(2));
  const rest = args.filter((arg) => arg !== '--no-pin');
  const [id = 'router:least-outstanding', seconds = '10'] = rest;
  // --no-pin: on a machine whose core 0 other benchmarks pin their load to as well.
  await profileContender(id, build, join(__dirname, 'upstream.ts'), rest.length === args.length, async (child) => {
    const client = createStreamClient();
    let events = 0;
    const until = Date.now() + Number(seconds) * 1000;
    await Promise.all(
      Array.from({ length: 64 }, async () => {
        while (Date.now() < until) {
          const { events: relayed } = await client.stream(child.port, 200, 2, false);
          events += relayed;
        }
      }),
    );
    client.close();
    return `${id}, ${describeBuild(build)}: ${events} chunks relayed`;
  });
}

main().catch((error: unknown) => {
  process.stderr.write(`${String(error instanceof Error ? error.stack : error)}\n`);
  process.exit(1);
});
