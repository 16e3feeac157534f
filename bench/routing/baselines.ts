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

/** SGLang router's cache-aware defaults. */
export const SGLANG_DEFAULTS = { cacheThreshold: 0.5, balanceAbsThreshold: 32, balanceRelThreshold: 1.1 } as const;

/**
 * SGLang router's `cache_aware` policy: shortest queue when loads are imbalanced; otherwise
 * the tree's best-matching worker if the match covers more than `cacheThreshold` of the
 * text, else the worker with the smallest tree. Its default tree limit (2^26 characters per
 * worker) is never reached here, so no eviction is modelled.
 */
export function sglangCacheAware(options: Partial<typeof SGLANG_DEFAULTS> = {}): Policy {
  const { cacheThreshold, balanceAbsThreshold, balanceRelThreshold } = { ...SGLANG_DEFAULTS, ...options };
  const tree = new ApproximateRadixTree();
  return {
    name: 'sglang-cache-aware',
    usesPrompt: true,
    pick(candidates: readonly Endpoint[], ctx: PickContext): Endpoint {
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
        else chosen = candidates.reduce((small, c) => (tree.size(c.key) < tree.size(small.key) ? c : small));
      }
      tree.insert(text, chosen.key);
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
