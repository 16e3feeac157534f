import { describe, expect, it } from '@jest/globals';
import { chooseWithObjectives, SloEstimates, type SloChoice } from '../../lib/slo/choose';
import { LatencyModel } from '../../lib/slo/latency-model';

/**
 * The ground truth the model learns, set here (as in latency-model.test.ts): rank r's TTFT =
 * speed[r] × (2 ms per block of work + 10 ms per request in flight + 20 ms), its TPOT = speed[r] ×
 * (10 ms + 2 ms per request in flight). Ranks 2 and 3 are twice as slow: alone, 24 ms a token.
 */
const SLOWNESS = [1, 1, 2, 2];
const model = new LatencyModel();
for (let i = 0; i < 2000; i++) {
  const rank = i % 4;
  const work = 10 + ((i * 37) % 200);
  const load = (i * 13) % 9;
  const source = `s${i % 3}`;
  const at = model.rank(`u#${rank}`);
  model.learnTtft(at, source, model.weigh(source), work, load, SLOWNESS[rank] * (0.002 * work + 0.01 * load + 0.02));
  model.learnTpot(at, source, model.weigh(source), load, 0, SLOWNESS[rank] * (0.01 + 0.002 * load));
}

interface Candidate {
  uncached: number;
  ahead?: number;
  load: number;
  tightest?: number;
}

function estimates(candidates: Candidate[]): SloEstimates {
  const est = new SloEstimates();
  est.ensure(candidates.length);
  candidates.forEach(({ uncached, ahead = 0, load, tightest = Infinity }, at) => {
    est.ranks[at] = model.rank(`u#${at}`);
    est.uncached[at] = uncached;
    est.ahead[at] = ahead;
    est.load[at] = load;
    est.cost[at] = ahead + uncached + load;
    est.tightest[at] = tightest;
  });
  return est;
}

const choice = (): SloChoice => ({ at: -1, meets: false, predicted: false });
const none = { ttft: 0, tpot: 0 };

/** The same estimates after a request with a 20 ms TPOT objective was steered: a rank 16 ms a token alone (80 %) serves it, a slow one (24 ms) does not. */
function seenObjective(est: SloEstimates): SloEstimates {
  chooseWithObjectives(model, est, 4, { ttft: 0, tpot: 0.02 }, 0, choice());
  return est;
}

describe('chooseWithObjectives: requests without objectives', () => {
  it('go to a rank too slow for the objectives seen while it has room (its own time, not a fast rank’s)', () => {
    // The policy prefers rank 0. Slow ranks: TTFT truth with nothing ahead 2 × (20 + 20) = 80 ms
    // (rank 2, 10 blocks) and 2 × (40 + 20) = 120 ms (rank 3, 20 blocks), against 40 ms on the fast
    // ranks: bounded by 1.5 × the policy's choice (60 ms), neither would qualify.
    const est = seenObjective(estimates([{ uncached: 10, load: 1 }, { uncached: 10, load: 1 }, { uncached: 10, load: 0 }, { uncached: 20, load: 0 }]));
    expect(chooseWithObjectives(model, est, 4, none, 0, choice())).toEqual({ at: 2, meets: true, predicted: true });
    // Rank 2 with 20 blocks queued ahead: 2 × (60 + 20) = 160 ms, twice its own 80 ms: rank 3, the other slow one.
    const queued = seenObjective(estimates([{ uncached: 10, load: 1 }, { uncached: 10, load: 1 }, { uncached: 10, ahead: 20, load: 0 }, { uncached: 20, load: 0 }]));
    expect(chooseWithObjectives(model, queued, 4, none, 0, choice()).at).toBe(3);
  });

  it('go to a slow rank only up to its share of the requests in flight', () => {
    // Loads 0, 1, 3, 0: a share of 1. Rank 2 runs 3: its TTFT, 2 × (100 + 30 + 20) = 300 ms, is
    // within 1.5 × its own 240 ms, but it holds more than its share. Rank 3 is queued past its own
    // time (2 × (220 + 20) against 2 × (100 + 20)). A fast rank takes it: rank 1, which already
    // runs one and no stream with an objective, before idle rank 0 (see “fill a fast rank…” below).
    // (The policy chose rank 3.)
    const est = seenObjective(estimates([{ uncached: 50, load: 0 }, { uncached: 50, load: 1 }, { uncached: 50, load: 3 }, { uncached: 50, ahead: 60, load: 0 }]));
    expect(chooseWithObjectives(model, est, 4, none, 3, choice()).at).toBe(1);
  });

  it('with no slow rank that has room, go to a fast rank that has, not to the policy’s cache holder queued past its own time', () => {
    // Both slow ranks queued (2 × (50 + 20) = 140 ms against their own 80 ms). The policy's choice,
    // rank 0, holds the prompt but runs 3 (TTFT 0 + 30 + 20 = 50 ms, 2.5 × its own 20 ms); rank 1,
    // idle, misses it all: 2 × 10 + 20 = 40 ms, its own.
    const est = seenObjective(estimates([{ uncached: 0, load: 3 }, { uncached: 10, load: 0 }, { uncached: 10, ahead: 20, load: 1 }, { uncached: 10, ahead: 20, load: 1 }]));
    expect(chooseWithObjectives(model, est, 4, none, 0, choice()).at).toBe(1);
  });

  it('never go where one more decode breaks a running stream’s TPOT objective while another rank has room', () => {
    // Rank 1, idle and the least loaded, runs a stream with a 14 ms objective: one more makes
    // 10 + 2 × 1 = 12 ms, past 80 % of it (11.2 ms). Rank 0 (load 1) takes it.
    const est = seenObjective(estimates([{ uncached: 10, load: 1 }, { uncached: 10, load: 0, tightest: 0.014 }, { uncached: 10, ahead: 20, load: 1 }, { uncached: 10, ahead: 20, load: 1 }]));
    expect(chooseWithObjectives(model, est, 4, none, 1, choice()).at).toBe(0);
  });

  it('with no rank that has room, go where the first token is predicted soonest', () => {
    // Every rank queued past 1.5 × its own time: rank 0 0.02 × 40 + 0.01 × 4 + 0.02 = 0.14 s, rank 1 0.12 s, slow ranks ≥ 0.28 s.
    const est = seenObjective(estimates([{ uncached: 10, ahead: 30, load: 4 }, { uncached: 10, ahead: 30, load: 2 }, { uncached: 10, ahead: 30, load: 1 }, { uncached: 10, ahead: 40, load: 0 }]));
    expect(chooseWithObjectives(model, est, 4, none, 0, choice()).at).toBe(1);
  });

  it('prefer a rank where no stream with an objective decodes to the policy’s choice where one does', () => {
    // Both slow ranks queued (2 × (60 + 10 + 20) = 180 ms against their own 80 ms). Rank 0, the
    // policy's choice, runs a stream with a 30 ms objective that one more decode leaves within it
    // (10 + 2 × 2 = 14 ms, under 80 % of 30), its first token 10 + 10 + 20 = 40 ms (its own: 30 ms);
    // rank 1 runs nothing with an objective, its first token 20 + 10 + 20 = 50 ms (its own: 40 ms).
    const est = seenObjective(estimates([{ uncached: 5, load: 1, tightest: 0.03 }, { uncached: 10, load: 1 }, { uncached: 10, ahead: 20, load: 1 }, { uncached: 10, ahead: 20, load: 1 }]));
    expect(chooseWithObjectives(model, est, 4, none, 0, choice()).at).toBe(1);
  });

  it('fill a fast rank already running requests without objectives before an idle one, even the policy’s choice', () => {
    // Both slow ranks queued (2 × (60 + 10 + 20) = 180 ms against their own 80 ms). Neither fast
    // rank runs a stream with an objective: rank 0 runs 2 without (its first token 40 + 20 + 20 =
    // 80 ms, within 1.5 × its own 60 ms), rank 1 nothing, and the policy chose it. An idle fast rank
    // given this request is one the next requests with objectives avoid: the batch class would
    // take another fast rank from them (docs/performance.md, "A third batch rank").
    const est = seenObjective(estimates([{ uncached: 20, load: 2 }, { uncached: 10, load: 0 }, { uncached: 10, ahead: 20, load: 1 }, { uncached: 10, ahead: 20, load: 1 }]));
    expect(chooseWithObjectives(model, est, 4, none, 1, choice()).at).toBe(0);
    // Past 1.5 × its own time (running 4: 40 + 40 + 20 = 100 ms), the idle one.
    const full = seenObjective(estimates([{ uncached: 20, load: 4 }, { uncached: 10, load: 0 }, { uncached: 10, ahead: 20, load: 1 }, { uncached: 10, ahead: 20, load: 1 }]));
    expect(chooseWithObjectives(model, full, 4, none, 1, choice()).at).toBe(1);
  });

  it('before any TPOT objective is seen, no rank counts as too slow: the policy’s choice, where it has room', () => {
    // The first scenario without the objective: rank 0, the policy's choice, runs 1: 20 + 10 + 20 = 50 ms against its own 40 ms.
    const est = estimates([{ uncached: 10, load: 1 }, { uncached: 10, load: 1 }, { uncached: 10, load: 0 }, { uncached: 20, load: 0 }]);
    expect(chooseWithObjectives(model, est, 4, none, 0, choice()).at).toBe(0);
    // Nor is an idle rank kept for a class not seen: the policy's idle choice, not the busy rank 0 (as once one is, above).
    const idle = estimates([{ uncached: 20, load: 2 }, { uncached: 10, load: 0 }, { uncached: 10, ahead: 20, load: 1 }, { uncached: 10, ahead: 20, load: 1 }]);
    expect(chooseWithObjectives(model, idle, 4, none, 1, choice()).at).toBe(1);
  });
});

describe('chooseWithObjectives: requests with both objectives', () => {
  // TTFT ≤ 200 ms, TPOT ≤ 30 ms (met within 80 %: ≤ 24 ms, a fast rank running 6 at most with the request).
  const objectives = { ttft: 0.2, tpot: 0.03 };

  it('weigh the load against the cache hit: an idle rank over a loaded holder of the prompt', () => {
    // Rank 0 holds the prompt, runs 5: TTFT 50 + 20 = 70 ms (0.35), TPOT 10 + 12 = 22 ms (0.73): 1.08.
    // Rank 1 lacks 10 blocks, idle: TTFT 20 + 20 = 40 ms (0.2), TPOT 12 ms (0.4): 0.6. Slow ranks run 2: 32 ms, they miss.
    const est = estimates([{ uncached: 0, load: 5 }, { uncached: 10, load: 0 }, { uncached: 0, load: 2 }, { uncached: 0, load: 2 }]);
    expect(chooseWithObjectives(model, est, 4, objectives, 0, choice())).toEqual({ at: 1, meets: true, predicted: true });
  });

  it('with none predicted to meet them within headroom, among those predicted to meet them, the least used in sum, not by the worst share', () => {
    // Rank 0 holds the prompt, runs 8: TTFT 80 + 20 = 100 ms (0.5), TPOT 10 + 18 = 28 ms (0.93): 1.43.
    // Rank 1 lacks 40 blocks, runs 7: TTFT 80 + 70 + 20 = 170 ms (0.85), TPOT 26 ms (0.87): 1.72,
    // the smaller worst share. Slow ranks lacking 40 blocks, running 4: TTFT 2 × 140 = 280 ms, a miss.
    const est = estimates([{ uncached: 0, load: 8 }, { uncached: 40, load: 7 }, { uncached: 40, load: 4 }, { uncached: 40, load: 4 }]);
    expect(chooseWithObjectives(model, est, 4, objectives, 1, choice())).toEqual({ at: 0, meets: false, predicted: true });
  });

  it('with every rank predicted to miss, a fast rank over one too slow for the TPOT objective even alone', () => {
    // TPOT ≤ 20 ms: the slow ranks make 24 ms a token alone. Rank 2 holds the prompt, idle: TTFT
    // 2 × 20 = 40 ms, TPOT 24 ms (1.2 of it), the least worst share. The fast ranks are queued: rank
    // 0, 2 × 110 + 20 + 20 = 260 ms (1.3 of 200), TPOT 16 ms; rank 1, 300 ms (1.5). Rank 0.
    const tight = { ttft: 0.2, tpot: 0.02 };
    const est = estimates([{ uncached: 10, ahead: 100, load: 2 }, { uncached: 10, ahead: 120, load: 2 }, { uncached: 0, load: 0 }, { uncached: 0, load: 1 }]);
    expect(chooseWithObjectives(model, est, 4, tight, 2, choice())).toEqual({ at: 0, meets: false, predicted: true });
  });

  it('keep the hit when it saves more than the load costs', () => {
    // Rank 0 holds the prompt, runs 2: TTFT 40 ms (0.2), TPOT 16 ms (0.53): 0.73. Rank 1 lacks 40
    // blocks, idle: TTFT 100 ms (0.5), TPOT 12 ms (0.4): 0.9.
    const est = estimates([{ uncached: 0, load: 2 }, { uncached: 40, load: 0 }, { uncached: 0, load: 2 }, { uncached: 0, load: 2 }]);
    expect(chooseWithObjectives(model, est, 4, objectives, 1, choice()).at).toBe(0);
  });
});
