/**
 * Which of a model's KV-cache groups a rank's exact index follows.
 *
 * vLLM publishes every group's blocks (#37688), in the order of each layer type's first layer
 * (kv_cache_utils.py `_get_kv_cache_groups_uniform_page_size`), every group keyed by the same
 * request hashes. A hybrid model's group 0 is then often a sliding-window group, which drops a
 * prompt's early blocks while the full-attention group keeps them (their removals name group 0
 * only), and whose hits need the full-attention prefix anyway (kv_cache_coordinator.py
 * `HybridKVCacheCoordinator` matches full attention first). So a rank follows:
 * 1. the full-attention group of lowest index, by `kv_cache_spec_kind` (vLLM #40984);
 * 2. without kinds (vLLM between #37688 and #40984), the group of highest index: no hybrid
 *    model vLLM groups this way starts with a full-attention layer (Gemma-2/3, gpt-oss, Llama-4,
 *    Qwen3-Next start with a sliding-window, local or linear one), so full attention comes last;
 *    a single group, or events without `group_idx` (before #37688), is group 0;
 * 3. a model with no full-attention group (a sliding window throughout), its group of lowest index.
 */

/** A rank that has seen no store yet. */
export const NO_GROUP = -1;

/** vLLM's kinds of the groups whose blocks hold a prefix whole: `FullAttentionSpec` and its subclasses (kv_cache_interface.py `get_kv_cache_spec_kind`). */
const FULL_ATTENTION_KINDS: ReadonlySet<string> = new Set(['full_attention', 'mla_attention', 'sink_full_attention']);
const FULL_ATTENTION = 2;
const KIND_UNKNOWN = 1;
const OTHER_KIND = 0;

/** A group's class by its published kind: full attention, none published, or another kind (the higher, the better to follow). */
export function groupClass(kind: string | null | undefined): number {
  if (kind === null || kind === undefined) return KIND_UNKNOWN;
  return FULL_ATTENTION_KINDS.has(kind) ? FULL_ATTENTION : OTHER_KIND;
}

/** Whether group `group` of class `kind` is better to follow than `followed` (another group, or NO_GROUP). */
export function betterGroup(followed: { readonly group: number; readonly groupClass: number }, group: number, kind: number): boolean {
  if (followed.group === NO_GROUP) return true;
  if (kind !== followed.groupClass) return kind > followed.groupClass;
  return kind === KIND_UNKNOWN ? group > followed.group : group < followed.group;
}
