import type { Endpoint, PickContext, Policy } from '../../lib/types';
import { ApproximateRadixTree } from './radix-tree';
import type { SimView } from './simulator';

/** vLLM's internal data-parallel balancer: the lowest `waiting × 4 + running`, first on ties. */
export function vllmInternalBalancer(view: SimView): Policy {
  return {
    name: 'vllm-internal',
    pick(candidates: readonly Endpoint[]): Endpoint {
      let best = candidates[0];
      let bestScore = Infinity;
      for (const candidate of candidates) {
        const rank = view.rankOf(candidate);
        const score = rank.waitingCount * 4 + rank.running;
        if (score < bestScore) [best, bestScore] = [candidate, score];
      }
      return best;
    },
  };
}

/**
 * SGLang's cache-aware defaults as a launched router ships them: the Rust CLI (`main.rs`) and
 * the Python `RouterArgs` (`sgl-model-gateway/bindings/python/src/sglang_router/router_args.py`
 * @ 05e589ad6f75127e5302a250d9e83a881fbb3a3b). The Rust library's `CacheAwareConfig::default()`
 * (0.5 / 32 / 1.1, `max_tree_size` 10,000) applies to its own tests only.
 */
export const SGLANG_DEFAULTS = {
  cacheThreshold: 0.3,
  balanceAbsThreshold: 64,
  balanceRelThreshold: 1.5,
  /** `--eviction-interval` (Rust CLI: 120 s; Python `RouterArgs`: 60 s). */
  evictionIntervalSeconds: 120,
  /** Characters per tenant (worker) the tree keeps after an eviction pass: 2^26. */
  maxTreeSize: 2 ** 26,
} as const;

/**
 * SGLang's `cache_aware` policy as `sgl-model-gateway/src/policies/cache_aware.rs` @
 * b93974f140de1e545d9134d87e77f0bd1fbf3014 does it: with the loads (the router's own in-flight
 * counts) imbalanced — max − min above `balanceAbsThreshold` and max above `balanceRelThreshold`
 * × min — the least loaded worker (the tree still learns the prompt); otherwise the tree's
 * matching worker if the match covers more than `cacheThreshold` of the text's characters, else
 * the least loaded worker. (The older `sgl-router/src/policies/cache_aware.rs` @
 * b6f20641ad6bafc1278db74d1e13b0e9da47bd64 took the worker with the smallest tree there.) Every
 * `evictionIntervalSeconds` of simulated time, the tree evicts each tenant down to `maxTreeSize`
 * characters, least recently used leaves first (`tree.rs` `evict_tenant_by_size`).
 */
export function sglangCacheAware(view: Pick<SimView, 'now'>, options: Partial<typeof SGLANG_DEFAULTS> = {}): Policy {
  const { cacheThreshold, balanceAbsThreshold, balanceRelThreshold, evictionIntervalSeconds, maxTreeSize } = { ...SGLANG_DEFAULTS, ...options };
  const tree = new ApproximateRadixTree();
  let nextEviction = evictionIntervalSeconds;
  return {
    name: 'sglang-cache-aware',
    usesPrompt: true,
    pick(candidates: readonly Endpoint[], ctx: PickContext): Endpoint {
      while (view.now() >= nextEviction) {
        tree.evictTenantBySize(maxTreeSize);
        nextEviction += evictionIntervalSeconds;
      }
      let least = candidates[0];
      let most = candidates[0];
      for (const candidate of candidates) {
        if (candidate.inflight < least.inflight) least = candidate;
        if (candidate.inflight > most.inflight) most = candidate;
      }
      const text = ctx.prompt ?? '';
      const imbalanced =
        most.inflight - least.inflight > balanceAbsThreshold && most.inflight > least.inflight * balanceRelThreshold;
      let chosen = least;
      if (!imbalanced) {
        const { matchedChars, tenant } = tree.prefixMatch(text);
        const matched = text.length > 0 ? candidates.find((c) => c.key === tenant) : undefined;
        if (matched !== undefined && matchedChars / text.length > cacheThreshold) chosen = matched;
      }
      if (text.length > 0) tree.insert(text, chosen.key);
      return chosen;
    },
  };
}

/** The rank that really holds the longest cached prefix of the request; least loaded on ties. */
export function oracle(view: SimView): Policy {
  return {
    name: 'oracle',
    pick(candidates: readonly Endpoint[]): Endpoint {
      const blocks = view.current().inputBlocks;
      let best = candidates[0];
      let bestRun = -1;
      for (const candidate of candidates) {
        const run = view.rankOf(candidate).cache.peek(blocks);
        if (run > bestRun || (run === bestRun && candidate.load < best.load)) [best, bestRun] = [candidate, run];
      }
      return best;
    },
  };
}
