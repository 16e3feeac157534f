/**
 * The traffic of `bench:slo`, deterministic for a seed: chats behind shared-prefix families (a
 * long system prompt per family, popularity skewed), of two classes:
 *
 * - interactive: a short question after the family's prompt, a short answer, streamed, with
 *   objectives (`x-slo-ttft-ms`, `x-slo-tpot-ms`);
 * - batch: a long document after the family's prompt, a long answer, streamed, no objectives.
 *
 * Arrivals are Poisson at the rate given.
 */
import { exponential, seededRng, type Rng } from '../routing/rng';

/** The shape of the traffic. */
export interface WorkloadShape {
  families: number;
  /** Words of each family's system prompt. */
  familyWords: number;
  /** Words of an interactive question. */
  questionWords: number;
  /** Words of a batch document. */
  documentWords: number;
  interactiveMaxTokens: number;
  batchMaxTokens: number;
  /** Share of requests that are interactive. */
  interactiveShare: number;
}

export const SHAPE: WorkloadShape = {
  families: 24,
  familyWords: 220,
  questionWords: 12,
  documentWords: 260,
  interactiveMaxTokens: 24,
  batchMaxTokens: 64,
  interactiveShare: 0.7,
};

export type RequestClass = 'interactive' | 'batch';

/** One request of the run: when it is sent (ms after the start), and what. */
export interface PlannedRequest {
  readonly at: number;
  readonly kind: RequestClass;
  readonly family: number;
  readonly body: string;
  readonly maxTokens: number;
}

const SYLLABLES = ['ka', 'lo', 'mi', 'ren', 'tu', 'sa', 'vel', 'do', 'ni', 'qua', 'per', 'zo', 'li', 'mon', 'tar', 'ex'];

/** `count` made-up words. */
export function words(random: Rng, count: number): string {
  const out: string[] = [];
  for (let i = 0; i < count; i++) {
    const length = 1 + Math.floor(random() * 3);
    let word = '';
    for (let s = 0; s < length; s++) word += SYLLABLES[Math.floor(random() * SYLLABLES.length)];
    out.push(word);
  }
  return out.join(' ');
}

/** A family index, skewed: family k is drawn about 1/(k+1) as often as family 0 (Zipf, s = 1). */
function skewed(random: Rng, families: number): number {
  let total = 0;
  for (let k = 0; k < families; k++) total += 1 / (k + 1);
  let draw = random() * total;
  for (let k = 0; k < families; k++) {
    draw -= 1 / (k + 1);
    if (draw <= 0) return k;
  }
  return families - 1;
}

/** The requests arriving in `durationMs` at `ratePerSecond` on average; the same for the same seed and rate. */
export function planRequests(seed: number, ratePerSecond: number, durationMs: number, shape: WorkloadShape = SHAPE): PlannedRequest[] {
  const prompts = seededRng(seed);
  const systems = Array.from({ length: shape.families }, (_, k) => `Family ${k} handbook. ${words(prompts, shape.familyWords)}`);
  const arrivals = seededRng(seed + 1);
  const mix = seededRng(seed + 2);
  const planned: PlannedRequest[] = [];
  for (let at = exponential(arrivals, 1000 / ratePerSecond), i = 0; at < durationMs; at += exponential(arrivals, 1000 / ratePerSecond), i++) {
    const kind: RequestClass = mix() < shape.interactiveShare ? 'interactive' : 'batch';
    const family = skewed(mix, shape.families);
    const user = kind === 'interactive' ? `Question ${i}: ${words(mix, shape.questionWords)}?` : `Summarize document ${i}: ${words(mix, shape.documentWords)}`;
    const maxTokens = kind === 'interactive' ? shape.interactiveMaxTokens : shape.batchMaxTokens;
    const body = JSON.stringify({ model: 'mock-model', messages: [{ role: 'system', content: systems[family] }, { role: 'user', content: user }], max_tokens: maxTokens, stream: true });
    planned.push({ at, kind, family, body, maxTokens });
  }
  return planned;
}
