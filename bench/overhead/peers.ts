/**
 * npx tsx bench/overhead/peers.ts [--policy round-robin] [--exact] [--rate 300 | --burst 32] [--announce-ms 50] [--seconds 24]
 *                                 [--block 4] [--modes udp,redis] [--ref GIT_REF] [--no-pin] [--tsx]
 *
 * What `peers` cost per request, as an A/B that holds on a shared machine: three router
 * processes without peers and three with them (UDP to each other, or Redis pub/sub through a
 * redis-server started here), all pinned to the same core, the client sending open loop at
 * `--rate` requests per second to *each* of them, turn by turn; or, with `--burst N`, closed
 * loop in bursts: N requests to every router at once, the next burst when all are answered (every
 * endpoint's count swings from 0 to its share of N and back, as fast as the routers go). Each group's CPU per request
 * (all threads, /proc) is taken per block of `--block` seconds and divided by the peers-off
 * group's in the same block; the figure is the median over blocks. Each router's event-loop
 * delay p99 after the warm-up comes from a probe route in its process (contender.ts).
 * `--exact` runs prefix-aware on KV events (`+exact`); `--ref` runs that revision's router in
 * every group (`<contender>@<ref>`), for a before/after. Compiled package unless `--tsx`.
 */
import { join } from 'node:path';
import { coreCount, hasTaskset, pinSelf, processCpuMs, startChild, type BenchChild } from '../lib/cpu';
import { startBenchRedis, type BenchRedis } from '../lib/redis-server';
import { fixed, median, parseArgs } from '../lib/stats';
import { freeUdpPort } from '../lib/ports';
import { createPoster } from './client';
import { describeBuild, libraryBuildFrom, prepareLibrary, startContender } from './contender-process';

type Mode = 'off' | 'udp' | 'redis';
const REPLICAS = 3;
const WARMUP_SECONDS = 2;

interface Group {
  mode: Mode;
  routers: BenchChild[];
}

interface Probe {
  p99: number;
  cpuUs: number;
}

async function probeOf(router: BenchChild): Promise<Probe> {
  const answer = await fetch(`${router.url}/bench-probe`);
  return (await answer.json()) as Probe;
}

async function main(): Promise<void> {
  const { build, rest } = libraryBuildFrom(process.argv.slice(2));
  const args = parseArgs(rest);
  const known = new Set(['policy', 'exact', 'rate', 'burst', 'announce-ms', 'seconds', 'block', 'modes', 'ref', 'no-pin']);
  for (const flag of args.keys()) if (!known.has(flag)) throw new Error(`unknown flag --${flag}`);
  const number = (flag: string, fallback: number) => {
    const value = args.get(flag);
    const parsed = value === undefined ? fallback : Number(value);
    if (!(parsed > 0) || !Number.isFinite(parsed)) throw new Error(`--${flag} must be a number > 0`);
    return parsed;
  };
  const exact = args.has('exact');
  const policy = typeof args.get('policy') === 'string' ? (args.get('policy') as string) : exact ? 'prefix-aware' : 'round-robin';
  const rate = number('rate', 300);
  const burst = args.has('burst') ? number('burst', 32) : undefined;
  const announceMs = args.has('announce-ms') ? String(number('announce-ms', 50)) : undefined;
  const seconds = number('seconds', 24);
  const blockSeconds = number('block', 4);
  const ref = args.get('ref');
  const modesArg = args.get('modes');
  const modes: Mode[] = ['off', ...(typeof modesArg === 'string' ? modesArg.split(',') : ['udp', 'redis']).map((mode) => {
    if (mode !== 'udp' && mode !== 'redis') throw new Error(`--modes: '${mode}' is neither udp nor redis`);
    return mode as Mode;
  })];
  const base = `router:${policy}${exact ? '+exact' : ''}`;
  const idOf = (mode: Mode) => `${base}${mode === 'udp' ? '+peers' : mode === 'redis' ? '+peersredis' : ''}${typeof ref === 'string' ? `@${ref}` : ''}`;
  prepareLibrary(build, modes.map(idOf));
  const pinned = !args.has('no-pin') && coreCount() >= 2 && hasTaskset() && pinSelf(0);
  const core = pinned ? 1 : undefined;
  const upstream = await startChild('upstream', join(__dirname, 'upstream.ts'), [], pinned ? 0 : undefined);
  let redis: BenchRedis | undefined;
  const groups: Group[] = [];
  try {
    for (const mode of modes) {
      let envs: NodeJS.ProcessEnv[] = Array.from({ length: REPLICAS }, () => ({}));
      if (mode === 'udp') {
        const addresses: string[] = [];
        for (let i = 0; i < REPLICAS; i++) addresses.push(`127.0.0.1:${await freeUdpPort()}`);
        envs = addresses.map((listen) => ({ DP_ROUTER_BENCH_PEERS: JSON.stringify({ listen, addresses }) }));
      } else if (mode === 'redis') {
        redis ??= await startBenchRedis();
        envs = envs.map(() => ({ DP_ROUTER_BENCH_PEERS: JSON.stringify({ redis: redis!.url }) }));
      }
      const timing = announceMs === undefined ? {} : { DP_ROUTER_BENCH_ANNOUNCE_MS: announceMs };
      const routers = await Promise.all(envs.map((env) => startContender(idOf(mode), upstream.url, build, core, [], [], { ...env, ...timing, DP_ROUTER_BENCH_PROBE: '1' })));
      groups.push({ mode, routers });
    }
    const all = groups.flatMap((group) => group.routers);
    // Turn by turn: off #1, udp #1, redis #1, off #2, …: each router gets `rate` requests a second.
    const order = Array.from({ length: REPLICAS }, (_, replica) => groups.map((group) => group.routers[replica])).flat();
    const total = rate * all.length;
    const shape = burst === undefined ? `${rate} req/s each (${total} req/s` : `bursts of ${burst} requests to each at once, closed loop (${burst * all.length} at a time`;
    console.log(`${REPLICAS} routers per group (${modes.join(', ')}), ${base}${typeof ref === 'string' ? ` at ${ref}` : ''}, ${shape} on ${pinned ? 'core 1' : 'every core, not pinned'}), ${describeBuild(build)}; blocks of ${blockSeconds} s after ${WARMUP_SECONDS} s of warm-up`);
    const poster = createPoster(exact ? 2048 : 256);
    const sentTo = new Map<BenchChild, number>(all.map((router) => [router, 0]));
    let failed = 0;

    /** Open loop at `total` req/s for `ms`: request n is due at n / total. */
    const paced = async (ms: number) => {
      const inFlight: Array<Promise<void>> = [];
      const start = performance.now();
      for (let sent = 0; ; ) {
        const due = start + (sent * 1000) / total;
        if (due - start >= ms) break;
        const wait = due - performance.now();
        if (wait > 0) {
          await new Promise((resolve) => setTimeout(resolve, Math.min(wait, 2)));
          continue;
        }
        const router = order[sent++ % order.length];
        sentTo.set(router, sentTo.get(router)! + 1);
        inFlight.push(poster.send(router.port).catch(() => void failed++));
      }
      await Promise.all(inFlight);
    };
    /** Closed loop in bursts for `ms`: `burst` requests to every router at once, the next burst when all are answered. */
    const bursts = async (ms: number) => {
      const end = performance.now() + ms;
      while (performance.now() < end) {
        const round: Array<Promise<void>> = [];
        for (let i = 0; i < burst!; i++) {
          for (const router of order) {
            sentTo.set(router, sentTo.get(router)! + 1);
            round.push(poster.send(router.port).catch(() => void failed++));
          }
        }
        await Promise.all(round);
      }
    };
    const load = burst === undefined ? paced : bursts;
    await load(WARMUP_SECONDS * 1000);
    await Promise.all(all.map(probeOf));
    const ratios = new Map<Mode, number[]>(modes.map((mode) => [mode, []]));
    const costs = new Map<Mode, number[]>(modes.map((mode) => [mode, []]));
    for (let block = 0; block * blockSeconds < seconds; block++) {
      const cpuBefore = all.map((router) => processCpuMs(router.process.pid)!);
      const sentBefore = all.map((router) => sentTo.get(router)!);
      await load(blockSeconds * 1000);
      const perRequest = new Map<Mode, number>();
      for (const group of groups) {
        let cpu = 0;
        let requests = 0;
        for (const router of group.routers) {
          const at = all.indexOf(router);
          cpu += processCpuMs(router.process.pid)! - cpuBefore[at];
          requests += sentTo.get(router)! - sentBefore[at];
        }
        perRequest.set(group.mode, (cpu * 1000) / requests);
      }
      for (const mode of modes) {
        costs.get(mode)!.push(perRequest.get(mode)!);
        ratios.get(mode)!.push(perRequest.get(mode)! / perRequest.get('off')!);
      }
      console.log(`block ${block + 1}: ${modes.map((mode) => `${mode} ${fixed(perRequest.get(mode)!, 1)} µs/req (${fixed(perRequest.get(mode)! / perRequest.get('off')!, 3)}×)`).join(', ')}`);
    }
    const lags = await Promise.all(all.map(probeOf));
    console.log(`\n| group | CPU µs/request (median) | ÷ peers off (median of blocks) | event-loop delay p99, worst router (ms) |\n| --- | ---: | ---: | ---: |`);
    for (const group of groups) {
      const worst = Math.max(...group.routers.map((router) => lags[all.indexOf(router)].p99));
      const blocks = ratios.get(group.mode)!;
      console.log(`| ${group.mode === 'off' ? 'peers off' : `peers ${group.mode === 'udp' ? 'UDP' : 'Redis'}`} | ${fixed(median(costs.get(group.mode)!), 1)} | ${fixed(median(blocks), 3)}× (${blocks.map((ratio) => fixed(ratio, 3)).join(', ')}) | ${fixed(worst, 1)} |`);
    }
    if (failed > 0) console.log(`\n${failed} requests failed`);
    poster.close();
  } finally {
    await Promise.all(groups.flatMap((group) => group.routers.map((router) => router.stop())));
    await upstream.stop();
    await redis?.stop();
  }
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
