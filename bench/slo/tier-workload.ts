/**
 * The tier scenario's second workload (`bench:slo`, docs/performance.md "KV tiers"): what a CPU
 * tier holds only if each family keeps to one rank. Every family's system prompt opens with the
 * same preamble (a product's instructions, as deployments put in front of each tenant's
 * documents or tools), then its own context; families are equally popular. Every GPU then holds
 * the preamble, so the GPU's events cannot tell the ranks apart for a family the GPUs evicted,
 * while the families' contexts (~53 blocks each, 24 of them) fit in the four CPU tiers together
 * and not in one: routing on the GPU alone spreads a family over the ranks and its context is
 * recomputed, routing on the tiers keeps it where a tier holds it. Without the preamble
 * (`preambleWords` 0) the same families differ from their first block, as the Zipf workload's do.
 */
import { exponential, seededRng } from '../routing/rng';
import { words, type PlannedRequest } from './workload';

export interface TierShape {
  families: number;
  /** Words of the preamble every family's prompt opens with (~7 blocks of 16 tokens); 0: none, each family's prompt its own from its first block. */
  preambleWords: number;
  /** Words of each family's own context after it. */
  contextWords: number;
  questionWords: number;
  maxTokens: number;
}

export const TIER_SHAPE: TierShape = { families: 24, preambleWords: 25, contextWords: 195, questionWords: 12, maxTokens: 24 };

/** Interactive chats arriving in `durationMs` at `ratePerSecond` on average, each family alike likely; the same for the same seed and rate. */
export function planTierRequests(seed: number, ratePerSecond: number, durationMs: number, shape: TierShape = TIER_SHAPE): PlannedRequest[] {
  const prompts = seededRng(seed);
  const preamble = shape.preambleWords > 0 ? `Assistant handbook. ${words(prompts, shape.preambleWords)}\n` : '';
  const systems = Array.from({ length: shape.families }, (_, k) => `${preamble}Tenant ${k} context. ${words(prompts, shape.contextWords)}`);
  const arrivals = seededRng(seed + 1);
  const mix = seededRng(seed + 2);
  const planned: PlannedRequest[] = [];
  for (let at = exponential(arrivals, 1000 / ratePerSecond), i = 0; at < durationMs; at += exponential(arrivals, 1000 / ratePerSecond), i++) {
    const family = Math.floor(mix() * shape.families);
    const user = `Question ${i}: ${words(mix, shape.questionWords)}?`;
    const body = JSON.stringify({ model: 'mock-model', messages: [{ role: 'system', content: systems[family] }, { role: 'user', content: user }], max_tokens: shape.maxTokens, stream: true });
    planned.push({ at, kind: 'interactive', family, body, maxTokens: shape.maxTokens });
  }
  return planned;
}
