import { describe, expect, it } from '@jest/globals';
import { LatencyModel } from '../../lib/slo/latency-model';

/**
 * The fit's per-block cost under `bench:slo`'s correlation structure, against a law set here.
 *
 * The traffic: interactive requests, mostly a cache hit (about one block of their own), now and
 * then a family's prompt cold on the rank (21 blocks), at any load; batch requests, 22 to 32
 * blocks of their own every time, on busier ranks, mostly the two slow ones. Own blocks, load and
 * rank speed all move together, as they do when the router keeps one class on some ranks.
 *
 * The truth: TTFT = slowness × (4.7 ms per block of work + 3 ms per request in flight + 45 ms)
 * + slowness × u × (40 ms + 2 ms per request in flight), u uniform on [0, 1): the wait for the
 * engine step under way, which owes nothing to the request's blocks. 4.7 ms per block is what
 * the mock's engine costs in `bench:slo` (0.1 ms per token computed, about 47 of its tokenizer's
 * tokens in a 64-character block of the bench's made-up words). The step's mean wait goes to the
 * constant and the load term (20 ms and 1 ms per request), never to the blocks.
 */
const PER_BLOCK = 0.0047;
const SLOWNESS = [1, 1, 1, 1, 1, 1, 2, 2];
const BATCH_RANKS = [3, 5, 6, 7];

/** A reproducible uniform [0, 1) (a 32-bit LCG), so the samples are the same on every run. */
function lcg(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    return state / 2 ** 32;
  };
}

function truth(rank: number, work: number, load: number, phase: number): number {
  const k = SLOWNESS[rank];
  return k * (PER_BLOCK * work + 0.003 * load + 0.045) + k * phase * (0.04 + 0.002 * load);
}

describe('LatencyModel per-block cost', () => {
  it('recovers each rank’s true cost per block (within 10 %) when own blocks, load and rank speed move together', () => {
    const model = new LatencyModel();
    const random = lcg(47);
    for (let i = 0; i < 3000; i++) {
      const source = `app${i % 4}`;
      const batch = random() < 0.3;
      const rank = batch ? BATCH_RANKS[Math.floor(random() * BATCH_RANKS.length)] : Math.floor(random() * 6);
      const own = batch ? 22 + Math.floor(random() * 11) : random() < 0.15 ? 21 : 1 + random();
      const ahead = random() < 0.2 ? (batch ? 30 : 21) * random() : 0;
      const load = batch ? 5 + Math.floor(random() * 8) : 1 + Math.floor(random() * 8);
      const work = own + ahead;
      const at = model.rank(`u#${rank}`);
      model.learnTtft(at, source, model.weigh(source), work, load, truth(rank, work, load, random()));
    }
    // The shape's scale is shared with the ranks' speeds (only k_r × a is identified): a rank's cost per block is their product.
    model.prepare();
    for (const rank of [0, 4, 6]) {
      const at = model.rank(`u#${rank}`);
      const perBlock = (model.ttft(at, 21, 4) - model.ttft(at, 1, 4)) / 20;
      expect(perBlock).toBeGreaterThan(SLOWNESS[rank] * PER_BLOCK * 0.9);
      expect(perBlock).toBeLessThan(SLOWNESS[rank] * PER_BLOCK * 1.1);
    }
  });
});
