/**
 * npx tsx bench/overhead/profile.ts <contender> [body-bytes] [seconds] [--tsx]
 *
 * Where a contender's CPU goes: runs it under `--cpu-prof` at saturation (same layout as
 * bench:overhead) and prints the functions with the most self time, grouped by file, so a
 * per-request cost can be attributed (router code, prom-client, http-proxy, Express, Node).
 * e.g. npx tsx bench/overhead/profile.ts router:least-outstanding 256 5
 * The contender runs the compiled package (dist/); `--tsx` the sources (diagnostic).
 */
import { join } from 'node:path';
import { profileContender } from '../lib/cpu-profile';
import { fixed } from '../lib/stats';
import { runAutocannon } from './load';
import { describeBuild, libraryBuildFrom } from './contender-process';
import { completionBody, ROUTABLE_RANKS, VARIANTS } from './scenario';

async function main(): Promise<void> {
  const { build, rest } = libraryBuildFrom(process.argv.slice(2));
  const [id = 'router:least-outstanding', bytes = '256', seconds = '5'] = rest;
  await profileContender(id, build, join(__dirname, 'upstream.ts'), true, async (child) => {
    const size = Number(bytes);
    const spec = {
      url: child.url,
      bodies: Array.from({ length: VARIANTS }, (_, v) => completionBody(size, v)),
      headers: Array.from({ length: VARIANTS }, (_, v) => ({ 'x-session-id': `session-${v}` })),
      expect: id.startsWith('router') ? ({ kind: 'routable', ranks: ROUTABLE_RANKS } as const) : ({ kind: 'none' } as const),
    };
    await runAutocannon(spec, 16, 1);
    const result = await runAutocannon(spec, 16, Number(seconds));
    return `${id}, ${bytes} B, ${describeBuild(build)}: ${fixed(result.rps, 0)} req/s, wrong rank ${result.rank.wrong}/${result.rank.checked}`;
  });
}

main().catch((error: unknown) => {
  process.stderr.write(`${String(error instanceof Error ? error.stack : error)}\n`);
  process.exit(1);
});
