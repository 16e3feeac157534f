import type { KvEvent } from '../../lib/exact-prefix/events/decode';
import { KvExactIndex } from '../../lib/exact-prefix/index/exact-index';
import { ExactPick } from '../../lib/policies/exact-pick';
import { prefixAware, type PrefixAwareOptions, type PrefixAwarePolicy, type PrefixPickContext } from '../../lib/policies/prefix-aware';
import type { Endpoint, PickContext, Policy } from '../../lib/types';
import type { SimRank } from '../routing/rank';
import type { SimView } from '../routing/simulator';

/** Receives a rank's KV events, as a replica's subscriber hands them to its index. */
export type KvEventListener = (rank: number, event: KvEvent) => void;

/**
 * A rank's prefix cache that publishes what it does, as vLLM's KV events: the same LRU as the
 * simulator's `PrefixCache` (blocks touched last to first, the oldest evicted past capacity),
 * plus a `stored` event for every run of newly cached blocks (parent first) and a `removed`
 * event for every eviction. The simulator keys a block by its chained hash; the events carry
 * that hash as both the engine's block hash and the block's one "token", so the router's index
 * chains them as it chains real token blocks (block size 1). Events are delivered at the moment
 * the engine caches: the simulated transport has no delay.
 */
export class EventedPrefixCache {
  private readonly blocks = new Map<number, true>();
  readonly listeners: KvEventListener[] = [];
  /** Every event published, oldest first: the engine's replay buffer, never wrapped here. */
  readonly published: KvEvent[] = [];
  /** Blocks published in `stored` events, over the run. */
  storedBlocks = 0;

  constructor(
    readonly rank: number,
    private readonly capacity: number,
  ) {}

  /** Leading blocks present, without touching them. */
  peek(hashes: Int32Array): number {
    let run = 0;
    while (run < hashes.length && this.blocks.has(hashes[run])) run++;
    return run;
  }

  /** Inserts or refreshes every block, then publishes what was new and what was evicted. */
  store(hashes: Int32Array): void {
    const added = new Uint8Array(hashes.length);
    for (let i = hashes.length - 1; i >= 0; i--) {
      const hash = hashes[i];
      if (!this.blocks.delete(hash)) added[i] = 1;
      this.blocks.set(hash, true);
    }
    for (let i = 0; i < hashes.length; i++) {
      if (added[i] === 0) continue;
      let end = i;
      while (end + 1 < hashes.length && added[end + 1] === 1) end++;
      const run = Array.from(hashes.subarray(i, end + 1));
      this.publish({
        type: 'stored',
        blockHashes: run,
        parentBlockHash: i === 0 ? null : hashes[i - 1],
        tokenIds: run,
        blockSize: 1,
        loraId: null,
        loraName: null,
        medium: 'GPU',
        extraKeyed: null,
        groupIdx: null,
      });
      this.storedBlocks += run.length;
      i = end;
    }
    const removed: number[] = [];
    while (this.blocks.size > this.capacity) {
      const oldest = this.blocks.keys().next().value as number;
      this.blocks.delete(oldest);
      removed.push(oldest);
    }
    if (removed.length > 0) this.publish({ type: 'removed', blockHashes: removed, medium: 'GPU', groupIdx: null });
  }

  private publish(event: KvEvent): void {
    this.published.push(event);
    for (const listener of this.listeners) listener(this.rank, event);
  }
}

/** Swaps each simulated rank's cache for one that publishes KV events; returns them. */
export function publishEvents(ranks: readonly SimRank[], cacheBlocks: number): EventedPrefixCache[] {
  return ranks.map((rank) => {
    const cache = new EventedPrefixCache(rank.index, cacheBlocks);
    (rank as unknown as { cache: EventedPrefixCache }).cache = cache;
    return cache;
  });
}

/**
 * One gateway replica routing on KV events: its own `KvExactIndex` (lib/kv-events), fed every
 * rank's events, and prefix-aware scoring every rank on it (the router's code path: an
 * `ExactPick` in the pick context, speculative entries for each routed prompt until its events
 * confirm it). The request's "tokens" are its block hashes, as the events carry them.
 * Speculative entries never expire here (every simulated request is prefilled, so its events
 * always come); the router's expire after `speculativeMs`.
 */
export function exactFromEvents(
  view: SimView,
  caches: readonly EventedPrefixCache[],
  options: PrefixAwareOptions = {},
  { replay = false }: { replay?: boolean } = {},
): Policy & Pick<PrefixAwarePolicy, 'uncachedBlocks'> {
  const index = new KvExactIndex({ ranks: caches.map((_, rank) => rank), maxBlocks: Number.MAX_SAFE_INTEGER });
  // A replica started mid-run with `replay` first reads each rank's buffered events (item 5 of
  // issue 27, vLLM's replay socket), so its index starts as the engines are.
  if (replay) for (const cache of caches) for (const event of cache.published) index.applyEvent(cache.rank, event);
  for (const cache of caches) cache.listeners.push((rank, event) => index.applyEvent(rank, event));
  const inner = prefixAware(options);
  return {
    name: 'exact',
    usesPrompt: true,
    /** The last pick's prefill, what the replica announces to its peers (`SimExtras.peers`). */
    get uncachedBlocks() {
      return inner.uncachedBlocks;
    },
    pick(candidates: readonly Endpoint[], ctx: PickContext): Endpoint {
      const tokens = view.current().inputBlocks;
      const match = index.match(tokens, { now: 0 });
      let exact: ExactPick | undefined;
      if (match.promptBlocks > 0) {
        const matched = new Int32Array(candidates.length);
        for (let at = 0; at < candidates.length; at++) matched[at] = match.matchedBlocks[candidates[at].rank];
        exact = new ExactPick(match.promptBlocks, matched, (at) => index.speculate(candidates[at].rank, tokens, Infinity));
      }
      const context: PrefixPickContext = { ...ctx, exact };
      return inner.pick(candidates, context);
    },
  };
}
