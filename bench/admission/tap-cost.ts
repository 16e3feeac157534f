/**
 * node --expose-gc --import tsx bench/admission/tap-cost.ts [--before PATH] [--rounds N] [--streams N]
 *
 * CPU per streamed chunk of admission's usage tap (`tapUsage`), in-process: vLLM-shaped chat
 * chunks (`ChatCompletionStreamResponse` as serving.py writes it with `exclude_unset`, 52a31cc),
 * each a Buffer of its own as a socket hands them over, emitted as `data` events to the tap, a
 * stream's usage in its final chunk (`include_usage`) or in every chunk
 * (`continuous_usage_stats`). The floor is a `data` listener that does nothing; each tap's cost
 * is its time above that floor. `--before PATH`: another `usage-tap.ts` (e.g. the previous one,
 * `git show 8e9d1d2:lib/admission/usage-tap.ts > /tmp/tap-before.ts`) measured side by side,
 * interleaved round by round; medians of the rounds. What a tap allocates shows as garbage
 * collections: young-generation collections (scavenges) per 100 000 chunks, from the `gc`
 * performance entries of each round. With `node --expose-gc --import tsx`, also the memory an
 * open stream holds for its tap.
 */
import { EventEmitter } from 'node:events';
import type { IncomingMessage } from 'node:http';
import { resolve } from 'node:path';
import { constants, PerformanceObserver, performance, type PerformanceEntry } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { fixed, markdownTable, parseArgs } from '../lib/stats';
import { tapUsage } from '../../lib/admission/usage-tap';

type Tap = (answer: IncomingMessage, requestBytes: number, done: (tokens: number) => void) => void;

const CHUNKS = 200;

/** One stream's chunks, fresh Buffers (the socket's), the usage where vLLM puts it. */
function streamChunks(continuous: boolean): Buffer[] {
  const usage = (completion: number) => ({ prompt_tokens: 812, total_tokens: 812 + completion, completion_tokens: completion });
  const chunks: Buffer[] = [];
  for (let i = 0; i < CHUNKS; i++) {
    const data = { id: 'chatcmpl-9f2c4e1a7b3d4c5e8f9a0b1c2d3e4f5a', object: 'chat.completion.chunk', created: 1_760_000_000, model: 'meta-llama/Llama-3.1-8B-Instruct', choices: [{ index: 0, delta: { content: ` word${i}` }, logprobs: null, finish_reason: null }], ...(continuous && { usage: usage(i + 1) }) };
    chunks.push(Buffer.from(`data: ${JSON.stringify(data)}\n\n`));
  }
  const last = { id: 'chatcmpl-9f2c4e1a7b3d4c5e8f9a0b1c2d3e4f5a', object: 'chat.completion.chunk', created: 1_760_000_000, model: 'meta-llama/Llama-3.1-8B-Instruct', choices: [], usage: usage(CHUNKS) };
  chunks.push(Buffer.from(`data: ${JSON.stringify(last)}\n\ndata: [DONE]\n\n`));
  return chunks;
}

const floor: Tap = (answer) => {
  answer.on('data', () => undefined);
};

/** Scavenges seen, with their start times (the observer reports them a turn later). */
const collections: PerformanceEntry[] = [];
new PerformanceObserver((list) => collections.push(...list.getEntries())).observe({ entryTypes: ['gc'] });

/** CPU ns per chunk for `streams` streams through `tap`, and when it ran (for the scavenges in that time). */
function measure(tap: Tap, chunks: Buffer[], streams: number, expected: number): { ns: number; from: number; to: number } {
  let wrong = 0;
  const from = performance.now();
  const start = process.cpuUsage();
  for (let s = 0; s < streams; s++) {
    const answer = new EventEmitter() as unknown as IncomingMessage;
    tap(answer, 1000, (tokens) => {
      if (tokens !== expected) wrong++;
    });
    for (const chunk of chunks) answer.emit('data', chunk);
    answer.emit('end');
  }
  const used = process.cpuUsage(start);
  const to = performance.now();
  if (tap !== floor && wrong > 0) throw new Error(`${wrong} streams counted wrong`);
  return { ns: ((used.user + used.system) * 1000) / (streams * chunks.length), from, to };
}

/** Scavenges that started between `from` and `to`. */
function scavengesIn(from: number, to: number): number {
  return collections.filter((entry) => entry.startTime >= from && entry.startTime <= to && (entry as PerformanceEntry & { detail?: { kind?: number } }).detail?.kind === constants.NODE_PERFORMANCE_GC_MINOR).length;
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)];
}

async function main(): Promise<void> {
  const args = parseArgs(process.argv.slice(2));
  const rounds = Number(args.get('rounds') ?? 7);
  const streams = Number(args.get('streams') ?? 2000);
  const taps: [string, Tap][] = [['now', tapUsage]];
  const before = args.get('before');
  if (typeof before === 'string') taps.unshift(['before', ((await import(resolve(before))) as { tapUsage: Tap }).tapUsage]);
  const rows: string[][] = [];
  for (const continuous of [false, true]) {
    const chunks = streamChunks(continuous);
    const expected = 812 + CHUNKS;
    const contenders: [string, Tap][] = [['floor', floor], ...taps];
    const runs = new Map(contenders.map(([name]) => [name, [] as { ns: number; from: number; to: number }[]]));
    // Warm every contender, then interleave the rounds.
    for (const [, tap] of contenders) measure(tap, chunks, streams, expected);
    for (let round = 0; round < rounds; round++) {
      for (const [name, tap] of contenders) runs.get(name)!.push(measure(tap, chunks, streams, expected));
    }
    // The observer reports collections a few turns later.
    await sleep(100);
    const base = median(runs.get('floor')!.map((run) => run.ns));
    const perChunks = 100_000 / (streams * chunks.length);
    for (const [name, run] of runs) {
      const ns = median(run.map((one) => one.ns));
      const scavenges = median(run.map((one) => scavengesIn(one.from, one.to) * perChunks));
      rows.push([continuous ? 'usage in every chunk' : 'usage in the last chunk', name, fixed(ns, 0), name === 'floor' ? '–' : fixed(ns - base, 0), fixed(scavenges, 1)]);
    }
  }
  process.stdout.write(`${CHUNKS + 1} chunks a stream (~${streamChunks(false)[0].length} bytes each), ${streams} streams a round, median of ${rounds} interleaved rounds\n\n`);
  process.stdout.write(`${markdownTable(['stream', 'tap', 'CPU ns per chunk', 'above the floor', 'scavenges per 100k chunks'], rows)}\n`);
  const gc = (globalThis as { gc?: () => void }).gc;
  if (gc === undefined) {
    process.stdout.write('\nMemory per open stream: run with node --expose-gc --import tsx …\n');
    return;
  }
  const contenders: [string, Tap][] = [['floor', floor], ...taps];
  const held = new Map(contenders.map(([name]) => [name, [] as number[]]));
  for (let round = 0; round < 3; round++) for (const [name, tap] of contenders) held.get(name)!.push(heldPerStream(tap, gc));
  const base = median(held.get('floor')!);
  process.stdout.write(`\nMemory per open stream (${OPEN} streams held open after 20 chunks each, heap and ArrayBuffers after full collections, median of 3)\n\n`);
  process.stdout.write(`${markdownTable(['tap', 'bytes per stream', 'above the floor'], [...held].map(([name, bytes]) => [name, fixed(median(bytes), 0), name === 'floor' ? '–' : fixed(median(bytes) - base, 0)]))}\n`);
}

const OPEN = 10_000;

/** Bytes held per stream by `OPEN` answers each tapped and 20 chunks in, still open. */
function heldPerStream(tap: Tap, gc: () => void): number {
  const chunks = streamChunks(false).slice(0, 20);
  gc();
  gc();
  const before = process.memoryUsage();
  const open: EventEmitter[] = [];
  for (let i = 0; i < OPEN; i++) {
    const answer = new EventEmitter();
    tap(answer as unknown as IncomingMessage, 1000, () => undefined);
    // Fresh Buffers, as a socket hands them over: a tap that kept one would hold it.
    for (const chunk of chunks) answer.emit('data', Buffer.from(chunk));
    open.push(answer);
  }
  gc();
  gc();
  const after = process.memoryUsage();
  const bytes = (after.heapUsed + after.arrayBuffers - before.heapUsed - before.arrayBuffers) / OPEN;
  open.length = 0;
  return bytes;
}

void main();
