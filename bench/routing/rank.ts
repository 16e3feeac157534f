import type { SimRequest } from './workloads';

/** How a simulated vLLM engine spends time. */
export interface RankModel {
  /** Prefill throughput on uncached tokens. */
  readonly prefillTokensPerSecond: number;
  /** Fixed cost of a prefill step (scheduling, the first decode step). */
  readonly prefillOverheadSeconds: number;
  readonly decodeSecondsPerToken: number;
  /** Most requests running at once (`--max-num-seqs`); the rest wait in a FIFO queue. */
  readonly runningSlots: number;
}

/**
 * vLLM's prefix cache: full blocks keyed by chained hashes, evicted least recently used.
 * A request's blocks are touched last to first, as vLLM frees them, so a prefix's head
 * outlives its tail. Blocks held by running requests are not pinned here (a simplification).
 */
export class PrefixCache {
  private readonly blocks = new Map<number, true>();

  constructor(private readonly capacity: number) {}

  /** Leading blocks present, without touching them. */
  peek(hashes: Int32Array): number {
    let run = 0;
    while (run < hashes.length && this.blocks.has(hashes[run])) run++;
    return run;
  }

  /** Inserts or refreshes every block. */
  store(hashes: Int32Array): void {
    for (let i = hashes.length - 1; i >= 0; i--) {
      const hash = hashes[i];
      this.blocks.delete(hash);
      this.blocks.set(hash, true);
    }
    while (this.blocks.size > this.capacity) {
      this.blocks.delete(this.blocks.keys().next().value as number);
    }
  }
}

/** The upper bound: the same rank with a cache that never evicts. */
export class UnboundedCache {
  private readonly blocks = new Set<number>();

  peek(hashes: Int32Array): number {
    let run = 0;
    while (run < hashes.length && this.blocks.has(hashes[run])) run++;
    return run;
  }

  store(hashes: Int32Array): void {
    for (const hash of hashes) this.blocks.add(hash);
  }
}

/** One data-parallel engine: a waiting queue, a running-slot cap, one prefill at a time. */
export class SimRank {
  readonly cache: PrefixCache;
  readonly unbounded = new UnboundedCache();
  readonly waiting: SimRequest[] = [];
  private waitingHead = 0;
  /** Requests admitted and not finished (prefilling or decoding), as vLLM counts `running`. */
  running = 0;
  prefilling = false;

  constructor(
    readonly index: number,
    cacheBlocks: number,
  ) {
    this.cache = new PrefixCache(cacheBlocks);
  }

  get waitingCount(): number {
    return this.waiting.length - this.waitingHead;
  }

  enqueue(request: SimRequest): void {
    this.waiting.push(request);
  }

  /** The next request to admit, if a slot and the prefill stage are free. */
  admit(model: RankModel): SimRequest | undefined {
    if (this.prefilling || this.running >= model.runningSlots || this.waitingCount === 0) return undefined;
    const request = this.waiting[this.waitingHead++];
    if (this.waitingHead > 1024 && this.waitingHead * 2 > this.waiting.length) {
      this.waiting.splice(0, this.waitingHead);
      this.waitingHead = 0;
    }
    this.running++;
    this.prefilling = true;
    return request;
  }
}
