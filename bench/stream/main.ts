/**
 * npm run bench:stream [-- --quick] [-- --help]
 *
 * What the router costs per streamed chunk, next to a plain Express + http-proxy-middleware 3
 * keep-alive proxy: streamed chat completions through each contender, as bench/overhead does it
 * (compiled package, every contender pinned to one core, the upstream and this client on the
 * other). Two phases:
 *
 * - CPU and latency, interleaved: in each block every contender relays `--streams` concurrent
 *   streams of `--chunks` chunks, one every `--chunk-ms`, all at once, so whatever slows the
 *   machine slows all alike. CPU per chunk (all threads, `process.cpuUsage` read in the contender) ÷ the baseline's in the same
 *   block; latency added per chunk = (arrival − the upstream's write time) p50/p99 − the
 *   baseline's. Medians over blocks.
 * - Memory per open stream, one contender at a time: `--open` slow streams (a chunk a second)
 *   held open; (RSS with them − RSS before) ÷ streams, both after a full collection.
 *
 * Writes bench/results/stream-<time>.json and prints a Markdown table.
 */
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import type { ClientRequest } from 'node:http';
import { join, resolve } from 'node:path';
import { coreCount, hasTaskset, pinSelf, startChild, type BenchChild } from '../lib/cpu';
import { fixed, median, parseArgs, quantileSorted } from '../lib/stats';
import { describeBuild, prepareLibrary, startContender, type LibraryBuild } from '../overhead/contender-process';
import { createStreamClient, type StreamResult } from './client';

const DEFAULT_CONTENDERS = [
  'baseline',
  'router:round-robin',
  'router:least-outstanding',
  'router:power-of-two',
  'router:random',
  'router:session-affinity',
  'router:prefix-aware',
  'router:least-outstanding+tokens',
  'router:prefix-aware+exact',
  'router:least-outstanding+pd',
];

const HELP = `npm run bench:stream -- [options]
  --quick              2 blocks, 4 streams of 100 chunks, 1,000 open streams (a minute or two)
  --contenders LIST    default: ${DEFAULT_CONTENDERS.join(',')}
  --streams N          concurrent streams per contender in a block (default 8)
  --chunks N           chunks per stream (default 200)
  --chunk-ms N         time between chunks (default 5)
  --blocks N           measured blocks, after one to warm up (default 6)
  --open N             slow streams held open for the memory figure (default 10000, capped
                       by the open-file limit: each needs a socket each side of the contender)
  --memory LIST        contenders whose memory is measured (default: all)
  --out FILE           JSON result path (default bench/results/stream-<time>.json)
  --no-pin             do not pin processes to cores
  --tsx                the TypeScript sources through tsx (diagnostic)`;

interface Settings {
  contenders: string[];
  streams: number;
  chunks: number;
  chunkMs: number;
  blocks: number;
  open: number;
  memory: string[];
  out: string;
  pin: boolean;
  build: LibraryBuild;
}

function settingsFrom(argv: readonly string[]): Settings {
  const args = parseArgs(argv);
  if (args.has('help')) {
    process.stdout.write(`${HELP}\n`);
    process.exit(0);
  }
  const known = new Set(['quick', 'contenders', 'streams', 'chunks', 'chunk-ms', 'blocks', 'open', 'memory', 'out', 'no-pin', 'tsx']);
  for (const flag of args.keys()) if (!known.has(flag)) throw new Error(`unknown flag --${flag}\n${HELP}`);
  const quick = args.has('quick');
  const num = (name: string, full: number, fast: number) => {
    const value = args.get(name);
    if (value === undefined) return quick ? fast : full;
    const parsed = Number(value);
    if (!Number.isInteger(parsed) || parsed < 1) throw new Error(`--${name} must be a whole number ≥ 1`);
    return parsed;
  };
  const list = (name: string, fallback: readonly string[]) => {
    const value = args.get(name);
    return typeof value === 'string' ? value.split(',').map((item) => item.trim()).filter(Boolean) : [...fallback];
  };
  const contenders = list('contenders', DEFAULT_CONTENDERS);
  if (!contenders.includes('baseline')) contenders.unshift('baseline');
  const out = args.get('out');
  const stamp = new Date().toISOString().replace(/[:.]/g, '-');
  return {
    contenders,
    streams: num('streams', 8, 4),
    chunks: num('chunks', 200, 100),
    chunkMs: num('chunk-ms', 5, 5),
    blocks: num('blocks', 6, 2),
    open: num('open', 10_000, 1_000),
    memory: list('memory', contenders),
    out: typeof out === 'string' ? resolve(out) : join(__dirname, '..', 'results', `stream-${stamp}.json`),
    pin: !args.has('no-pin'),
    build: args.has('tsx') ? 'tsx' : 'dist',
  };
}

/** This process's open-file limit (children inherit it): a held stream costs the contender two sockets. */
function openFileLimit(): number {
  const match = /Max open files\s+(\d+)/.exec(readFileSync('/proc/self/limits', 'utf8'));
  return match ? Number(match[1]) : 1024;
}

interface Probe {
  cpuUs: number;
  rss: number;
  heapUsed: number;
  external: number;
}

/** The contender's CPU so far (µs resolution, where /proc counts 10 ms ticks) and, with `gc`, its memory after a full collection. */
async function probeOf(child: BenchChild, gc = true): Promise<Probe> {
  return (await (await fetch(`${child.url}/bench-probe${gc ? '?gc=1' : ''}`)).json()) as Probe;
}

interface BlockFigures {
  cpuUsPerChunk: number;
  p50Ms: number;
  p99Ms: number;
  events: number;
  failed: number;
}

function log(message: string): void {
  process.stderr.write(`${message}\n`);
}

async function main(): Promise<void> {
  const settings = settingsFrom(process.argv.slice(2));
  const { contenders } = settings;
  const pinned = settings.pin && coreCount() >= 2 && hasTaskset() && pinSelf(0);
  prepareLibrary(settings.build, contenders);
  const upstream = await startChild('upstream', join(__dirname, 'upstream.ts'), [], pinned ? 0 : undefined);
  const children = new Map<string, BenchChild>();
  const client = createStreamClient();
  try {
    for (const id of contenders) children.set(id, await startContender(id, upstream.url, settings.build, pinned ? 1 : undefined, ['--expose-gc'], [], { DP_ROUTER_BENCH_PROBE: '1' }));
    log(`${contenders.length} contenders, ${describeBuild(settings.build)}, ${pinned ? 'contenders on core 1, upstream and client on core 0' : 'not pinned'}`);

    /**
     * One block: every contender relays `streams` streams at once, started turn by turn across
     * the contenders in an order that rotates from block to block (none is always first); its
     * CPU per event and its chunks' delays.
     */
    const block = async (turn: number): Promise<Map<string, BlockFigures>> => {
      const before = new Map(await Promise.all(contenders.map(async (id) => [id, (await probeOf(children.get(id)!, false)).cpuUs] as const)));
      const order = contenders.map((_, at) => contenders[(at + turn) % contenders.length]);
      const pending = new Map<string, Array<Promise<StreamResult>>>(contenders.map((id) => [id, []]));
      for (let stream = 0; stream < settings.streams; stream++) {
        for (const id of order) pending.get(id)!.push(client.stream(children.get(id)!.port, settings.chunks, settings.chunkMs, true));
      }
      const results = new Map<string, StreamResult[]>(await Promise.all(contenders.map(async (id) => [id, await Promise.all(pending.get(id)!)] as const)));
      const after = new Map(await Promise.all(contenders.map(async (id) => [id, (await probeOf(children.get(id)!, false)).cpuUs] as const)));
      const figures = new Map<string, BlockFigures>();
      for (const id of contenders) {
        const streams = results.get(id)!;
        const events = streams.reduce((sum, stream) => sum + stream.events, 0);
        const delays = Float64Array.from(streams.flatMap((stream) => stream.delays)).sort();
        const cpu = (after.get(id)! - before.get(id)!) / 1000;
        // Every token chunk, the usage chunk and [DONE]: anything less is a stream cut short.
        const failed = streams.filter((stream) => stream.status !== 200 || stream.events !== settings.chunks + 2).length;
        figures.set(id, { cpuUsPerChunk: (cpu * 1000) / Math.max(1, events), p50Ms: quantileSorted(delays, 0.5), p99Ms: quantileSorted(delays, 0.99), events, failed });
      }
      return figures;
    };

    log(`warm-up block, then ${settings.blocks} blocks of ${settings.streams} streams × ${settings.chunks} chunks every ${settings.chunkMs} ms per contender`);
    await block(0);
    const blocks: Array<Map<string, BlockFigures>> = [];
    for (let index = 0; index < settings.blocks; index++) {
      const figures = await block(index + 1);
      blocks.push(figures);
      const base = figures.get('baseline')!;
      log(`block ${index + 1}: ${contenders.map((id) => `${id} ${fixed(figures.get(id)!.cpuUsPerChunk, 2)} µs (${fixed(figures.get(id)!.cpuUsPerChunk / base.cpuUsPerChunk, 3)}×)`).join(', ')}`);
    }

    const limit = openFileLimit();
    const open = Math.min(settings.open, Math.floor((limit - 512) / 2));
    if (open < settings.open) log(`memory: ${open} streams, not ${settings.open}: the open-file limit is ${limit} (each stream holds a socket on either side of the contender; raise it with ulimit -n)`);
    const memory = new Map<string, { rssPerStream: number; heapPerStream: number; externalPerStream: number; held: number }>();
    for (const id of settings.memory) {
      const child = children.get(id);
      if (child === undefined) continue;
      const idle = await probeOf(child);
      const requests: ClientRequest[] = [];
      let first = 0;
      // A chunk a second, for longer than the measurement: the streams stay open until cut.
      const streams = Array.from({ length: open }, () => client.stream(child.port, 3_600, 1_000, false, () => first++, (req) => requests.push(req)).catch(() => undefined));
      const deadline = Date.now() + 300_000;
      while (first < open && Date.now() < deadline) await new Promise((done) => setTimeout(done, 200));
      const held = await probeOf(child);
      memory.set(id, { rssPerStream: (held.rss - idle.rss) / first, heapPerStream: (held.heapUsed - idle.heapUsed) / first, externalPerStream: (held.external - idle.external) / first, held: first });
      log(`memory ${id}: ${first} streams open, ${fixed((held.rss - idle.rss) / first / 1024, 2)} KiB RSS, ${fixed((held.heapUsed - idle.heapUsed) / first / 1024, 2)} KiB heap per stream`);
      for (const req of requests) req.destroy();
      await Promise.all(streams);
      await new Promise((done) => setTimeout(done, 1_000));
    }

    const rows = contenders.map((id) => {
      const ratios = blocks.map((figures) => figures.get(id)!.cpuUsPerChunk / figures.get('baseline')!.cpuUsPerChunk);
      const p50Added = blocks.map((figures) => figures.get(id)!.p50Ms - figures.get('baseline')!.p50Ms);
      const p99Added = blocks.map((figures) => figures.get(id)!.p99Ms - figures.get('baseline')!.p99Ms);
      const held = memory.get(id);
      const base = memory.get('baseline');
      return {
        contender: id,
        cpuUsPerChunk: median(blocks.map((figures) => figures.get(id)!.cpuUsPerChunk)),
        cpuToBaseline: median(ratios),
        ratios,
        p50AddedMs: median(p50Added),
        p99AddedMs: median(p99Added),
        rssKiBPerStream: held === undefined ? NaN : held.rssPerStream / 1024,
        rssKiBOverBaseline: held === undefined || base === undefined ? NaN : (held.rssPerStream - base.rssPerStream) / 1024,
        heapKiBPerStream: held === undefined ? NaN : held.heapPerStream / 1024,
        held: held?.held ?? 0,
        failedStreams: blocks.reduce((sum, figures) => sum + figures.get(id)!.failed, 0),
      };
    });
    mkdirSync(join(settings.out, '..'), { recursive: true });
    writeFileSync(settings.out, `${JSON.stringify({ benchmark: 'stream', date: new Date().toISOString(), node: process.version, pinned, openFileLimit: limit, settings, rows }, null, 2)}\n`);
    process.stdout.write(
      `# Streamed chunks\n\n${contenders.length} contenders, ${describeBuild(settings.build)}; ${settings.blocks} blocks of ${settings.streams} streams × ${settings.chunks} chunks every ${settings.chunkMs} ms each, interleaved; memory with ${open} slow streams open.\n\n` +
        '| contender | CPU µs/chunk | ÷ baseline (blocks) | latency added p50 / p99 (ms) | RSS per open stream (KiB) | − baseline (KiB) | heap per stream (KiB) | failed streams |\n' +
        '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n' +
        rows
          .map(
            (row) =>
              `| ${row.contender} | ${fixed(row.cpuUsPerChunk, 2)} | ${fixed(row.cpuToBaseline, 3)}× (${row.ratios.map((ratio) => fixed(ratio, 3)).join(', ')}) | ${fixed(row.p50AddedMs, 3)} / ${fixed(row.p99AddedMs, 3)} | ${fixed(row.rssKiBPerStream, 2)} | ${fixed(row.rssKiBOverBaseline, 2)} | ${fixed(row.heapKiBPerStream, 2)} | ${row.failedStreams} |`,
          )
          .join('\n') +
        '\n',
    );
  } finally {
    client.close();
    await Promise.all([...children.values()].map((child) => child.stop()));
    await upstream.stop();
  }
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
