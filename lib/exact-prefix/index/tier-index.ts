/**
 * The lower tiers of one upstream's ranks: the blocks a KV connector offloaded to another medium
 * (vLLM's offloading connector: `CPU`; newer vLLM also `STORAGE`), as its events report them. A
 * prompt's blocks past its GPU hit that a lower tier holds load faster than they recompute:
 * the exact index scores them at `prefixAware.tierWeights` (exact-index.ts `match`).
 *
 * What the connector publishes (docs/slo-routing.md, "KV-cache tiers"):
 * - vLLM 52a31cc (offloading/scheduler.py:946-965 `take_events`): one `BlockStored` per
 *   offloaded chunk with `block_hashes=[get_offload_block_hash(key)]`, `parent_block_hash=None`,
 *   `token_ids=[]`, `block_size=0`, `medium` the tier (`"CPU"`, cpu/common.py:12); the hash is the
 *   GPU hash of the chunk's last block (scheduler.py:196-206 `update_offload_keys`: every
 *   `hash_block_size_factor`-th block hash) as raw bytes, while GPU events carry it as a 64-bit
 *   integer by default (kv_cache_utils.py:77-80 `maybe_convert_block_hash`, envs.py
 *   `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`=1): both forms are tried.
 * - newer vLLM (offloading/events.py:317-335 `_placeholder_stored`, :337-380): the same
 *   placeholder, hash converted as the GPU's; or, with self-describing events, the chunk's own
 *   GPU block hashes with parent, tokens and block size. Removals name the same hashes
 *   (events.py:382-413; 52a31cc scheduler.py:955).
 * So a tier block is keyed by the router key of the GPU block with the same engine hash (the
 * block was on the GPU when it was offloaded); a hash the GPU index never saw cannot be placed
 * in a prompt and is dropped, as an orphan is.
 */
import type { EngineBlockHash, KvBlockRemoved, KvBlockStored } from '../events/decode';
import { engineHashKey, type HashKey } from './keyed-hash';

/** The tiers the `dp_router_kv_blocks` gauge names (vLLM's `Medium`, kv_offload/base.py:46-52 newer; `MEDIUM_GPU`); any other medium is `OTHER`. */
export const MEDIA = ['GPU', 'CPU', 'STORAGE'] as const;
export type MediumLabel = (typeof MEDIA)[number] | 'OTHER';

/** A medium as labels and weights name it: upper-cased (Mooncake's store writes `cpu`), unknown ones `OTHER`. */
export function mediumLabel(medium: string | null): MediumLabel {
  const upper = medium === null ? 'GPU' : medium.toUpperCase();
  return (MEDIA as readonly string[]).includes(upper) ? (upper as MediumLabel) : 'OTHER';
}

/** Blocks a chunk may span past the last tier hit before the walk stops: a chunk's blocks before its published key count. */
const CHUNK_REACH = 16;

/** One tier of one rank. */
class Tier {
  /** Router keys held. */
  readonly keys = new Set<number>();
  /** Keyed engine hash → router key, for removals. */
  readonly byEngine = new Map<number, number>();

  constructor(readonly weight: number) {}

  add(key: number, engineKey: number, max: number): void {
    this.byEngine.set(engineKey, key);
    this.keys.add(key);
    // The connector's removals keep it at its size; a missed removal must not grow this forever.
    if (this.keys.size > max) {
      const [oldest] = this.byEngine;
      this.byEngine.delete(oldest[0]);
      this.keys.delete(oldest[1]);
    }
  }

  remove(engineKey: number): void {
    const key = this.byEngine.get(engineKey);
    if (key === undefined) return;
    this.byEngine.delete(engineKey);
    this.keys.delete(key);
  }
}

/** Every lower tier of each rank (by the index's rank position). */
export class LowerTiers {
  private readonly ranks: Array<Map<MediumLabel, Tier>>;
  /** Set by {@link extra}: the leading blocks its best tier reaches, unweighted (the GPU run's end when none). */
  reached = 0;

  constructor(
    rankCount: number,
    private readonly weights: Readonly<Record<string, number>>,
    private readonly maxPerTier: number,
  ) {
    this.ranks = Array.from({ length: rankCount }, () => new Map());
  }

  /** Blocks held per medium at rank position `at`. */
  counts(at: number): Array<[MediumLabel, number]> {
    return [...this.ranks[at]].map(([medium, tier]) => [medium, tier.keys.size]);
  }

  /** Whether rank position `at` holds anything in a lower tier worth scoring. */
  holds(at: number): boolean {
    for (const tier of this.ranks[at].values()) if (tier.keys.size > 0 && tier.weight > 0) return true;
    return false;
  }

  /** A lower tier's store at `at`; `gpuKey` resolves a keyed engine hash to the router key of the GPU block with it. */
  stored(at: number, event: KvBlockStored, hashKey: HashKey, gpuKey: (engineKey: number) => number | undefined): void {
    const tier = this.tierOf(at, event.medium);
    for (const hash of event.blockHashes) {
      for (const form of forms(hash)) {
        const engineKey = engineHashKey(hashKey, form);
        const key = gpuKey(engineKey) ?? tier.byEngine.get(engineKey);
        if (key === undefined) continue;
        tier.add(key, engineHashKey(hashKey, hash), this.maxPerTier);
        break;
      }
    }
  }

  removed(at: number, event: KvBlockRemoved, hashKey: HashKey): void {
    const tier = this.ranks[at].get(mediumLabel(event.medium));
    if (tier === undefined) return;
    for (const hash of event.blockHashes) tier.remove(engineHashKey(hashKey, hash));
  }

  clear(at: number): void {
    this.ranks[at].clear();
  }

  /**
   * The weighted blocks of a prompt past its GPU run `from` that rank position `at` holds in a
   * lower tier: for each tier, the blocks up to its furthest key reached without a gap longer
   * than a chunk, times its weight; the best tier counts. `keyAt(b)` is block b's router key.
   */
  extra(at: number, from: number, promptBlocks: number, keyAt: (b: number) => number): number {
    let best = 0;
    this.reached = from;
    for (const tier of this.ranks[at].values()) {
      if (tier.weight <= 0 || tier.keys.size === 0) continue;
      let reached = from;
      for (let b = from; b < promptBlocks && b < reached + CHUNK_REACH; b++) if (tier.keys.has(keyAt(b))) reached = b + 1;
      const worth = (reached - from) * tier.weight;
      if (worth > best) {
        best = worth;
        this.reached = reached;
      }
    }
    return best;
  }

  private tierOf(at: number, medium: string | null): Tier {
    const label = mediumLabel(medium);
    let tier = this.ranks[at].get(label);
    if (tier === undefined) this.ranks[at].set(label, (tier = new Tier(this.weights[label] ?? 0)));
    return tier;
  }
}

/**
 * The forms an engine hash may take in the GPU's events: as given, and for raw bytes also the
 * 64-bit integer vLLM turns them into for events (kv_cache_utils.py:77-80: big-endian, low 64
 * bits), as the decoder represents it (a number when safe, else a bigint).
 */
function forms(hash: EngineBlockHash): EngineBlockHash[] {
  if (typeof hash !== 'string') return [hash];
  let value = 0n;
  for (let i = Math.max(0, hash.length - 8); i < hash.length; i++) value = (value << 8n) | BigInt(hash.charCodeAt(i) & 0xff);
  return [hash, value <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(value) : value];
}
