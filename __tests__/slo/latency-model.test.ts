import { describe, expect, it } from '@jest/globals';
import { chooseWithObjectives, SloEstimates, type SloChoice } from '../../lib/slo/choose';
import { LatencyModel, WARM_SAMPLES, type RankLatency } from '../../lib/slo/latency-model';

/**
 * The ground truth the model is fed, set here: rank r's TTFT = speed[r] × (2 ms per block of
 * work + 10 ms per request in flight + 20 ms), its TPOT = speed[r] × (10 ms + 2 ms per request
 * in flight). Ranks 2 and 3 are twice as slow.
 */
const SLOWNESS = [1, 1, 2, 2];
const trueTtft = (rank: number, work: number, load: number) => SLOWNESS[rank] * (0.002 * work + 0.01 * load + 0.02);
const trueTpot = (rank: number, load: number) => SLOWNESS[rank] * (0.01 + 0.002 * load);

/** A reproducible stream of samples: (rank, work, load) cycling over values that span the features. */
function* samples(count: number): Generator<Sample> {
  for (let i = 0; i < count; i++) yield { rank: i % 4, work: 10 + ((i * 37) % 200), load: (i * 13) % 9, source: `s${i % 3}` };
}

function teach(model: LatencyModel, count: number, ttftOf = trueTtft, tpotOf = trueTpot, filter = (_s: string) => true): void {
  for (const { rank, work, load, source } of samples(count)) {
    if (!filter(source)) continue;
    const at = model.rank(`u#${rank}`);
    model.learnTtft(at, source, model.weigh(source), work, load, ttftOf(rank, work, load));
    model.learnTpot(at, source, model.weigh(source), load, 0, tpotOf(rank, load));
  }
}

type Sample = { rank: number; work: number; load: number; source: string };

/** Every rank's first tokens, but only ranks 0 and 1's streams ended (the slow ranks run long answers); `also` after each sample. */
function teachFastStreamsOnly(model: LatencyModel, also: (at: RankLatency, sample: Sample) => void = () => undefined): void {
  for (const sample of samples(2000)) {
    const { rank, work, load, source } = sample;
    const at = model.rank(`u#${rank}`);
    model.learnTtft(at, source, model.weigh(source), work, load, trueTtft(rank, work, load));
    if (rank < 2) model.learnTpot(at, source, model.weigh(source), load, 0, trueTpot(rank, load));
    also(at, sample);
  }
}

describe('LatencyModel', () => {
  it('makes no prediction before it has seen enough first tokens', () => {
    const model = new LatencyModel();
    teach(model, WARM_SAMPLES - 1);
    expect(model.ttftWarm).toBe(false);
    teach(model, 1);
    expect(model.ttftWarm).toBe(true);
  });

  it('learns the shape and each rank’s speed: predictions within 5 % of the truth on every rank', () => {
    const model = new LatencyModel();
    teach(model, 2000);
    model.prepare();
    for (let rank = 0; rank < 4; rank++) {
      const at = model.rank(`u#${rank}`);
      for (const [work, load] of [[20, 1], [150, 4], [60, 8]]) {
        expect(model.ttft(at, work, load)).toBeCloseTo(trueTtft(rank, work, load), 2);
        expect(Math.abs(model.ttft(at, work, load) / trueTtft(rank, work, load) - 1)).toBeLessThan(0.05);
        expect(Math.abs(model.tpot(at, load) / trueTpot(rank, load) - 1)).toBeLessThan(0.05);
      }
    }
  });

  it('predicts a rank’s TPOT at its TTFT speed until its own streams have ended, then at its own', () => {
    const model = new LatencyModel();
    teachFastStreamsOnly(model);
    model.prepare();
    // Twice as slow to its first token: twice the fast ranks' 10 + 2 × 3 = 16 ms, 32 ms, the truth.
    expect(Math.abs(model.tpot(model.rank('u#2'), 3) / trueTpot(2, 3) - 1)).toBeLessThan(0.05);
    // Rank 3's streams end, 1.5 × as slow per token as the fast ranks (not 2): 24 ms, from its own.
    const rank3 = model.rank('u#3');
    for (let i = 0; i < 300; i++) model.learnTpot(rank3, `s${i % 3}`, model.weigh(`s${i % 3}`), i % 9, 0, 1.5 * trueTpot(0, i % 9));
    model.prepare();
    expect(Math.abs(model.tpot(rank3, 3) / (1.5 * trueTpot(0, 3)) - 1)).toBeLessThan(0.05);
  });

  it('one hostile source reporting a rank without TPOT samples four times slower to its first token does not move the TPOT it borrows', () => {
    const model = new LatencyModel();
    // Interleaved: each honest sample of rank 2 followed by a hostile one.
    teachFastStreamsOnly(model, (at, { rank, work, load }) => {
      if (rank === 2) model.learnTtft(at, 'evil', model.weigh('evil'), work, load, 4 * trueTtft(rank, work, load));
    });
    model.prepare();
    // Rank 2 is twice as slow (SLOWNESS): its borrowed TPOT stays its true 2 × (10 + 2 × 3) = 32 ms, not 4 × that.
    expect(Math.abs(model.tpot(model.rank('u#2'), 3) / trueTpot(2, 3) - 1)).toBeLessThan(0.1);
  });

  it('follows one source in full when it is the only one (a single application behind the gateway)', () => {
    const model = new LatencyModel();
    for (let i = 0; i < 10; i++) expect(model.weigh('only')).toBe(1);
  });

  it('one hostile source reporting rank 0 four times slower, half the traffic, does not move rank 0’s speed', () => {
    const hostile = (rank: number, value: number) => (rank === 0 ? 4 * value : value);
    const control = new LatencyModel();
    teach(control, 2000);
    const attacked = new LatencyModel();
    // Interleaved: every honest sample (sources s0, s1, s2) is followed by a hostile one.
    for (const { rank, work, load, source } of samples(2000)) {
      const at = attacked.rank(`u#${rank}`);
      attacked.learnTtft(at, source, attacked.weigh(source), work, load, trueTtft(rank, work, load));
      attacked.learnTpot(at, source, attacked.weigh(source), load, 0, trueTpot(rank, load));
      attacked.learnTtft(at, 'evil', attacked.weigh('evil'), work, load, hostile(rank, trueTtft(rank, work, load)));
      attacked.learnTpot(at, 'evil', attacked.weigh('evil'), load, 0, hostile(rank, trueTpot(rank, load)));
    }
    const ratio = (model: LatencyModel, kind: 'ttft' | 'tpot') => model.rank('u#0')[kind].factor / model.rank('u#1')[kind].factor;
    // Rank 0 is as fast as rank 1 for the honest sources, and stays so.
    expect(ratio(control, 'ttft')).toBeCloseTo(1, 1);
    expect(ratio(attacked, 'ttft')).toBeCloseTo(1, 1);
    expect(ratio(attacked, 'tpot')).toBeCloseTo(1, 1);
    // Nor the fleet's shape: the hostile samples of rank 0 are left out of the fit, and every rank is still predicted within 10 %.
    attacked.prepare();
    for (let rank = 0; rank < 4; rank++) {
      expect(Math.abs(attacked.tpot(attacked.rank(`u#${rank}`), 3) / trueTpot(rank, 3) - 1)).toBeLessThan(0.1);
      expect(Math.abs(attacked.ttft(attacked.rank(`u#${rank}`), 100, 3) / trueTtft(rank, 100, 3) - 1)).toBeLessThan(0.1);
    }
    // And a request with a TPOT objective rank 0 meets is still placed there.
    const est = new SloEstimates();
    est.ensure(4);
    for (const model of [control, attacked]) {
      for (let at = 0; at < 4; at++) {
        est.ranks[at] = model.rank(`u#${at}`);
        est.uncached[at] = at === 0 ? 0 : 50;
        est.ahead[at] = 0;
        est.load[at] = 2;
        est.cost[at] = at;
        est.tightest[at] = Infinity;
      }
      const choice: SloChoice = { at: -1, meets: false, predicted: false };
      // 1.3 × rank 0's true TPOT with 3 in flight: met on 0 and 1, not on the slow ranks.
      chooseWithObjectives(model, est, 4, { ttft: 0, tpot: 1.3 * trueTpot(0, 3) }, 1, choice);
      expect(choice).toEqual({ at: 0, meets: true, predicted: true });
    }
  });

  it('bounds a source’s share of the learned weight to a third once several sources are seen', () => {
    const model = new LatencyModel(3);
    let evilWeight = 0;
    let honestWeight = 0;
    for (let i = 0; i < 1000; i++) {
      honestWeight += model.weigh(`h${i % 3}`);
      for (let j = 0; j < 3; j++) evilWeight += model.weigh('evil');
    }
    expect(evilWeight / (evilWeight + honestWeight)).toBeLessThan(0.36);
  });
});

describe('chooseWithObjectives', () => {
  const model = new LatencyModel();
  teach(model, 2000);
  function estimates(uncached: number[], load: number[], tightest: number[] = [Infinity, Infinity, Infinity, Infinity]): SloEstimates {
    const est = new SloEstimates();
    est.ensure(4);
    for (let at = 0; at < 4; at++) {
      est.ranks[at] = model.rank(`u#${at}`);
      est.uncached[at] = uncached[at];
      est.ahead[at] = 0;
      est.load[at] = load[at];
      est.cost[at] = uncached[at] + load[at];
      est.tightest[at] = tightest[at];
    }
    return est;
  }
  const choice = (): SloChoice => ({ at: -1, meets: false, predicted: false });

  it('takes the best cache hit among the ranks predicted to meet both objectives', () => {
    // Truth at load 1: rank 2 holds most but is slow, 2 × (2 ms × 10 + 10 + 20) = 100 ms; rank 1:
    // 2 ms × 20 + 30 = 70 ms; rank 0: 230 ms. An objective of 90 ms: rank 1 alone meets it.
    const est = estimates([100, 20, 10, 100], [1, 1, 1, 1]);
    const out = chooseWithObjectives(model, est, 4, { ttft: 0.09, tpot: 0 }, 2, choice());
    expect(out).toEqual({ at: 1, meets: true, predicted: true });
  });

  it('takes the least bad rank when none meets them, and says so', () => {
    const est = estimates([100, 100, 100, 100], [8, 2, 0, 0]);
    // TTFT truth: 0: 0.30, 1: 0.24, 2: 0.44, 3: 0.44; objective 0.1: rank 1 misses least.
    const out = chooseWithObjectives(model, est, 4, { ttft: 0.1, tpot: 0 }, 0, choice());
    expect(out).toEqual({ at: 1, meets: false, predicted: true });
  });

  it('keeps a request without objectives off a rank where one more decode breaks a running stream’s TPOT objective', () => {
    // Rank 0 runs an interactive stream with a 15 ms objective at load 2: one more makes 0.01 + 0.002 × 4 = 18 ms.
    const est = estimates([10, 10, 10, 10], [2, 2, 0, 0], [0.015, Infinity, Infinity, Infinity]);
    const out = chooseWithObjectives(model, est, 4, { ttft: 0, tpot: 0 }, 0, choice());
    // The policy's cheapest of the others (cost = uncached + load): rank 2, the first of 2 and 3 at 10.
    expect(out.at).toBe(2);
    // Every rank runs a stream with that objective: idle, rank 0 makes it 0.01 + 0.002 = 12 ms, within
    // 80 %; rank 1 16 ms, the slow ranks 2 × 12 = 24 ms. (With ranks running no objective, those
    // come first: choose.test.ts.)
    const free = estimates([10, 10, 10, 10], [0, 2, 0, 0], [0.015, 0.015, 0.015, 0.015]);
    expect(chooseWithObjectives(model, free, 4, { ttft: 0, tpot: 0 }, 0, choice()).at).toBe(0);
  });

  it('yields a request without objectives only to a rank that gives it its first token within 1.5 × the policy’s choice', () => {
    // Rank 0 breaks the stream there; the others are busy: TTFT truth 1: 2 ms × 10 + 80 + 20 = 120 ms, 2 and 3: 240 ms,
    // against rank 0's 60 ms (limit 90 ms). It stays on rank 0: it may yield, not starve.
    const est = estimates([10, 10, 10, 10], [2, 8, 8, 8], [0.015, Infinity, Infinity, Infinity]);
    expect(chooseWithObjectives(model, est, 4, { ttft: 0, tpot: 0 }, 0, choice()).at).toBe(0);
  });

  it('leaves the policy its choice while the model is cold', () => {
    const cold = new LatencyModel();
    const est = estimates([0, 0, 0, 0], [0, 0, 0, 0]);
    est.ranks = [0, 1, 2, 3].map((at) => cold.rank(`u#${at}`));
    expect(chooseWithObjectives(cold, est, 4, { ttft: 0.001, tpot: 0 }, 3, choice())).toEqual({ at: 3, meets: true, predicted: false });
  });
});
