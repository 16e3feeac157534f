/**
 * The longest event-loop pause while bound KV-event payloads arrive back to back, for three
 * ways of decoding them (bench/kv-events.ts prints the table):
 * - whole: `decodeKvEventBatch` on the event loop, one payload at a time (how payloads were
 *   decoded before; their events were already applied in slices);
 * - cooperative: `decodeKvEventBatchCooperatively` with the subscriber's work budget (what the
 *   subscriber does now);
 * - worker thread: the payload copied to a worker, decoded there, the batch posted back
 *   (a structured clone, deserialized on the event loop), then applied in slices.
 * Each payload is 120,000 blocks of one token: ~240,000 values (the bound is 262,144), 1.2 MB.
 * The events are applied to an index a slice at a time, as apply-batch.ts does, in all three.
 *
 * A pause is measured in CPU time, not wall time, so that other processes' load does not
 * count: a `setImmediate` probe runs once per event-loop iteration, and the process's CPU
 * time between two of its runs is what the loop did in between. For the worker the process's
 * CPU includes the worker's, so its main-thread pause is taken as the larger of receiving one
 * batch (`v8.deserialize` of it, timed alone) and the longest applying slice.
 */
import { deserialize, serialize } from 'node:v8';
import { Worker } from 'node:worker_threads';
import { join } from 'node:path';
import { Packr } from 'msgpackr';
import { DEFAULT_KV_LIMITS, decodeKvEventBatch, decodeKvEventBatchCooperatively, type KvDecodeResult } from '../lib/exact-prefix/events/decode';
import { spend, spendDecoded, yieldToIo } from '../lib/exact-prefix/events/cooperative';
import { slices } from '../lib/exact-prefix/events/apply-batch';
import { KvExactIndex } from '../lib/exact-prefix/index/exact-index';

export type DecodeMode = 'whole' | 'cooperative' | 'worker' | 'apply-only';

export interface PauseFigures {
  /** Longest stretch of the event loop between two iterations, CPU ms. */
  maxPauseMs: number;
  /** The 99th percentile of those stretches, CPU ms. */
  p99PauseMs: number;
  /** CPU (all threads) per payload, ms. */
  cpuPerPayloadMs: number;
}

const BLOCKS = 120_000;

/** `count` payloads of BLOCKS blocks each, with distinct hashes. */
export function boundPayloads(count: number): Buffer[] {
  const packr = new Packr({ useRecords: false, variableMapSize: true });
  return Array.from({ length: count }, (_, p) => {
    const hashes = Array.from({ length: BLOCKS }, (_, i) => 2 ** 40 + p * BLOCKS + i);
    return packr.pack([1.5, [['BlockStored', hashes, null, hashes.map((h) => h % 1000), 1, null, 'GPU']], 0]);
  });
}

const cpuMs = (): number => {
  const usage = process.cpuUsage();
  return (usage.user + usage.system) / 1000;
};

class DecodeWorker {
  // tsx's loader does not reach worker threads by itself: the worker registers it first.
  private readonly worker = new Worker(`require('tsx/cjs'); require(${JSON.stringify(join(__dirname, 'kv-events-worker.ts'))});`, { eval: true });
  private next = 0;
  private readonly waiting = new Map<number, (result: KvDecodeResult) => void>();

  constructor() {
    this.worker.on('message', ({ id, result }: { id: number; result: KvDecodeResult }) => {
      this.waiting.get(id)?.(result);
      this.waiting.delete(id);
    });
  }

  decode(payload: Buffer): Promise<KvDecodeResult> {
    const id = this.next++;
    return new Promise((resolve) => {
      this.waiting.set(id, resolve);
      // A copy: a zeromq frame's memory cannot be transferred.
      this.worker.postMessage({ id, payload: new Uint8Array(payload) });
    });
  }

  close(): Promise<number> {
    return this.worker.terminate();
  }
}

/** The CPU stretches between event-loop iterations while `run` runs, longest first. */
async function probed(run: () => Promise<void>): Promise<number[]> {
  const stretches: number[] = [];
  let last = cpuMs();
  let running = true;
  const tick = () => {
    const now = cpuMs();
    stretches.push(now - last);
    last = now;
    if (running) setImmediate(tick);
  };
  setImmediate(tick);
  await run();
  running = false;
  await new Promise((resolve) => setImmediate(resolve));
  tick();
  return stretches.sort((a, b) => b - a);
}

async function apply(index: KvExactIndex, result: KvDecodeResult): Promise<void> {
  if (!result.ok) throw new Error(result.reason);
  // As the subscriber applies them (apply-batch.ts): a slice of blocks at a time.
  for (const event of result.batch.events) {
    for (const part of slices(event)) {
      index.applyEvent(0, part);
      const wait = spend(part.type === 'cleared' ? 1 : part.blockHashes.length + 1);
      if (wait !== undefined) await wait;
    }
  }
}

/** Feeds `payloads` back to back through `mode` (with `applying`, into an index too); the figures of the run. */
export async function measurePauses(mode: DecodeMode, payloads: readonly Buffer[], applying = true): Promise<PauseFigures> {
  const worker = mode === 'worker' ? new DecodeWorker() : null;
  // Warm up (JIT, and the worker's start) so that the run measures the steady state.
  for (let i = 0; i < 3; i++) await (worker?.decode(payloads[i]) ?? decodeKvEventBatch(payloads[i]));
  const decoded = mode === 'apply-only' ? payloads.map((payload) => decodeKvEventBatch(payload)) : [];
  // A rank's worth of blocks: the index stays at its budget (evicting), as a busy one does.
  const index = new KvExactIndex({ ranks: [0], maxBlocks: 131_072 });
  await yieldToIo();
  const cpuBefore = cpuMs();
  const stretches = await probed(async () => {
    for (const [at, payload] of payloads.entries()) {
      let result: KvDecodeResult;
      if (mode === 'whole') result = decodeKvEventBatch(payload, DEFAULT_KV_LIMITS);
      else if (mode === 'cooperative') result = await decodeKvEventBatchCooperatively(payload, DEFAULT_KV_LIMITS, spendDecoded);
      else if (mode === 'worker') result = await (worker as DecodeWorker).decode(payload);
      else result = decoded[at];
      if (!result.ok) throw new Error(result.reason);
      if (applying) await apply(index, result);
      // What the subscriber's receive loop does between messages.
      await yieldToIo();
    }
  });
  const cpuPerPayloadMs = (cpuMs() - cpuBefore) / payloads.length;
  await worker?.close();
  let longest = stretches[0];
  let p99 = stretches[Math.floor(stretches.length / 100)];
  if (mode === 'worker') {
    // The probe saw the worker's CPU too: the main thread's own longest stretch is receiving a
    // batch, or one applying slice (the apply-only run's figure).
    const bytes = serialize(decodeKvEventBatch(payloads[0]));
    let receive = 0;
    for (let i = 0; i < 5; i++) {
      const start = cpuMs();
      deserialize(bytes);
      receive = Math.max(receive, cpuMs() - start);
    }
    const applied = applying ? await measurePauses('apply-only', payloads) : { maxPauseMs: 0, p99PauseMs: 0 };
    longest = Math.max(receive, applied.maxPauseMs);
    p99 = Math.max(receive, applied.p99PauseMs);
  }
  return { maxPauseMs: longest, p99PauseMs: p99, cpuPerPayloadMs };
}
