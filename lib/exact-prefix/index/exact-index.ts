/**
 * The exact prefix index of one upstream: which blocks each of its ranks holds in its GPU
 * prefix cache, as the engine reported them in KV events.
 *
 * Keys are the router's own: each block's key is a keyed hash of its parent's key and its
 * token ids (as llm-d computes them), so the engine's hash algorithm and seed
 * (`--prefix-caching-hash-algo`, PYTHONHASHSEED) need not be known or matched; a map from the
 * engine's hash to the router's key per rank resolves parents and removals.
 *
 * What counts: a block in the GPU cache (`medium` GPU or unset) of the KV-cache group each rank
 * follows. Blocks in another medium (CPU offload, disk) are kept apart, per tier (tier-index.ts):
 * a hit there still costs a transfer back and their removals name that medium only, so mixing
 * them in would let a CPU eviction hide a GPU block or the reverse; `match` scores them past
 * the GPU run at their tier's weight. Blocks whose engine hash took extra
 * keys (multimodal inputs, prompt embeddings) cannot be matched from token ids alone, so neither
 * they nor their descendants are indexed. LoRA blocks are indexed under their adapter's name
 * (the name vLLM puts first in their extra keys, #33304), a salted prompt's under its
 * `cache_salt` (which vLLM adds to its first block's keys, kv_cache_utils.py:524-532 at 52a31cc):
 * a salted request matches the blocks of its own salt only, as it does in the engine.
 *
 * Of a hybrid model's KV-cache groups, each rank follows one (kv-group.ts): its store and
 * removal events count, the other groups' are left out.
 */
import { onGpu, type EngineBlockHash, type KvBlockStored, type KvEvent } from '../events/decode';
import { DOMAIN_BLOCK, keysFor, nextKey, type BlockKeys } from './block-keys';
import { chainHash, engineHashKey, processHashKey, type HashKey } from './keyed-hash';
import { betterGroup, groupClass, NO_GROUP } from './kv-group';
import { SpeculativeEntries } from './speculative-entries';
import { LowerTiers } from './tier-index';
import type { BlockObserver, KvEventSink, KvExactIndexOptions, KvMatchOptions, KvPrefixMatch } from './exact-index-types';

export type { BlockKeys } from './block-keys';
export type { BlockObserver, KvEventSink, KvExactIndexOptions, KvMatchOptions, KvPrefixMatch } from './exact-index-types';

class Entry {
  // Set by a match or a store again; eviction gives a used entry a second chance (CLOCK, an
  // approximation of LRU), so a use costs one field write rather than a Map re-insertion.
  used = false;
  /** The keyed hash of the engine's block hash (see engineHashKey). */
  constructor(public engineKey: number) {}
}

interface RankState {
  /** Router key → entry, in insertion order: the order the CLOCK hand sweeps. */
  blocks: Map<number, Entry>;
  /** Keyed engine hash → router key. Never the engine's own values: those are the publisher's to choose. */
  byEngine: Map<number, number>;
  /** Router keys of blocks a routed request will store, until its events confirm them or they expire. */
  speculative: SpeculativeEntries;
  /** Where eviction resumes: one sweep over the blocks, not a restart at the head per evicted block. */
  hand: Iterator<[number, Entry]> | null;
  /** This rank's block size, learned from its first store in the group it follows (0 before). */
  blockSize: number;
  /** The KV-cache group followed (vLLM's `group_idx`, 0 when unset), NO_GROUP before any store. */
  group: number;
  /** Its {@link groupClass}. */
  groupClass: number;
}

/**
 * Heap bytes per indexed block (router-key entry, keyed-engine-hash entry, entry object),
 * rounded up: 147 measured with 64-byte, 32-byte and integer engine hashes alike (the engine's
 * hash is kept only as its keyed 53-bit number; `npx tsx bench/kv-events.ts`, Memory). With the
 * hashes themselves kept, 64-byte ones cost 193. A million blocks take about 140 MiB.
 */
export const KV_INDEX_BYTES_PER_BLOCK = 170;

const DOMAIN_ROOT = 1;
const DOMAIN_LORA = 2;
const DOMAIN_SALT = 4;

/** The exact index; pure and synchronous. */
export class KvExactIndex implements KvEventSink {
  readonly ranks: readonly number[];
  private readonly states: RankState[];
  private readonly position = new Map<number, number>();
  private readonly perRankMax: number;
  private readonly key: HashKey;
  private size = 0;
  private speculativeCount = 0;
  private readonly loraRoots = new Map<string, number>();
  private readonly baseRoot: number;
  private readonly maxSpeculative: number;
  private readonly adapters = new Set<string>();
  /**
   * The block size most ranks reported (each rank learns its own from its first GPU group-0
   * store, so one rank's odd event cannot turn the others off); 0 before any.
   */
  blockSize = 0;
  /** Told what the events store (route receipts, lib/receipts). */
  observer: BlockObserver | undefined = undefined;
  /** Blocks offloaded to other media (tier-index.ts). */
  readonly tiers: LowerTiers;

  constructor(options: KvExactIndexOptions) {
    this.ranks = [...options.ranks];
    this.states = this.ranks.map(() => ({ blocks: new Map(), byEngine: new Map(), speculative: new SpeculativeEntries(), hand: null, blockSize: 0, group: NO_GROUP, groupClass: 0 }));
    this.maxSpeculative = Math.max(1, options.maxSpeculativeBlocks ?? 65_536);
    this.ranks.forEach((rank, at) => this.position.set(rank, at));
    this.perRankMax = Math.max(1, Math.floor((options.maxBlocks ?? 1_048_576) / Math.max(1, this.ranks.length)));
    this.key = options.hashKey ?? processHashKey();
    this.baseRoot = chainHash(this.key, DOMAIN_ROOT, 0, [], 0, 0);
    this.tiers = new LowerTiers(this.ranks.length, options.tierWeights ?? {}, this.perRankMax * 4);
  }

  /** Where `rank`'s count is in a match's `matchedBlocks`, or −1 for a rank not tracked. */
  positionOf(rank: number): number {
    return this.position.get(rank) ?? -1;
  }

  /** Blocks held for `rank` (0 for a rank not tracked). */
  blockCount(rank: number): number {
    const at = this.position.get(rank);
    return at === undefined ? 0 : this.states[at].blocks.size;
  }

  /** Whether `rank`'s events stored the block with router key `key` (speculative entries aside). */
  heldBy(rank: number, key: number): boolean {
    const at = this.position.get(rank);
    return at !== undefined && this.states[at].blocks.has(key);
  }

  /** Blocks held over all ranks. */
  get totalBlocks(): number {
    return this.size;
  }

  applyEvent(rank: number, event: KvEvent): boolean {
    const at = this.position.get(rank);
    if (at === undefined) return false;
    const state = this.states[at];
    switch (event.type) {
      case 'cleared':
        this.clearState(state);
        return true;
      case 'removed':
        // Another group's removal may name the same hash as a block of this one (vLLM keys
        // every group's blocks by the same request hashes).
        if ((event.groupIdx ?? 0) !== state.group) return true;
        if (!onGpu(event.medium)) this.tiers.removed(at, event, this.key);
        else for (const hash of event.blockHashes) this.remove(state, engineHashKey(this.key, hash));
        return true;
      case 'stored': {
        // Other media and groups are not routed on, and their block size (an offload tier's, a
        // sliding-window group's) says nothing about the followed group's.
        if (!onGpu(event.medium)) {
          // Offloaded copies of the followed group's GPU blocks (tier-index.ts); no group switch on them.
          if ((event.groupIdx ?? 0) === state.group) this.tiers.stored(at, event, this.key, (engineKey) => state.byEngine.get(engineKey));
          return true;
        }
        if (!this.follows(state, event)) return true;
        if (event.blockHashes.length === 0) return true;
        // Masked blocks (a sliding-window group's): which ids each hash covers is not said.
        if (event.tokenIds.length !== event.blockHashes.length * event.blockSize) return true;
        if (event.blockSize !== state.blockSize) {
          // A rank holding nothing may (re)learn: its engine restarted with another size.
          if (state.blockSize !== 0 && state.blocks.size > 0) return false;
          state.blockSize = event.blockSize;
          this.blockSize = this.commonBlockSize();
        }
        // A LoRA id without a name (older vLLM) cannot be matched to a request's adapter.
        if (event.loraId !== null && event.loraName === null) return true;
        let chain: number | undefined;
        if (event.parentBlockHash === null) chain = this.rootOf(event.loraName ?? undefined, event.cacheSalt ?? undefined);
        else chain = this.parentKey(state, event.parentBlockHash);
        // An unknown parent (stored before this index listened, or evicted here): the chain
        // cannot be keyed, and a request could not reach these blocks through it anyway.
        if (chain === undefined) {
          this.observer?.orphaned(rank);
          return true;
        }
        if (event.loraName !== null && !this.adapters.has(event.loraName)) {
          if (this.adapters.size >= 1024) this.adapters.clear();
          this.adapters.add(event.loraName);
        }
        const size = event.blockSize;
        const observer = this.observer;
        for (let i = 0; i < event.blockHashes.length; i++) {
          if (event.extraKeyed !== null && event.extraKeyed[i]) break;
          chain = chainHash(this.key, DOMAIN_BLOCK, chain, event.tokenIds, i * size, size);
          this.insert(state, chain, engineHashKey(this.key, event.blockHashes[i]));
          if (observer !== undefined) observer.stored(rank, chain);
        }
        return true;
      }
    }
  }

  /** Whether some stored event named `name` as its LoRA adapter (requests naming it are scored under it). */
  isAdapter(name: string): boolean {
    return this.adapters.has(name);
  }

  clearRank(rank: number): void {
    const at = this.position.get(rank);
    if (at === undefined) return;
    const state = this.states[at];
    this.clearState(state);
    this.tiers.clear(at);
    // A restarted engine may serve another model: its groups are learned again.
    state.group = NO_GROUP;
  }

  /**
   * How many leading full blocks of `tokens` each rank holds, counting unexpired speculative
   * entries. Keys are computed only as far as some rank still matches, so a miss costs one hash.
   */
  match(tokens: ArrayLike<number>, options?: KvMatchOptions): KvPrefixMatch {
    const matchedBlocks = new Int32Array(this.ranks.length);
    const size = this.blockSize;
    const promptBlocks = size === 0 ? 0 : Math.floor(tokens.length / size);
    if (promptBlocks === 0 || (this.size === 0 && this.speculativeCount === 0)) return { blockSize: size, promptBlocks, matchedBlocks };
    const now = options?.now ?? Date.now();
    const root = this.rootOf(options?.loraName, options?.salt);
    const keys = options?.keys === undefined ? { size, loraName: options?.loraName, salt: options?.salt, values: [] } : keysFor(options.keys, size, options.loraName, options.salt);
    const values = keys.values;
    const states = this.states;
    // Rank by rank, each as far as it holds the prompt: the same lookups as block by block, in
    // a loop over one rank's maps. A block's key is hashed when the first rank reaches it, so
    // keys go as far as the longest match and one further, as before.
    for (let r = 0; r < states.length; r++) {
      const state = states[r];
      if (state.blockSize !== size && state.blockSize !== 0) continue;
      let b = 0;
      for (; b < promptBlocks; b++) {
        const key = nextKey(this.key, keys, b === 0 ? root : values[b - 1], tokens, b, size);
        const entry = state.blocks.get(key);
        if (entry !== undefined) entry.used = true;
        else if (!this.speculativeHeld(state, key, now)) break;
      }
      matchedBlocks[r] = b;
    }
    let weightedBlocks: Float64Array | undefined;
    let reachedBlocks: Int32Array | undefined;
    for (let r = 0; r < states.length; r++) {
      if (!this.tiers.holds(r) || matchedBlocks[r] >= promptBlocks) continue;
      weightedBlocks ??= Float64Array.from(matchedBlocks);
      reachedBlocks ??= Int32Array.from(matchedBlocks);
      const from = matchedBlocks[r];
      weightedBlocks[r] += this.tiers.extra(r, from, promptBlocks, (b) => nextKey(this.key, keys, b === 0 ? root : values[b - 1], tokens, b, size));
      reachedBlocks[r] = this.tiers.reached;
    }
    return { blockSize: size, promptBlocks, matchedBlocks, weightedBlocks, reachedBlocks };
  }

  /**
   * Counts `tokens`' full blocks as held by `rank` until `expiresAt` (ms, the clock `match`
   * is given) or until a stored event confirms them: a request routed there will have them
   * cached before its events arrive, and requests sharing its prefix that come meanwhile
   * should follow it rather than scatter. Needs the block size, so does nothing before the
   * first stored event.
   */
  speculate(rank: number, tokens: ArrayLike<number>, expiresAt: number, options?: { loraName?: string; salt?: string; keys?: BlockKeys }): void {
    const at = this.position.get(rank);
    if (at === undefined) return;
    const state = this.states[at];
    const size = state.blockSize === 0 ? this.blockSize : state.blockSize;
    if (size === 0) return;
    const promptBlocks = Math.floor(tokens.length / size);
    let chain = this.rootOf(options?.loraName, options?.salt);
    const keys = options?.keys === undefined ? undefined : keysFor(options.keys, size, options.loraName, options.salt);
    for (let b = 0; b < promptBlocks; b++) {
      chain = nextKey(this.key, keys, chain, tokens, b, size);
      if (state.blocks.has(chain)) continue;
      if (state.speculative.hold(chain, expiresAt)) this.speculativeCount++;
    }
    while (state.speculative.size > this.maxSpeculative && state.speculative.dropOldest()) this.speculativeCount--;
  }

  /** Speculative entries held over all ranks (expired ones included until a match meets one on their rank). */
  get speculativeBlocks(): number {
    return this.speculativeCount;
  }


  private speculativeHeld(state: RankState, key: number, now: number): boolean {
    const expiresAt = state.speculative.expiryOf(key);
    if (expiresAt === undefined) return false;
    if (expiresAt > now) return true;
    // Entries are held in expiry order: drop every expired one, this one among them.
    this.speculativeCount -= state.speculative.dropExpired(now);
    return false;
  }

  /** Whether the rank follows the group of this store, after switching to it if it is a better one (forgetting the other's blocks). */
  private follows(state: RankState, event: KvBlockStored): boolean {
    const group = event.groupIdx ?? 0;
    if (group === state.group) return true;
    const kind = groupClass(event.kvCacheSpecKind);
    if (!betterGroup(state, group, kind)) return false;
    if (state.group !== NO_GROUP) this.clearState(state);
    state.group = group;
    state.groupClass = kind;
    return true;
  }

  /** The chain a prompt's first block hangs from: the model's, its adapter's, salted with its `cache_salt`. */
  private rootOf(loraName: string | undefined, salt: string | undefined): number {
    const root = loraName === undefined ? this.baseRoot : this.loraRoot(loraName);
    if (salt === undefined) return root;
    // Not kept: salts are the clients' to choose, and hashing one costs a round per character.
    const units = Array.from(salt, (char) => char.codePointAt(0) as number);
    return chainHash(this.key, DOMAIN_SALT, root, units, 0, units.length);
  }

  private loraRoot(name: string): number {
    let root = this.loraRoots.get(name);
    if (root === undefined) {
      const units = Array.from(name, (char) => char.codePointAt(0) as number);
      root = chainHash(this.key, DOMAIN_LORA, 0, units, 0, units.length);
      // Adapter names come from the engine's configuration: few, but bounded all the same.
      if (this.loraRoots.size >= 1024) this.loraRoots.clear();
      this.loraRoots.set(name, root);
    }
    return root;
  }

  /** The router key of a parent the engine names, when the entry there is really that block. */
  private parentKey(state: RankState, parent: EngineBlockHash): number | undefined {
    const engineKey = engineHashKey(this.key, parent);
    const key = state.byEngine.get(engineKey);
    return key !== undefined && state.blocks.get(key)?.engineKey === engineKey ? key : undefined;
  }

  /** The block size most ranks learned (the smallest on a tie), 0 before any. */
  private commonBlockSize(): number {
    const votes = new Map<number, number>();
    for (const state of this.states) if (state.blockSize !== 0) votes.set(state.blockSize, (votes.get(state.blockSize) ?? 0) + 1);
    let best = 0;
    let most = 0;
    for (const [size, count] of votes) if (count > most || (count === most && size < best)) [best, most] = [size, count];
    return best;
  }

  private insert(state: RankState, key: number, engineKey: number): void {
    const known = state.byEngine.get(engineKey);
    if (known !== undefined && known !== key) this.remove(state, engineKey);
    const entry = state.blocks.get(key);
    if (entry !== undefined) {
      if (entry.engineKey !== engineKey) {
        state.byEngine.delete(entry.engineKey);
        entry.engineKey = engineKey;
        state.byEngine.set(engineKey, key);
      }
      // A store again is a use.
      entry.used = true;
      return;
    }
    state.blocks.set(key, new Entry(engineKey));
    state.byEngine.set(engineKey, key);
    // The event confirms what was speculated.
    if (state.speculative.delete(key)) this.speculativeCount--;
    this.size++;
    if (state.blocks.size > this.perRankMax) this.evict(state);
  }

  /**
   * CLOCK: the hand sweeps the blocks in insertion order from where it stopped, clearing used
   * bits and evicting the first unused block. Map iterators follow deletions and insertions,
   * so each block is passed at most twice per sweep: O(1) amortized per evicted block.
   */
  private evict(state: RankState): void {
    while (state.blocks.size > this.perRankMax) {
      state.hand ??= state.blocks.entries();
      const next = state.hand.next();
      if (next.done === true) {
        state.hand = null;
        continue;
      }
      const [key, entry] = next.value;
      if (entry.used) {
        entry.used = false;
        continue;
      }
      state.blocks.delete(key);
      state.byEngine.delete(entry.engineKey);
      this.size--;
    }
  }

  private remove(state: RankState, engineKey: number): void {
    const key = state.byEngine.get(engineKey);
    if (key === undefined) return;
    state.byEngine.delete(engineKey);
    const entry = state.blocks.get(key);
    if (entry !== undefined && entry.engineKey === engineKey) {
      state.blocks.delete(key);
      this.size--;
    }
  }

  private clearState(state: RankState): void {
    this.size -= state.blocks.size;
    this.speculativeCount -= state.speculative.size;
    state.blocks.clear();
    state.byEngine.clear();
    state.speculative.clear();
    state.hand = null;
  }
}
