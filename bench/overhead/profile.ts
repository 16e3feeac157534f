/**
 * npx tsx bench/overhead/profile.ts <contender> [body-bytes] [seconds] [--tsx]
 *
 * Where a contender's CPU goes: runs it under `--cpu-prof` at saturation (same layout as
 * bench:overhead) and prints the functions with the most self time, grouped by file, so a
 * per-request cost can be attributed (router code, prom-client, http-proxy, Express, Node).
 * e.g. npx tsx bench/overhead/profile.ts router:least-outstanding 256 5
 * The contender runs the compiled package (dist/); `--tsx` the sources (diagnostic).
 */
import { mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { coreCount, hasTaskset, pinSelf, startChild } from '../lib/cpu';
import { fixed, markdownTable } from '../lib/stats';
import { runAutocannon } from './load';
import { describeBuild, libraryBuildFrom, prepareLibrary, startContender } from './contender-process';
import { completionBody, ROUTABLE_RANKS, VARIANTS } from './scenario';

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
}

async function main(): Promise<void> {
  const { build, rest } = libraryBuildFrom(process.argv.slice(2));
  const [id = 'router:least-outstanding', bytes = '256', seconds = '5'] = rest;
  prepareLibrary(build, [id]);
  const pinned = coreCount() >= 2 && hasTaskset() && pinSelf(0);
  const dir = mkdtempSync(join(tmpdir(), 'dp-router-prof-'));
  const upstream = await startChild('upstream', join(__dirname, 'upstream.ts'), [], pinned ? 0 : undefined);
  const child = await startContender(id, upstream.url, build, pinned ? 1 : undefined, ['--cpu-prof', `--cpu-prof-dir=${dir}`]);
  try {
    const size = Number(bytes);
    const spec = {
      url: child.url,
      bodies: Array.from({ length: VARIANTS }, (_, v) => completionBody(size, v)),
      headers: Array.from({ length: VARIANTS }, (_, v) => ({ 'x-session-id': `session-${v}` })),
      expect: id.startsWith('router') ? ({ kind: 'routable', ranks: ROUTABLE_RANKS } as const) : ({ kind: 'none' } as const),
    };
    await runAutocannon(spec, 16, 1);
    const result = await runAutocannon(spec, 16, Number(seconds));
    process.stdout.write(`${id}, ${bytes} B, ${describeBuild(build)}: ${fixed(result.rps, 0)} req/s, wrong rank ${result.rank.wrong}/${result.rank.checked}\n\n`);
  } finally {
    await child.stop();
    await upstream.stop();
  }
  const file = readdirSync(dir).find((name) => name.endsWith('.cpuprofile'));
  if (!file) throw new Error(`no profile written in ${dir}`);
  const profile = JSON.parse(readFileSync(join(dir, file), 'utf8')) as { nodes: ProfileNode[]; samples: number[] };
  const nodes = new Map(profile.nodes.map((node) => [node.id, node]));
  const byFunction = new Map<string, number>();
  const byArea = new Map<string, number>();
  for (const sample of profile.samples) {
    const frame = nodes.get(sample)!.callFrame;
    const where = frame.url.replace(/^file:\/\//, '').replace(/^.*\/node_modules\//, '~/').replace(/^.*\/(?:dist\/cjs|bench\/results\/\.rev-\w+\/dist\/cjs)\//, 'lib/').replace(/^.*\/work\/[^/]+(?:\/[^/]+)?\/(?=lib\/)/, '');
    const name = `${frame.functionName || '(anonymous)'} ${where}:${frame.lineNumber + 1}`;
    byFunction.set(name, (byFunction.get(name) ?? 0) + 1);
    const area = where.startsWith('lib/')
      ? 'express-dp-router (lib/)'
      : where.startsWith('~/')
        ? where.slice(2).split('/')[0]
        : where.startsWith('node:')
          ? 'node core'
          : frame.functionName.startsWith('(')
            ? frame.functionName
            : 'other';
    byArea.set(area, (byArea.get(area) ?? 0) + 1);
  }
  const total = profile.samples.length;
  const pct = (count: number) => `${fixed((100 * count) / total, 1)}%`;
  const top = (map: Map<string, number>, n: number) => [...map].sort((a, b) => b[1] - a[1]).slice(0, n);
  process.stdout.write(`${markdownTable(['area', 'self time'], top(byArea, 12).map(([k, v]) => [k, pct(v)]))}\n\n`);
  process.stdout.write(`${markdownTable(['function', 'self time'], top(byFunction, 40).map(([k, v]) => [k, pct(v)]))}\n\nprofile: ${join(dir, file)}\n`);
}

main().catch((error: unknown) => {
  process.stderr.write(`${String(error instanceof Error ? error.stack : error)}\n`);
  process.exit(1);
});
