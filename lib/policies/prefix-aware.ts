import { endpointHash, hashString, keyedMix32, randomKey32, rendezvousWeight } from '../hash';
import type { ExactPick } from '../exact-prefix/index/exact-pick';
import type { Endpoint, PickContext, Policy } from '../types';
import { parsePrefixAwarePolicy, type PrefixAwareOptions } from './prefix-aware-options';
import { DEFAULT_LOAD_FACTOR, DEFAULT_LOAD_SLACK, type SessionAffinitySettings } from './session-affinity-options';

export type { PrefixAwareOptions } from './prefix-aware-options';

/**
 * What the router adds to the pick context when exact routing from KV events applies: per
 * candidate, the blocks its rank holds by the engines' own events, or −1 for a candidate
 * scored on the approximate index.
 */
export interface PrefixPickContext extends PickContext {
  readonly exact?: ExactPick;
}

/** The `prefix-aware` policy, with what its last pick estimated (read right after `pick`, e.g. for tracing). */
export interface PrefixAwarePolicy extends Policy {
  /** The share of the last picked prompt's blocks the chosen endpoint was estimated to hold; 0 without a prompt. */
  readonly matchedShare: number;
}

/** Picks after this many requests drop the index of an endpoint absent from all of them. */
const FORGET_AFTER_PICKS = 4096;

/**
 * The content-balance term is at most this share of the prompt (times `contentBalance`): with
 * the default, a match covering more than half of the prompt still beats an equally loaded
 * endpoint without it, as in SGLang's router (cache threshold 0.5).
 */
const MAX_EXCESS = 0.5;

/**
 * A prompt's lead is its first `LEAD_BLOCKS` blocks (256 characters at the default
 * `blockChars`), or all of a shorter prompt: a prompt whose lead no candidate holds is a new
 * prefix, placed by the lead's rendezvous order. Long enough to get past the text most
 * prompts open with (a chat template's role markers, "You are a helpful assistant."), so that
 * different system prompts are told apart; short enough that a prompt matching less than its
 * lead loses at most 3 blocks of cache by being placed anew.
 */
const LEAD_BLOCKS = 4;

/** Weight of a new sample in the running mean of the prefill blocks a request needs. */
const WORK_SMOOTHING = 1 / 32;

/**
 * Routes a prompt to the endpoint where it is likely to get its first token soonest, counting
 * what the KV cache saves. The prompt is cut into fixed-size character blocks, chain-hashed
 * (a block's hash covers all text before it, as vLLM's block hashes do) and matched against a
 * bounded per-endpoint index of the blocks it was sent. Each candidate costs, in blocks of
 * prefill:
 *
 * - its **uncached blocks**: the prompt's blocks after its longest matching leading run;
 * - its **queue**: `(load − least load) × w`, with `w` the running mean of the uncached blocks
 *   of the requests routed so far (what a queued request typically costs to prefill);
 * - its **content share** above its fair part, at most half the prompt, see `contentBalance`;
 *
 * and the cheapest wins. A prompt whose lead (its first 4 blocks) no candidate holds is a new
 * prefix: it goes to the first endpoint of the lead's rendezvous (highest-random-weight) order
 * whose load is within session-affinity's bound at its defaults (`max(⌈loadFactor × mean⌉,
 * least + loadSlack)`, see {@link SessionAffinitySettings}). That
 * order depends only on the prompt's text and the endpoint keys, so gateway replicas that share
 * the traffic, each learning only from its own share, place a new prefix on the same endpoint
 * and find it there later; a private rule (the emptiest endpoint in this gateway's view) would
 * cache each prefix once per replica. Ties between holders also go by that order.
 *
 * Per pick: one pass hashing the prompt, then per candidate one `Map` lookup and a binary search
 * of its matching run (skipped when the candidate cannot win), and for a new prefix one more
 * `Map` lookup and hash per candidate; no allocation once the hash buffer has grown to the
 * longest prompt and the endpoint keys are known.
 */
export function prefixAware(options: PrefixAwareOptions = {}): PrefixAwarePolicy {
  const { blockChars, maxBlocksPerEndpoint: maxBlocks, maxBlocksPerRequest: maxRequestBlocks, contentBalance, fallback } = parsePrefixAwarePolicy('prefixAware', options);
  // One key for every index of this policy: slots are unpredictable to clients, and the
  // content hashes themselves stay deterministic (replicas may place prefixes by them).
  const slotKey = randomKey32();
  const indexes = new Map<string, BlockIndex>();
  let blockHashes = new Int32Array(256);
  /** Each candidate's index during one pick (looked up once), reused across picks. */
  const candidateIndexes: Array<BlockIndex | undefined> = [];
  /**
   * Rendezvous identities (`endpointHash`) of `hashedCandidates`, by position: the router
   * passes the same endpoints in the same order until the healthy set changes, so they are
   * hashed again only then. Checked once per pick that needs them (`hashesCheckedAt`).
   */
  let positionHashes = new Int32Array(0);
  let hashedCandidates: Endpoint[] = [];
  let hashesCheckedAt = -1;
  /** Each candidate's cost during one pick (Infinity when skipped), reused across picks. */
  let candidateCosts = new Float64Array(0);
  let picks = 0;
  /** Running mean of the uncached blocks of routed requests; negative until the first. */
  let typicalWork = -1;
  /** Sum of every index's `recentBlocks`. */
  let recentTotal = 0;
  let matchedShare = 0;

  function hashBlocks(prompt: string): number {
    const count = Math.min(Math.floor(prompt.length / blockChars), maxRequestBlocks);
    if (count > blockHashes.length) blockHashes = new Int32Array(Math.min(Math.max(count, blockHashes.length * 2), maxRequestBlocks));
    return hashPromptBlocks(prompt, blockChars, count, blockHashes);
  }

  function forgetAbsentEndpoints(): void {
    for (const [key, index] of indexes) {
      if (picks - index.lastCandidatePick > FORGET_AFTER_PICKS) {
        recentTotal -= index.recentBlocks;
        indexes.delete(key);
      }
    }
  }

  /** The rendezvous weight of `candidates[at]` for `lead`. */
  function weightAt(candidates: readonly Endpoint[], at: number, lead: number): number {
    if (hashesCheckedAt !== picks) {
      hashesCheckedAt = picks;
      if (!sameAsHashed(candidates)) {
        positionHashes = new Int32Array(candidates.length);
        for (let i = 0; i < candidates.length; i++) positionHashes[i] = endpointHash(candidates[i].key);
        hashedCandidates = candidates.slice();
      }
    }
    return rendezvousWeight(lead, positionHashes[at]);
  }

  function sameAsHashed(candidates: readonly Endpoint[]): boolean {
    if (hashedCandidates.length !== candidates.length) return false;
    for (let i = 0; i < candidates.length; i++) if (hashedCandidates[i] !== candidates[i]) return false;
    return true;
  }

  /**
   * The cheapest candidate's position. A candidate `exact` scores costs its share of the
   * prompt its rank lacks by the engine's events instead of the approximate index's guess, and
   * no content-balance term: that term counts this replica's own traffic, which other replicas
   * do not see, while the events are the same for all of them.
   */
  function choose(candidates: readonly Endpoint[], blockCount: number, exact: ExactPick | undefined): number {
    let minLoad = Infinity;
    let totalLoad = 0;
    let candidateRecent = 0;
    candidateIndexes.length = candidates.length;
    for (let at = 0; at < candidates.length; at++) {
      const candidate = candidates[at];
      if (candidate.load < minLoad) minLoad = candidate.load;
      totalLoad += candidate.load;
      const index = indexes.get(candidate.key);
      candidateIndexes[at] = index;
      if (index !== undefined) {
        index.lastCandidatePick = picks;
        candidateRecent += index.recentBlocks;
      }
    }
    const work = typicalWork < 0 ? blockCount : typicalWork;
    const fairRecent = candidateRecent / candidates.length;
    const lead = blockHashes[Math.min(blockCount, LEAD_BLOCKS) - 1];

    if (candidateCosts.length < candidates.length) candidateCosts = new Float64Array(candidates.length);
    let bestAt = 0;
    let bestCost = Infinity;
    let ties = 0;
    let anyMatch = false;
    const exactLead = exact === undefined ? 0 : Math.min(LEAD_BLOCKS, exact.promptBlocks);
    for (let at = 0; at < candidates.length; at++) {
      const candidate = candidates[at];
      const index = candidateIndexes[at];
      let cost = work * (candidate.load - minLoad);
      const held = exact === undefined ? -1 : exact.matched[at];
      if (held >= 0) {
        if (held >= exactLead) anyMatch = true;
        cost += exactUncached(blockCount, held, exact!.promptBlocks);
      } else {
        const recent = index === undefined ? 0 : index.recentBlocks;
        if (recent > fairRecent) cost += contentBalance * blockCount * Math.min(MAX_EXCESS, recent / fairRecent - 1);
        const holds = index !== undefined && index.has(lead);
        if (holds) anyMatch = true;
        // Uncached blocks are the whole prompt without the lead, at least none with it: skip the
        // search when even none cannot win (or tie).
        if (cost + blockCount - (holds ? blockCount : 0) > bestCost) {
          candidateCosts[at] = Infinity;
          continue;
        }
        if (holds) cost += blockCount - (index as BlockIndex).leadingRun(blockHashes, blockCount, 0);
        else cost += blockCount;
      }
      candidateCosts[at] = cost;
      if (cost < bestCost) {
        bestAt = at;
        bestCost = cost;
        ties = 0;
      } else if (cost === bestCost) {
        ties++;
      }
    }
    if (!anyMatch) {
      bestAt = place(candidates, lead, minLoad, totalLoad);
    } else if (ties > 0) {
      // The lead's rendezvous order decides between the cheapest, as in every replica.
      let bestWeight = -1;
      for (let at = 0; at < candidates.length; at++) {
        if (candidateCosts[at] !== bestCost) continue;
        const weight = weightAt(candidates, at, lead);
        if (weight > bestWeight) {
          bestWeight = weight;
          bestAt = at;
        }
      }
    }
    // Let go of the indexes until the next pick.
    candidateIndexes.fill(undefined);
    return bestAt;
  }

  /**
   * A new prefix: the first candidate of its lead's rendezvous order whose load is within
   * session-affinity's bound at its default `loadFactor` and `loadSlack`. The order depends on
   * the prompt and the endpoint keys only, so every replica places the prefix alike.
   */
  function place(candidates: readonly Endpoint[], lead: number, minLoad: number, totalLoad: number): number {
    const loadCap = Math.max(Math.ceil((DEFAULT_LOAD_FACTOR * totalLoad) / candidates.length), minLoad + DEFAULT_LOAD_SLACK);
    let chosen = 0;
    let chosenWeight = -1;
    for (let at = 0; at < candidates.length; at++) {
      // The least loaded candidate is always within the bound (unless a load is NaN).
      if (candidates[at].load > loadCap) continue;
      const weight = weightAt(candidates, at, lead);
      if (weight > chosenWeight) {
        chosen = at;
        chosenWeight = weight;
      }
    }
    return chosen;
  }

  return {
    name: 'prefix-aware',
    usesPrompt: true,
    namesIndex: true,
    reportsMatchedShare: true,
    get matchedShare() {
      return matchedShare;
    },
    pick(candidates: readonly Endpoint[], ctx: PickContext): Endpoint {
      const prompt = ctx.prompt;
      const blockCount = prompt === undefined ? 0 : hashBlocks(prompt);
      matchedShare = 0;
      if (blockCount === 0) return fallback.pick(candidates, ctx);
      if (++picks % FORGET_AFTER_PICKS === 0) forgetAbsentEndpoints();
      const exact = (ctx as PrefixPickContext).exact;
      const chosenAt = choose(candidates, blockCount, exact);
      const chosen = candidates[chosenAt];

      let index = indexes.get(chosen.key);
      if (index === undefined) {
        index = new BlockIndex(maxBlocks, slotKey);
        index.lastCandidatePick = picks;
        indexes.set(chosen.key, index);
      }
      // The approximate index learns from every pick, so that it is warm when a rank falls back to it.
      const uncached = exact?.chose(chosenAt) === 'exact'
        ? exactUncached(blockCount, exact.matched[chosenAt], exact.promptBlocks)
        : blockCount - index.leadingRun(blockHashes, blockCount, 0);
      typicalWork = typicalWork < 0 ? uncached : typicalWork + (uncached - typicalWork) * WORK_SMOOTHING;
      matchedShare = 1 - uncached / blockCount;
      const added = index.record(blockHashes, blockCount);
      index.recentBlocks += added;
      recentTotal += added;
      // "Recent" is about the last one to two caches' worth of new blocks per endpoint.
      if (recentTotal > maxBlocks * indexes.size) {
        recentTotal = 0;
        for (const held of indexes.values()) {
          held.recentBlocks /= 2;
          recentTotal += held.recentBlocks;
        }
      }
      return chosen;
    },
  };
}

/** The prompt's blocks (of `blockChars`) a rank holding `held` of the engine's `promptBlocks` lacks. */
function exactUncached(blockCount: number, held: number, promptBlocks: number): number {
  return (blockCount * (promptBlocks - held)) / promptBlocks;
}

/**
 * Writes the chained content hashes of the prompt's first `count` blocks into `out`: block
 * `i`'s hash covers all text before its end, as vLLM's block hashes do. Deterministic, the same
 * in every process. Returns `count`.
 */
export function hashPromptBlocks(prompt: string, blockChars: number, count: number, out: Int32Array): number {
  let hash = 0;
  for (let i = 0; i < count; i++) {
    hash = hashString(prompt, hash, i * blockChars, (i + 1) * blockChars);
    out[i] = hash;
  }
  return count;
}

/**
 * The block hashes one endpoint was sent, approximately least-recently-used: two
 * generations of at most `maxBlocks` hashes each; when the current one fills, the older is
 * dropped whole. So the `maxBlocks` most recently used hashes are always held (the rank's
 * cache, sized alike, forgets nothing the index still needs), and at most `2 × maxBlocks`.
 * Each generation is an open-addressing hash set in an `Int32Array` at most half full, so a
 * touch is a probe or two with no allocation, and the memory is fixed:
 * `16 × nextPowerOfTwo(maxBlocks)` bytes (512 KiB for the default `maxBlocksPerEndpoint`).
 */
export class BlockIndex {
  lastCandidatePick = 0;
  /** New blocks recorded lately (halved as the policy's total passes its bound). */
  recentBlocks = 0;
  private current: HashSet32;
  private previous: HashSet32;
  private readonly generationSize: number;
  private readonly slotKey: number;
  /** Both tables have the same size and key, so a hash's home slot is computed once for both. */
  private readonly mask: number;

  /** `slotKey` keys the tables' slot hash; a random one (the default) keeps clients from forging collisions. */
  constructor(maxBlocks: number, slotKey = randomKey32()) {
    this.generationSize = maxBlocks;
    this.slotKey = slotKey;
    this.current = new HashSet32(this.generationSize);
    this.previous = new HashSet32(this.generationSize);
    this.mask = this.current.mask;
  }

  /** Slot probes past the first, over the index's life: the work hash collisions cost. */
  get extraProbes(): number {
    return this.current.extraProbes + this.previous.extraProbes;
  }

  /** How many block hashes are held (never more than `2 × maxBlocks`). */
  get size(): number {
    return this.current.size + this.previous.size;
  }

  /** Bytes held by the index's tables. */
  get bytes(): number {
    return this.current.bytes + this.previous.bytes;
  }

  has(hash: number): boolean {
    const key = hash === 0 ? 1 : hash;
    const home = keyedMix32(key, this.slotKey) & this.mask;
    return this.current.has(key, home) || this.previous.has(key, home);
  }

  /**
   * The number of leading blocks held. Blocks are recorded last-to-first, so a block is
   * never older than the blocks before it in its chain: the held blocks of a chain form a
   * prefix, and a binary search finds its end. Returns 0 early when it cannot reach `toBeat`.
   */
  leadingRun(hashes: Int32Array, count: number, toBeat: number): number {
    if (!this.has(hashes[0])) return 0;
    let low = 1;
    if (toBeat > 1) {
      if (!this.has(hashes[toBeat - 1])) return 0;
      low = toBeat;
    }
    let high = count;
    while (low < high) {
      const middle = (low + high + 1) >>> 1;
      if (this.has(hashes[middle - 1])) low = middle;
      else high = middle - 1;
    }
    return low;
  }

  /**
   * Marks the blocks as just used, last to first so that a prompt's head outlives its tail.
   * Returns how many were not held before.
   */
  record(hashes: Int32Array, count: number): number {
    let added = 0;
    for (let i = count - 1; i >= 0; i--) {
      const hash = hashes[i];
      const key = hash === 0 ? 1 : hash;
      const home = keyedMix32(key, this.slotKey) & this.mask;
      if (!this.current.add(key, home)) continue;
      // Only for a hash new to the current generation (adding to one leaves the other as it was).
      if (!this.previous.has(key, home)) added++;
      if (this.current.size >= this.generationSize) {
        const dropped = this.previous;
        this.previous = this.current;
        dropped.clear();
        this.current = dropped;
      }
    }
    return added;
  }
}

/**
 * Slots a lookup or insertion probes at most. At the tables' load of at most one half, the
 * longest run of occupied slots in a table of 2^16 slots is about 50 with a random slot hash,
 * so the bound almost never turns a hash away, and it caps the work of any one operation
 * whatever the hashes are.
 */
export const MAX_PROBES = 64;

/**
 * A fixed-capacity set of 32-bit keys (a hash, 0 written as 1) with linear probing from a home
 * slot its owner computes with a keyed slot hash; 0 marks an empty slot. A hash is never stored more than `MAX_PROBES − 1` slots past its home slot
 * (an insertion that would go further is dropped: the index forgets that block), so a lookup
 * that has probed `MAX_PROBES` slots knows the hash is absent.
 */
class HashSet32 {
  size = 0;
  /** Probes past the first slot, ever (not reset by `clear`). */
  extraProbes = 0;
  private readonly slots: Int32Array;
  readonly mask: number;

  constructor(maxEntries: number) {
    let capacity = 2;
    while (capacity < maxEntries * 2) capacity *= 2;
    this.slots = new Int32Array(capacity);
    this.mask = capacity - 1;
  }

  get bytes(): number {
    return this.slots.byteLength;
  }

  has(key: number, home: number): boolean {
    const slot = this.slotOf(key, home);
    return slot >= 0 && this.slots[slot] === key;
  }

  /**
   * Adds the hash; returns whether it was added (false when held, or when its probe run is
   * full). The owner keeps `size` at most half the slots.
   */
  add(key: number, home: number): boolean {
    const slot = this.slotOf(key, home);
    if (slot < 0 || this.slots[slot] === key) return false;
    this.slots[slot] = key;
    this.size++;
    return true;
  }

  /**
   * Linear probing: the slot holding `key`, or the empty slot where it would go; -1 when
   * `MAX_PROBES` slots hold neither.
   */
  private slotOf(key: number, home: number): number {
    const slots = this.slots;
    let slot = home;
    let probed = 1;
    while (slots[slot] !== key && slots[slot] !== 0) {
      if (probed === MAX_PROBES) return -1;
      probed++;
      this.extraProbes++;
      slot = (slot + 1) & this.mask;
    }
    return slot;
  }

  clear(): void {
    this.slots.fill(0);
    this.size = 0;
  }
}
