import type { ExactPick } from './exact-pick';
import type { Endpoint } from '../types';
import type { PeerLoad } from './prefix-aware-ttft';

/*
 * The terms `prefix-aware` prices a candidate with, in blocks of prefill, and the weights between
 * them. Each weight's comment says why it has its value.
 */

/**
 * The content-balance term is at most this share of the prompt (times `contentBalance`): with
 * the default, a match covering more than half of the prompt still beats an equally loaded
 * endpoint without it, as in SGLang's router (cache threshold 0.5).
 */
export const MAX_EXCESS = 0.5;

/**
 * A prompt's lead is its first `LEAD_BLOCKS` blocks (256 characters at the default
 * `blockChars`), or all of a shorter prompt: a prompt whose lead no candidate holds is a new
 * prefix, placed by the lead's rendezvous order. Long enough to get past the text most
 * prompts open with (a chat template's role markers, "You are a helpful assistant."), so that
 * different system prompts are told apart; short enough that a prompt matching less than its
 * lead loses at most 3 blocks of cache by being placed anew.
 */
export const LEAD_BLOCKS = 4;

/**
 * Candidates holding the same longest prefix, by the engines' events, from which the prefix
 * counts as shared and the content-balance term applies to exact candidates. At 2 it applies
 * to the multi-turn scenario's first turns (the common system prompt) and to a group's prompt
 * only once it was copied to a second rank; at 3 (`npm run bench:replicas`) multi-turn's p99
 * was 897 ms on seed 42 against 789 and its max/mean 2.08 on seed 7 against 1.84.
 */
const SHARED_HOLDERS = 2;

/** Weight of a new sample in the running mean of the prefill blocks a request needs. */
export const WORK_SMOOTHING = 1 / 32;

/**
 * Blocks of prefill a unit of load costs beyond what the waiting queue predicts, in typical
 * requests: a request in flight holds a slot, and the prefix that brought it draws more (the
 * next turn of its conversation, its group's next prompt), which a prediction from the queue
 * alone does not see. With 1, an endpoint two requests busier than another loses to it when
 * the prompt's cached part there is worth less than two typical requests' prefill.
 */
export const LOAD_WEIGHT = 1;

/**
 * What a block of prefill a candidate lacks costs, against a block of queue: a miss not only
 * delays this request, it copies the prefix onto a second rank's cache, evicting what that
 * rank held. At 2 a cached prefix is left only for a queue twice its prefill longer.
 */
export const MISS_WEIGHT = 2;

/**
 * Whether the events show the prompt's longest cached prefix (of at least `lead` blocks) on
 * {@link SHARED_HOLDERS} candidates or more: a shared prefix, such as a system prompt, that
 * each of them would otherwise keep drawing new conversations to, so that the content-balance
 * term applies as on the approximate index. A prefix on one rank alone (a conversation's
 * history, a group's prompt held once) stays with it: there the term would only move prompts
 * off their cache. Without the term a few ranks took every new conversation of the multi-turn
 * scenario (docs/routing-quality.md).
 */
export function sharedPrefix(matched: Int32Array, count: number, lead: number): boolean {
  let most = lead;
  let holders = 0;
  for (let at = 0; at < count; at++) {
    const held = matched[at];
    if (held > most) {
      most = held;
      holders = 1;
    } else if (held === most) {
      holders++;
    }
  }
  return holders >= SHARED_HOLDERS;
}

/**
 * The prefill waiting on `endpoint` that other gateways sent, in blocks: what the peer replicas
 * announced (`peerBlocks`, known per request), plus load neither this router nor its peers sent
 * (load feedback's, other clients') at `work` blocks, a typical request, each.
 */
export function waitingElsewhere(endpoint: Endpoint & PeerLoad, load: number, work: number): number {
  const peerInflight = endpoint.peerInflight ?? 0;
  const unknown = load - endpoint.inflight - peerInflight;
  return (endpoint.peerBlocks ?? 0) + (unknown > 0 ? unknown * work : 0);
}

/** The prompt's blocks (of `blockChars`) a rank holding `held` of the engine's `promptBlocks` lacks. */
export function exactUncached(blockCount: number, held: number, promptBlocks: number): number {
  return (blockCount * (promptBlocks - held)) / promptBlocks;
}

/**
 * The prompt's blocks candidate `at` lacks by the exact index: as {@link exactUncached}, with
 * blocks a lower tier holds counted at their tier's weight (`prefixAware.tierWeights`: loading
 * from CPU costs less than recomputing, more than a GPU hit).
 */
export function exactUncachedAt(blockCount: number, exact: ExactPick, at: number): number {
  return exactUncached(blockCount, exact.tiered === undefined ? exact.matched[at] : exact.tiered[at], exact.promptBlocks);
}
