/**
 * npx tsx bench/kv-events.ts [--quick]
 *
 * The exact prefix index's costs, on one thread, timed in this process's CPU time:
 * - ingestion: vLLM payloads (vLLM's current array layout, with 32-byte hashes and with its
 *   default 64-bit integer hashes) through `decodeKvEventBatch` and `KvExactIndex.applyEvent`,
 *   as blocks per second; each batch is one 2,048-token prefill (128 blocks of 16 tokens)
 *   chained on the previous one, with a removal batch every fourth, in an index held below
 *   its budget;
 * - lookup: `match()` for 2k- and 8k-token prompts over 8 ranks, when one rank holds the
 *   whole prompt (the worst case: a key per block) and when none holds any of it;
 * - memory: heap bytes per indexed block, 1,000,000 blocks, both hash kinds;
 * - the longest event-loop pause while payloads at the decoder's bounds arrive back to back,
 *   decoded whole, cooperatively (what the subscriber does) or in a worker thread
 *   (kv-events-pause.ts), in CPU time; `--pause` runs this section alone.
 */
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { decodeKvEventBatch, type KvEvent } from '../lib/exact-prefix/events/decode';
import { KvExactIndex } from '../lib/exact-prefix/index/exact-index';
import { encodeKvBatch, type KvLayout, type MockKvEvent, type PyBlockHash } from '../example-server/mock-vllm/kv-events';
import { fixed, markdownTable, median, parseArgs } from './lib/stats';
import { boundPayloads, measurePauses, type PauseFigures } from './kv-events-pause';

const args = parseArgs(process.argv.slice(2));
const QUICK = args.has('quick');
const PAUSE_ONLY = args.has('pause');
const BLOCK = 16;
const RANKS = [0, 1, 2, 3, 4, 5, 6, 7];

/** This process's CPU time in milliseconds: immune to other processes' load on the machine. */
function cpuMs(): number {
  const usage = process.cpuUsage();
  return (usage.user + usage.system) / 1000;
}

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;

function hashOf(kind: 'bytes' | 'int', n: number): PyBlockHash {
  if (kind === 'int') return BigInt.asIntN(64, BigInt(n) * 0x9e3779b97f4a7c15n);
  const bytes = Buffer.alloc(32);
  bytes.writeUInt32BE(n >>> 0, 0);
  bytes.writeUInt32BE(Math.floor(n / 2 ** 32), 4);
  bytes.writeUInt32BE(Math.imul(n, 0x9e3779b1) >>> 0, 28);
  return bytes;
}

/** Payloads of a stream: prefills of `blocksPerPrefill` blocks, a removal every fourth. */
function payloads(kind: 'bytes' | 'int', layout: KvLayout, count: number, blocksPerPrefill: number): { payloads: Buffer[]; blocks: number } {
  const out: Buffer[] = [];
  let next = 1;
  let blocks = 0;
  for (let i = 0; i < count; i++) {
    const first = next;
    const hashes = Array.from({ length: blocksPerPrefill }, () => hashOf(kind, next++));
    const tokens = Array.from({ length: blocksPerPrefill * BLOCK }, (_, t) => (i * 7919 + t * 31) % 128_000);
    const events: MockKvEvent[] = [{ type: 'BlockStored', blockHashes: hashes, parentBlockHash: null, tokenIds: tokens, blockSize: BLOCK, medium: 'GPU' }];
    blocks += blocksPerPrefill;
    if (i % 4 === 3) events.push({ type: 'BlockRemoved', blockHashes: [hashOf(kind, first - blocksPerPrefill * 3)], medium: 'GPU' });
    out.push(encodeKvBatch({ ts: 1, events, dataParallelRank: 0 }, layout));
  }
  return { payloads: out, blocks };
}

function ingestion(kind: 'bytes' | 'int', layout: KvLayout): { blocksPerSecond: number; decodeShare: number } {
  const { payloads: batches, blocks } = payloads(kind, layout, QUICK ? 200 : 1000, 128);
  const rates: number[] = [];
  let decodeShare = 0;
  for (let round = 0; round < (QUICK ? 3 : 7); round++) {
    const index = new KvExactIndex({ ranks: [0], maxBlocks: 10_000_000 });
    const decoded: KvEvent[][] = [];
    const start = cpuMs();
    for (const payload of batches) {
      const result = decodeKvEventBatch(payload);
      if (!result.ok) throw new Error(result.reason);
      decoded.push(result.batch.events);
      for (const event of result.batch.events) index.applyEvent(0, event);
    }
    const total = cpuMs() - start;
    const decodeStart = cpuMs();
    for (const payload of batches) decodeKvEventBatch(payload);
    decodeShare = (cpuMs() - decodeStart) / total;
    rates.push(blocks / (total / 1000));
  }
  return { blocksPerSecond: median(rates), decodeShare };
}

function lookup(tokens: number, hit: boolean): number {
  const index = new KvExactIndex({ ranks: RANKS });
  const prompt = Array.from({ length: tokens }, (_, t) => (t * 31 + 7) % 128_000);
  const blocks = tokens / BLOCK;
  // Every rank holds other chains; rank 3 holds the prompt when `hit`.
  for (const rank of RANKS) {
    const tokenIds = Array.from({ length: blocks * BLOCK }, (_, t) => (t * 17 + rank) % 128_000);
    index.applyEvent(rank, { type: 'stored', blockHashes: Array.from({ length: blocks }, (_, b) => rank * 1e6 + b), parentBlockHash: null, tokenIds, blockSize: BLOCK, loraId: null, loraName: null, medium: null, extraKeyed: null, groupIdx: null });
  }
  if (hit) {
    index.applyEvent(3, { type: 'stored', blockHashes: Array.from({ length: blocks }, (_, b) => 9e6 + b), parentBlockHash: null, tokenIds: prompt, blockSize: BLOCK, loraId: null, loraName: null, medium: null, extraKeyed: null, groupIdx: null });
  }
  const runs = QUICK ? 2000 : 10_000;
  const times: number[] = [];
  for (let round = 0; round < 5; round++) {
    const start = cpuMs();
    for (let i = 0; i < runs; i++) index.match(prompt);
    times.push(((cpuMs() - start) * 1000) / runs);
  }
  const result = index.match(prompt).matchedBlocks[3];
  if (result !== (hit ? blocks : 0)) throw new Error(`lookup found ${result} blocks`);
  return median(times);
}

function memory(kind: 'bytes' | 'int'): number {
  const perEvent = 128;
  const eventCount = Math.ceil((QUICK ? 200_000 : 1_000_000) / perEvent);
  const count = eventCount * perEvent;
  gc();
  const before = process.memoryUsage().heapUsed;
  const index = new KvExactIndex({ ranks: [0], maxBlocks: 2 * count });
  // Events are built and dropped one at a time, so what stays is the index alone, with the
  // engine hashes it keeps (strings for bytes hashes, numbers or bigints for integers).
  for (let e = 0; e < eventCount; e++) {
    const blockHashes = Array.from({ length: perEvent }, (_, b) => {
      const raw = hashOf(kind, e * perEvent + b + 1);
      if (raw instanceof Uint8Array) return Buffer.from(raw).toString('latin1');
      return typeof raw === 'bigint' && raw >= BigInt(Number.MIN_SAFE_INTEGER) && raw <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(raw) : raw;
    });
    const tokenIds = Array.from({ length: perEvent * BLOCK }, (_, t) => (e * 131 + t) % 128_000);
    index.applyEvent(0, { type: 'stored', blockHashes, parentBlockHash: null, tokenIds, blockSize: BLOCK, loraId: null, loraName: null, medium: null, extraKeyed: null, groupIdx: null });
  }
  gc();
  const after = process.memoryUsage().heapUsed;
  if (index.totalBlocks !== count) throw new Error(`indexed ${index.totalBlocks}`);
  return (after - before) / count;
}

async function main(): Promise<void> {
  if (!PAUSE_ONLY) tables();
  await pauses();
}

function tables(): void {
  const ingestRows = (['bytes', 'int'] as const).map((kind) => {
    const layout: KvLayout = 'current';
    const { blocksPerSecond, decodeShare } = ingestion(kind, layout);
    return [`${layout} layout, ${kind === 'bytes' ? '32-byte' : 'int64'} hashes`, fixed(blocksPerSecond / 1000, 0), `${fixed(decodeShare * 100, 0)} %`, blocksPerSecond >= 200_000 ? 'PASS' : 'MISS'];
  });
  process.stdout.write(`\n## Ingestion (decode + index), one thread\n\n${markdownTable(['stream', 'k blocks/s', 'decode share', '≥ 200k/s'], ingestRows)}\n`);

  const lookupRows = [2048, 8192].flatMap((tokens) => [true, false].map((hit) => [`${tokens} tokens (${tokens / BLOCK} blocks), ${hit ? 'one rank holds all' : 'no rank holds any'}`, fixed(lookup(tokens, hit), 1)]));
  process.stdout.write(`\n## Lookup over 8 ranks\n\n${markdownTable(['prompt', 'µs per match()'], lookupRows)}\n`);

  const memoryRows = (['bytes', 'int'] as const).map((kind) => {
    const perBlock = memory(kind);
    return [kind === 'bytes' ? '32-byte hashes' : 'int64 hashes', fixed(perBlock, 0), fixed((perBlock * 1e6) / 2 ** 20, 0)];
  });
  process.stdout.write(`\n## Memory\n\n${markdownTable(['engine hashes', 'bytes per block', 'MiB per million blocks'], memoryRows)}\n`);
}

async function pauses(): Promise<void> {
  const payloads = boundPayloads(QUICK ? 4 : 12);
  const modes = [
    ['decoded whole on the event loop', 'whole'],
    ['decoded in slices (the subscriber)', 'cooperative'],
    ['decoded in a worker thread', 'worker'],
  ] as const;
  const rows: string[][] = [];
  for (const applying of [false, true]) {
    for (const [name, mode] of modes) {
      // Three runs of each, interleaved; the median of each figure.
      const runs: PauseFigures[] = [];
      for (let run = 0; run < 3; run++) runs.push(await measurePauses(mode, payloads, applying));
      const pick = (key: 'maxPauseMs' | 'p99PauseMs' | 'cpuPerPayloadMs') => fixed(median(runs.map((figures) => figures[key])), 1);
      rows.push([`${name}${applying ? ', then applied' : ''}`, pick('maxPauseMs'), pick('p99PauseMs'), pick('cpuPerPayloadMs')]);
    }
  }
  process.stdout.write(`\n## Event-loop pauses, payloads at the bounds back to back (120k blocks, ~240k values, 1.2 MB each; CPU ms)\n\n${markdownTable(['decode', 'longest pause', 'p99 pause', 'CPU per payload, all threads'], rows)}\n`);
}

void main();
