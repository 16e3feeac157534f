import { mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { prepareLibrary, startContender, type LibraryBuild } from '../overhead/contender-process';
import { coreCount, hasTaskset, pinSelf, startChild, type BenchChild } from './cpu';
import { fixed, markdownTable } from './stats';

/**
 * Runs contender `id` under `--cpu-prof` in front of the upstream `upstreamScript` (pinned as
 * bench:overhead pins, unless `pin` is false), while `drive` loads it and says what it did; then
 * prints that line and the profile's summary ({@link summarizeProfile}).
 */
export async function profileContender(id: string, build: LibraryBuild, upstreamScript: string, pin: boolean, drive: (child: BenchChild) => Promise<string>): Promise<void> {
  prepareLibrary(build, [id]);
  const pinned = pin && coreCount() >= 2 && hasTaskset() && pinSelf(0);
  const dir = mkdtempSync(join(tmpdir(), 'dp-router-prof-'));
  const upstream = await startChild('upstream', upstreamScript, [], pinned ? 0 : undefined);
  const child = await startContender(id, upstream.url, build, pinned ? 1 : undefined, ['--cpu-prof', `--cpu-prof-dir=${dir}`]);
  try {
    process.stdout.write(`${await drive(child)}\n\n`);
  } finally {
    await child.stop();
    await upstream.stop();
  }
  process.stdout.write(summarizeProfile(dir));
}

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
}

/**
 * The `.cpuprofile` in `dir` (`--cpu-prof-dir`), as two Markdown tables: self time by area
 * (the router's lib/, each package, Node core, GC) and by function, with the profile's path.
 */
export function summarizeProfile(dir: string, functions = 40): string {
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
  return `${markdownTable(['area', 'self time'], top(byArea, 12).map(([k, v]) => [k, pct(v)]))}\n\n${markdownTable(['function', 'self time'], top(byFunction, functions).map(([k, v]) => [k, pct(v)]))}\n\nprofile: ${join(dir, file)}\n`;
}
