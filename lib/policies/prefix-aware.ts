import { randomKey32, rendezvousWeight } from '../hash';
import type { ExactPick } from './exact-pick';
import type { PickSteer } from './pick-steer';
import type { Endpoint, PickContext } from '../types';
import { PICK_RESULT, type PickResult } from './pick-result';
import { BlockIndex, blockHomes } from './prefix-aware-index';
import { PromptBlockHasher } from './prefix-aware-hasher';
import { type PeerLoad, PrefillCostModel } from './prefix-aware-ttft';
import { exactUncachedAt, LEAD_BLOCKS, LOAD_WEIGHT, MAX_EXCESS, MISS_WEIGHT, sharedPrefix, waitingElsewhere, WORK_SMOOTHING } from './prefix-aware-costs';
import { type EndpointState, EndpointStates } from './prefix-aware-state';
import { parsePrefixAwarePolicy, type PrefixAwareOptions } from './prefix-aware-options';
import { DEFAULT_LOAD_FACTOR, DEFAULT_LOAD_SLACK, type SessionAffinitySettings } from './session-affinity-options';

export type { PrefixAwareOptions } from './prefix-aware-options';
export type { PrefixAwarePolicy, PrefixPickContext } from './prefix-aware-types';
import type { PrefixAwarePolicy, PrefixPickContext } from './prefix-aware-types';

// Module bindings, not global reads in the per-candidate loops: code run in a vm context
// (jest) pays an interceptor lookup for each global it reads.
const { ceil, max, min } = Math;
const INFINITY = Infinity;
export { BlockIndex, hashPromptBlocks, MAX_PROBES } from './prefix-aware-index';

/** Picks after this many requests drop the index of an endpoint absent from all of them. */
const FORGET_AFTER_PICKS = 4096;

/**
 * Routes a prompt to the endpoint where it is likely to get its first token soonest, counting
 * what the KV cache saves. The prompt is cut into fixed-size character blocks, chain-hashed
 * (a block's hash covers all text before it, as vLLM's block hashes do) and matched against a
 * bounded per-endpoint index of the blocks it was sent. Each candidate's predicted time to
 * first token is, in blocks of prefill:
 *
 * - its **queue**: the uncached blocks of the requests this policy sent there that have not
 *   given their first token (see {@link PendingPrefill}), load it did not send (other gateways',
 *   by load feedback) at a typical request's blocks each, and `b × load` with `b` learned online
 *   from the measured times to first token ({@link PrefillCostModel}) plus one typical request
 *   per unit of load (`LOAD_WEIGHT`);
 * - its **uncached blocks**: the prompt's blocks after its longest matching leading run, twice
 *   (`MISS_WEIGHT`: a miss also copies the prefix onto a second cache);
 * - its **content share** above its fair part, at most half the prompt, see `contentBalance`;
 *
 * and the least wins. A prompt whose lead (its first 4 blocks) no candidate holds (on the GPU,
 * or by the exact index in a lower tier `prefixAware.tierWeights` scores) is a new prefix: it goes to the first endpoint of the lead's rendezvous (highest-random-weight) order
 * whose queue (with its content share) is within `placementSlack` prompts of the shortest and
 * whose load is within session-affinity's bound at its defaults (`max(⌈loadFactor × mean⌉,
 * least + loadSlack)`, see {@link SessionAffinitySettings}). That order depends only on the
 * prompt's text and the endpoint keys, so gateway replicas that share the traffic, each
 * learning only from its own share, place a new prefix on the same endpoint and find it there
 * later, unless its queue or cache is well past another's; a private rule (the emptiest
 * endpoint in this gateway's view) would cache each prefix once per replica. Ties between
 * holders also go by that order.
 *
 * Per pick: one pass hashing the prompt (see {@link PromptBlockHasher}) and one computing its
 * blocks' home slots, shared by every index; then per candidate a probe for the lead, per
 * holder of the lead a binary search of its matching run (the shortest queue's first, then
 * skipped or cut short where the candidate cannot win), for a new prefix one rendezvous hash
 * per candidate, and on the chosen endpoint the prompt's blocks recorded down to the first one
 * held ({@link BlockIndex.recordChain}); no allocation once the buffers have grown to the
 * longest prompt and the endpoints are known.
 */
export function prefixAware(options: PrefixAwareOptions = {}): PrefixAwarePolicy {
  const { blockChars, maxBlocksPerEndpoint: maxBlocks, maxBlocksPerRequest: maxRequestBlocks, contentBalance, placementSlack, fallback } = parsePrefixAwarePolicy('prefixAware', options);
  // One key for every index of this policy: slots are unpredictable to clients, and the
  // content hashes themselves stay deterministic (replicas may place prefixes by them).
  const slotKey = randomKey32();
  /** Per endpoint: its block index, its pending prefill, its rendezvous identity. */
  const states = new EndpointStates();
  const hasher = new PromptBlockHasher(blockChars, maxRequestBlocks);
  /** The current pick's block hashes (`hasher.hashes`). */
  let blockHashes = hasher.hashes;
  /** Their home slots, the same in every index of this policy (one key, one size): computed once per pick. */
  let homes = new Int32Array(blockHashes.length);
  const slotMask = BlockIndex.maskFor(maxBlocks);
  /** Each candidate's cost during one pick (NaN when its search was skipped), reused across picks. */
  let candidateCosts = new Float64Array(0);
  /** Each candidate's queue during one pick, in blocks, reused across picks. */
  let candidateQueues = new Float64Array(0);
  /** Whether each candidate's index holds the prompt's lead, during one pick. */
  let candidateHolds = new Uint8Array(0);
  /** Each candidate's leading run during one pick, where its search ran to the end; −1 elsewhere. */
  let candidateRuns = new Int32Array(0);
  const costModel = new PrefillCostModel();
  let picks = 0;
  /** Running mean of the uncached blocks of routed requests; negative until the first. */
  let typicalWork = -1;
  /** Sum of every index's `recentBlocks`. */
  let recentTotal = 0;
  /** What the last pick found: filled by each pick (`PICK_RESULT`), read by the router at once. */
  const result: PickResult & { matchedShare: number; uncachedBlocks: number } = { endpoint: undefined as unknown as Endpoint, index: 'approximate', matchedShare: 0, uncachedBlocks: 0 };

  function hashBlocks(prompt: string): number {
    const count = hasher.hash(prompt);
    blockHashes = hasher.hashes;
    if (homes.length < blockHashes.length) homes = new Int32Array(blockHashes.length);
    blockHomes(blockHashes, count, slotKey, slotMask, homes);
    return count;
  }

  /** The rendezvous weight of `candidates[at]` for `lead`, during a pick. */
  function weightAt(at: number, lead: number): number {
    return rendezvousWeight(lead, states.cachedAt(at).hash);
  }

  /** The candidate's queue before this request, in blocks of prefill (see {@link PendingPrefill}). */
  function queueAt(candidate: Endpoint & PeerLoad, state: EndpointState, ratio: number, work: number): number {
    const load = candidate.load;
    return state.pending.blocks + waitingElsewhere(candidate, load, work) + (ratio + LOAD_WEIGHT * work) * load;
  }

  /**
   * Completes the cost of `candidates[at]`, a holder of the lead, by its leading run, unless it
   * cannot reach `bound`: then its cost is NaN (it neither wins nor ties). Returns the new bound.
   */
  function searchAt(at: number, blockCount: number, bound: number, guess = 0): number {
    const cost = candidateCosts[at];
    // Uncached blocks are at least none: skip the search when even none cannot win (or tie).
    if (cost > bound) {
      candidateCosts[at] = NaN;
      return bound;
    }
    // To win or tie, the run must reach `toBeat` blocks: one probe tells when it cannot.
    const toBeat = bound === INFINITY ? 0 : ceil(blockCount - (bound - cost) / MISS_WEIGHT - 1e-9);
    const run = (states.cachedAt(at).index as BlockIndex).leadingRun(blockHashes, blockCount, toBeat, homes, guess);
    const total = cost + MISS_WEIGHT * (blockCount - run);
    // A run cut short (0 below `toBeat`) is of a candidate that cannot be chosen.
    candidateRuns[at] = run;
    candidateCosts[at] = total;
    return total < bound ? total : bound;
  }

  /** The content-balance term of a candidate with `index`: its share of the recent new blocks above the fair one, priced as prefill. */
  function contentCost(index: BlockIndex | undefined, fairRecent: number, blockCount: number): number {
    const recent = index === undefined ? 0 : index.recentBlocks;
    return recent > fairRecent ? contentBalance * MISS_WEIGHT * blockCount * min(MAX_EXCESS, recent / fairRecent - 1) : 0;
  }

  /**
   * The candidate with the least predicted time to first token, as a position: its queue (see
   * `queueAt`) plus this request's uncached blocks there. A candidate `exact` scores costs its
   * share of the prompt its rank lacks by the engine's events instead of the approximate
   * index's guess, and the content-balance term only where the events show the prompt's
   * longest cached prefix on two ranks or more (see {@link sharedPrefix}): the term counts this
   * replica's own traffic, a sample of every replica's, while the events are the same for all.
   */
  function choose(candidates: readonly Endpoint[], blockCount: number, exact: ExactPick | undefined, slo: PickSteer | undefined): number {
    let minLoad = INFINITY;
    let totalLoad = 0;
    let candidateRecent = 0;
    for (let at = 0; at < candidates.length; at++) {
      const candidate = candidates[at];
      const load = candidate.load;
      if (load < minLoad) minLoad = load;
      totalLoad += load;
      const state = states.at(candidate, at, picks);
      if (state.index !== undefined) candidateRecent += state.index.recentBlocks;
      // Only an endpoint this policy has sent to (it has an index) has prefill pending.
      if (state.index !== undefined) state.pending.settle(candidate, costModel);
    }
    const work = typicalWork < 0 ? blockCount : typicalWork;
    // A unit of load is worth at most one more typical request: a fit on few or skewed samples must not outweigh the cache.
    const ratio = min(costModel.blocksPerLoad(), work);
    const fairRecent = candidateRecent / candidates.length;
    const leadAt = min(blockCount, LEAD_BLOCKS) - 1;
    const lead = blockHashes[leadAt];
    const leadHome = homes[leadAt];

    if (candidateCosts.length < candidates.length) {
      candidateCosts = new Float64Array(candidates.length);
      candidateQueues = new Float64Array(candidates.length);
      candidateHolds = new Uint8Array(candidates.length);
      candidateRuns = new Int32Array(candidates.length);
    }
    // First each candidate's cost without the match its index would find: whole for an exact
    // candidate and one without the lead, a bound from below for a holder of the lead. Then the
    // holders' searches, the one with the least bound first: its cost, usually the least, lets
    // the others' searches stop at a probe or two (or not start), whatever their order. The
    // least cost and the candidates that reach it are the same as in one pass in order: a
    // search is skipped or stopped only for a candidate that costs more than some other.
    let bound = INFINITY;
    let anyMatch = false;
    let firstHolder = -1;
    let firstBound = INFINITY;
    const exactLead = exact === undefined ? 0 : min(LEAD_BLOCKS, exact.promptBlocks);
    const exactBalance = exact !== undefined && sharedPrefix(exact.matched, candidates.length, exactLead);
    for (let at = 0; at < candidates.length; at++) {
      const candidate = candidates[at];
      const state = states.cachedAt(at);
      const index = state.index;
      let cost = queueAt(candidate, state, ratio, work);
      const held = exact === undefined ? -1 : exact.matched[at];
      candidateHolds[at] = 0;
      candidateRuns[at] = -1;
      if (held >= 0) {
        if (exactBalance) cost += contentCost(index, fairRecent, blockCount);
        candidateQueues[at] = cost;
        // A prefix kept in a scored lower tier is not new either: its holder is priced, not passed over for the lead's order.
        if (exact!.holdsLead(at, exactLead)) anyMatch = true;
        cost += MISS_WEIGHT * exactUncachedAt(blockCount, exact!, at);
      } else {
        cost += contentCost(index, fairRecent, blockCount);
        candidateQueues[at] = cost;
        if (index !== undefined && index.hasAt(lead, leadHome)) {
          anyMatch = true;
          candidateHolds[at] = 1;
          candidateCosts[at] = cost;
          if (firstHolder < 0 || cost < firstBound) {
            firstHolder = at;
            firstBound = cost;
          }
          continue;
        }
        // Uncached: the whole prompt without the lead.
        cost += MISS_WEIGHT * blockCount;
      }
      candidateCosts[at] = cost;
      if (cost < bound) bound = cost;
    }
    if (firstHolder >= 0) {
      if (slo === undefined) {
        bound = min(bound, searchAt(firstHolder, blockCount, bound));
        for (let at = 0; at < candidates.length; at++) if (candidateHolds[at] === 1 && at !== firstHolder) bound = min(bound, searchAt(at, blockCount, bound));
      } else {
        // With objectives every holder's run is needed (the cheapest may miss them): no bound,
        // but each search starts from the run the one before found (the same, mostly).
        let guess = 0;
        for (let at = 0; at < candidates.length; at++) {
          if (candidateHolds[at] !== 1) continue;
          bound = min(bound, searchAt(at, blockCount, INFINITY, guess));
          guess = candidateRuns[at];
        }
      }
    }
    let bestAt = 0;
    let bestCost = INFINITY;
    let ties = 0;
    for (let at = 0; at < candidates.length; at++) {
      const cost = candidateCosts[at];
      if (cost < bestCost) {
        bestAt = at;
        bestCost = cost;
        ties = 0;
      } else if (cost === bestCost) {
        ties++;
      }
    }
    if (!anyMatch) {
      bestAt = place(candidates, blockCount, lead, minLoad, totalLoad);
    } else if (ties > 0) {
      // A rendezvous order decides between the cheapest, the same in every replica: the lead's,
      // or the whole prompt's between ranks the events show holding the lead (see `tieKey`).
      const key = tieKey(exact, bestAt, exactLead, lead, blockCount);
      let bestWeight = -1;
      for (let at = 0; at < candidates.length; at++) {
        if (candidateCosts[at] !== bestCost) continue;
        const weight = weightAt(at, key);
        if (weight > bestWeight) {
          bestWeight = weight;
          bestAt = at;
        }
      }
    }
    return slo === undefined ? bestAt : steer(slo, candidates, blockCount, exact, work, bestAt);
  }

  /** Each candidate's prefill (own and queued ahead) and load for the SLO choice, which then picks. */
  function steer(slo: PickSteer, candidates: readonly Endpoint[], blockCount: number, exact: ExactPick | undefined, work: number, bestAt: number): number {
    const est = slo.estimates;
    est.ensure(candidates.length);
    for (let at = 0; at < candidates.length; at++) {
      const candidate = candidates[at];
      const held = exact === undefined ? -1 : exact.matched[at];
      est.uncached[at] = held >= 0 ? exactUncachedAt(blockCount, exact!, at) : candidateRuns[at] >= 0 ? blockCount - candidateRuns[at] : blockCount;
      est.ahead[at] = states.cachedAt(at).pending.blocks + waitingElsewhere(candidate, candidate.load, work);
      est.load[at] = candidate.load;
      est.cost[at] = candidateCosts[at];
    }
    return slo.steer(candidates, candidates.length, bestAt);
  }

  /**
   * The hash whose rendezvous order breaks a tie whose first candidate is `candidates[at]`.
   * Between ranks the events show holding the prompt's lead, the whole prompt's (its last
   * block's chained hash): the events, not the order, tell every replica where the prefix
   * lives, so prompts extending a prefix held on several ranks (new conversations on a shared
   * system prompt) spread over them instead of all going to the first of the lead's order. A
   * tie between ranks without the prefix (a prompt spilling off its holders, or on the
   * approximate index) goes by the lead's order, so that the spilled prompts of one prefix meet
   * on one rank and find it there: with the whole prompt's order there too, the closed loop's
   * hit rate with one replica under pressure fell from 69.1 to 66.1 % (`npm run bench:replicas
   * -- --size small`, before the shared-prefix rule).
   */
  function tieKey(exact: ExactPick | undefined, at: number, exactLead: number, lead: number, blockCount: number): number {
    return exact !== undefined && exact.matched[at] >= exactLead ? blockHashes[blockCount - 1] : lead;
  }

  /**
   * A new prefix: the first candidate of its lead's rendezvous order whose queue (`queueAt`,
   * with its content-balance term) is within `placementSlack` prompts of the shortest and whose
   * load is within session-affinity's bound at its default `loadFactor` and `loadSlack`. The
   * order depends on the prompt and the endpoint keys only, so replicas whose views of the
   * queues are alike place the prefix alike; a rank with a long queue, or that took more than
   * its share of new blocks (its cache full of them), is passed over while another has room.
   */
  function place(candidates: readonly Endpoint[], blockCount: number, lead: number, minLoad: number, totalLoad: number): number {
    const loadCap = max(ceil((DEFAULT_LOAD_FACTOR * totalLoad) / candidates.length), minLoad + DEFAULT_LOAD_SLACK);
    let shortest = INFINITY;
    for (let at = 0; at < candidates.length; at++) if (candidateQueues[at] < shortest) shortest = candidateQueues[at];
    const queueCap = shortest + placementSlack * blockCount;
    let chosen = 0;
    let chosenWeight = -1;
    for (let at = 0; at < candidates.length; at++) {
      // The least loaded candidate is always within the bound (unless a load is NaN), and the
      // shortest queue within its own.
      if (candidates[at].load > loadCap || candidateQueues[at] > queueCap) continue;
      const weight = weightAt(at, lead);
      if (weight > chosenWeight) {
        chosen = at;
        chosenWeight = weight;
      }
    }
    return chosen;
  }

  const policy: PrefixAwarePolicy = {
    name: 'prefix-aware',
    usesPrompt: true,
    namesIndex: true,
    reportsMatchedShare: true,
    learnsFirstTokens: true,
    get matchedShare() {
      return result.matchedShare;
    },
    get uncachedBlocks() {
      return result.uncachedBlocks;
    },
    get prefillCost() {
      return { secondsPerBlock: costModel.secondsPerBlock, blocksPerLoad: costModel.blocksPerLoad() };
    },
    pick(candidates: readonly Endpoint[], ctx: PickContext): Endpoint {
      return policy[PICK_RESULT](candidates, ctx).endpoint;
    },
    [PICK_RESULT](candidates: readonly Endpoint[], ctx: PickContext): PickResult {
      const prompt = ctx.prompt;
      const blockCount = prompt === undefined ? 0 : hashBlocks(prompt);
      result.index = 'approximate';
      result.matchedShare = 0;
      result.uncachedBlocks = 0;
      if (blockCount === 0) {
        result.endpoint = fallback.pick(candidates, ctx);
        return result;
      }
      if (++picks % FORGET_AFTER_PICKS === 0) recentTotal -= states.forget(picks, FORGET_AFTER_PICKS);
      const exact = (ctx as PrefixPickContext).exact;
      const chosenAt = choose(candidates, blockCount, exact, (ctx as PrefixPickContext).slo);
      // Shed (lib/slo): nothing is recorded for a request that goes nowhere.
      if (chosenAt < 0) {
        result.endpoint = candidates[0];
        return result;
      }
      const chosen = candidates[chosenAt];
      const state = states.cachedAt(chosenAt);
      let index = state.index;
      if (index === undefined) {
        index = new BlockIndex(maxBlocks, slotKey);
        state.index = index;
        states.indexed++;
        // Answers from before this policy sent anything here are not in its queue.
        state.pending.settle(chosen, costModel);
      }
      // The approximate index learns from every pick, so that it is warm when a rank falls back to it.
      const uncached = exact?.chose(chosenAt) === 'exact'
        ? exactUncachedAt(blockCount, exact, chosenAt)
        : blockCount - (candidateRuns[chosenAt] >= 0 ? candidateRuns[chosenAt] : index.leadingRun(blockHashes, blockCount, 0, homes));
      typicalWork = typicalWork < 0 ? uncached : typicalWork + (uncached - typicalWork) * WORK_SMOOTHING;
      result.endpoint = chosen;
      result.index = exact === undefined ? 'approximate' : exact.source;
      result.matchedShare = 1 - uncached / blockCount;
      result.uncachedBlocks = uncached;
      const pending = state.pending;
      pending.push(uncached, pending.blocks + waitingElsewhere(chosen, chosen.load, typicalWork < 0 ? uncached : typicalWork) + uncached, chosen.load);
      const added = index.recordChain(blockHashes, blockCount, homes);
      index.recentBlocks += added;
      recentTotal += added;
      // "Recent" is about the last one to two caches' worth of new blocks per endpoint.
      if (recentTotal > maxBlocks * states.indexed) {
        recentTotal = 0;
        for (const held of states.values()) {
          if (held.index === undefined) continue;
          held.index.recentBlocks /= 2;
          recentTotal += held.index.recentBlocks;
        }
      }
      return result;
    },
  };
  return policy;
}
