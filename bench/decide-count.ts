/**
 * npx tsx bench/decide-count.ts [FILE.ts …] [--bytes 8192] [--endpoints 64]
 *
 * Instructions per prefix-aware pick, counted by valgrind (cachegrind, all threads): each
 * contender runs in its own process twice, 10,000 and 30,000 picks (the same prompts and
 * in-flight churn as `npm run bench:decide`), and the difference is divided by 20,000, so that
 * start-up and warm-up cancel out (shorter runs left the JIT's timing in the difference: ±30 %).
 * Contenders: this checkout's `prefixAware`, and each FILE.ts that exports one, e.g.
 * `lib/policies/prefix-aware.ts` of another checkout (`git archive main | tar -x -C /tmp/main`,
 * node_modules linked): a file saved next to this one would import this checkout's modules.
 * A count does not move with a loaded machine, as CPU time does.
 */
import { spawnSync } from 'node:child_process';
import { resolve } from 'node:path';
import { prefixAware } from '../lib/policies/prefix-aware';
import type { PickContext, Policy } from '../lib/types';
import { RouteEndpoint } from '../lib/upstreams/endpoints';
import type { UpstreamConfig } from '../lib/options';

const WARM_PICKS = 10_000;
const EXTRA_PICKS = 20_000;

function flag(name: string, fallback: number): number {
  const at = process.argv.indexOf(name);
  return at === -1 ? fallback : Number(process.argv[at + 1]);
}

function endpoints(count: number): RouteEndpoint[] {
  const all: RouteEndpoint[] = [];
  for (let upstream = 0; all.length < count; upstream++) {
    const size = Math.min(8, count - all.length);
    const url = `http://10.0.0.${upstream + 1}:8000`;
    const ranks = Array.from({ length: size }, (_, i) => upstream * 8 + i);
    const config = { name: url, url, startRank: upstream * 8, dataParallelSize: size, ranks, rankHeader: 'global', discoverIntervalMs: undefined, role: 'both' } as unknown as UpstreamConfig;
    for (const rank of ranks) all.push(new RouteEndpoint(config, rank));
  }
  return all;
}

/** bench:decide's prompts: 8 system prompts × many conversations, flat strings. */
function prompts(size: number, count: number): PickContext[] {
  const words = ['alpha', 'bravo', 'charlie', 'delta', 'echo', 'foxtrot', 'golf', 'hotel', 'india', 'juliet'];
  return Array.from({ length: count }, (_, i) => {
    let text = `system prompt ${i % 8}: you are a helpful assistant. `.repeat(Math.max(1, Math.floor(size / 2 / 48)));
    text += `conversation ${i}: `;
    for (let w = 0; text.length < size; w++) text += `${words[(w * (i + 3)) % words.length]} `;
    return { path: '/v1/completions', affinityKey: undefined, prompt: JSON.parse(JSON.stringify(text.slice(0, size))) as string };
  });
}

/** The child: `picks` picks with a sliding window of in-flight requests, then exit. */
async function child(file: string, picks: number): Promise<void> {
  const make = file === '' ? prefixAware : ((await import(resolve(file))) as { prefixAware: () => Policy }).prefixAware;
  const policy = make();
  const candidates = endpoints(flag('--endpoints', 64));
  const contexts = prompts(flag('--bytes', 8192), 256);
  const window = new Array<RouteEndpoint | undefined>(candidates.length * 2).fill(undefined);
  let sink = 0;
  for (let i = 0; i < picks; i++) {
    const chosen = policy.pick(candidates, contexts[i % contexts.length]) as RouteEndpoint;
    chosen.inflight++;
    const released = window[i % window.length];
    if (released !== undefined) released.inflight--;
    window[i % window.length] = chosen;
    sink ^= chosen.rank;
  }
  if (sink === 0.5) process.stdout.write('\n');
}

/** Instructions valgrind counted for a child making `picks` picks with `file`'s policy. */
function instructions(file: string, picks: number): number {
  const args = ['--tool=cachegrind', '--cache-sim=no', '--cachegrind-out-file=/dev/null', process.execPath, '--import', 'tsx', __filename, ...process.argv.slice(2)];
  const result = spawnSync('valgrind', args, { env: { ...process.env, DECIDE_COUNT_CHILD: `${picks}:${file}` }, encoding: 'utf8' });
  const match = /I\s+refs:\s+([\d,]+)/.exec(result.stderr ?? '');
  if (match === null) throw new Error(`valgrind gave no count (is it installed? exit ${result.status}): ${(result.stderr ?? String(result.error)).slice(-400)}`);
  return Number(match[1].replace(/,/g, ''));
}

async function main(): Promise<void> {
  const role = process.env.DECIDE_COUNT_CHILD;
  if (role !== undefined) {
    const colon = role.indexOf(':');
    await child(role.slice(colon + 1), Number(role.slice(0, colon)));
    return;
  }
  const files = ['', ...process.argv.slice(2).filter((arg, i, all) => !arg.startsWith('--') && !all[i - 1]?.startsWith('--'))];
  for (const file of files) {
    const perPick = (instructions(file, WARM_PICKS + EXTRA_PICKS) - instructions(file, WARM_PICKS)) / EXTRA_PICKS;
    process.stdout.write(`${file === '' ? 'this checkout' : file}: ${Math.round(perPick)} instructions per pick\n`);
  }
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
