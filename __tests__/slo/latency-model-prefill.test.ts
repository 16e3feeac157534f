import { describe, expect, it } from '@jest/globals';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { PassThrough } from 'node:stream';
import { chooseWithObjectives, SloEstimates, type SloChoice } from '../../lib/slo/choose';
import { DecayedFit } from '../../lib/policies/decayed-fit';
import { LatencyModel, PREFILL_SECONDS, RankLatency } from '../../lib/slo/latency-model';
import { createSloMetrics } from '../../lib/slo/metrics';
import { parseSlo } from '../../lib/slo/options';
import { sloHooks } from '../../lib/slo/route-hooks';
import { SloRouting } from '../../lib/slo/slo-routing';
import type { Endpoint } from '../../lib/types';

/**
 * The prefill a stream shares its steps with, against a law set here: vLLM's chunked prefill
 * computes the prompts sent to a rank in the same steps as its decodes, so a stream's TPOT =
 * slowness × (40 ms + 2 ms per request in flight + 4.7 ms per uncached block computed per step),
 * the timed mock's step costs in `bench:slo` (40 ms a step, 2 ms a sequence, 0.1 ms a token, about
 * 47 of its tokens in a block). TTFT costs little load here, so that a rank's queue decides
 * nothing in the choices below.
 */
const SLOWNESS = [1, 1, 2, 2];
const BASE = 0.04;
const PER_REQUEST = 0.002;
const PER_BLOCK = 0.0047;
const trueTpot = (rank: number, load: number, blocksPerToken: number) => SLOWNESS[rank] * (BASE + PER_REQUEST * load + PER_BLOCK * blocksPerToken);
const trueTtft = (rank: number, work: number, load: number) => SLOWNESS[rank] * (0.002 * work + 0.001 * load + 0.05);

/** A reproducible uniform [0, 1) (a 32-bit LCG), so the samples are the same on every run. */
function lcg(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    return state / 2 ** 32;
  };
}

/**
 * `count` streams as a fleet warming from cold shows them: at first every family prompt is new
 * on every rank, so streams decode beside 2.5–4.5 blocks of prefill per token at one to four
 * requests in flight; as `cold(i)` falls to 0 the prefill fades and the load grows (to 13). ±5 %
 * noise. `alone`: the same TPOT samples, fitted on the load alone (the model before the prefill
 * term), rank 0's only.
 */
function teach(model: LatencyModel, count: number, cold: (i: number) => number, alone?: DecayedFit): void {
  const random = lcg(47);
  for (let i = 0; i < count; i++) {
    const rank = i % 4;
    const source = `app${i % 3}`;
    const heat = cold(i);
    const load = Math.round(1 + 2 * random() + (1 - heat) * 10 * random());
    const blocks = heat * (2.5 + 2 * random()) + (1 - heat) * 0.4 * random();
    const work = 1 + 60 * random();
    const at = model.rank(`u#${rank}`);
    const noise = 0.95 + 0.1 * random();
    model.learnTtft(at, source, model.weigh(source), work, load, trueTtft(rank, work, load) * noise);
    model.learnTpot(at, source, model.weigh(source), load, blocks, trueTpot(rank, load, blocks) * noise);
    if (rank === 0) alone?.add([load, 1], trueTpot(rank, load, blocks) * noise);
  }
}

/** The predicted TPOT's growth per request in flight, and per block a token, on `rank` (no prefill sent). */
function slopes(model: LatencyModel, rank: number): { perRequest: number; perBlock: number } {
  model.prepare();
  const at = model.rank(`u#${rank}`);
  const perRequest = (model.tpot(at, 10) - model.tpot(at, 2)) / 8;
  // At 2 blocks per token: TPOT = T, so the rate sent is 2 / T blocks a second.
  const withBlocks = trueTpot(rank, 4, 2);
  const perBlock = (model.tpot(at, 4, 2 / withBlocks) - model.tpot(at, 4)) / 2;
  return { perRequest, perBlock };
}

describe('LatencyModel: the prefill a stream shares its steps with', () => {
  it('reads the load slope within 15 % from a warming fleet’s first 200 streams, where a fit on the load alone reads half of it', () => {
    const model = new LatencyModel();
    const alone = new DecayedFit(2, 1);
    const fading = (i: number) => Math.max(0, 1 - i / 150);
    teach(model, 200, fading, alone);
    // The premise: the prefill fading as the load grows hides much of the load's cost from a fit without it.
    alone.refresh(true);
    expect(alone.theta[0]).toBeLessThan(0.6 * PER_REQUEST);
    for (const rank of [0, 2]) {
      const { perRequest, perBlock } = slopes(model, rank);
      expect(perRequest).toBeGreaterThan(SLOWNESS[rank] * PER_REQUEST * 0.85);
      expect(perRequest).toBeLessThan(SLOWNESS[rank] * PER_REQUEST * 1.15);
      // The per-block cost is read less closely from so few streams, the first 16 of them taught
      // before any rank's speed is known (the slow ranks' at twice the cost): 0.85 × here on rank 0.
      expect(perBlock).toBeGreaterThan(SLOWNESS[rank] * PER_BLOCK * 0.75);
      expect(perBlock).toBeLessThan(SLOWNESS[rank] * PER_BLOCK * 1.5);
    }
  });

  it('keeps both when the prefill fades as the load grows (the fleet warming), and predicts TPOT within 5 % at a rank sent prefill', () => {
    const model = new LatencyModel();
    teach(model, 1500, (i) => Math.max(0, 1 - i / 500));
    model.prepare();
    for (let rank = 0; rank < 4; rank++) {
      const at = model.rank(`u#${rank}`);
      for (const [load, blocks] of [[2, 0], [6, 1], [12, 3]]) {
        const truth = trueTpot(rank, load, blocks);
        // The rate sent that makes `blocks` per token at the true TPOT.
        expect(Math.abs(model.tpot(at, load, blocks / truth) / truth - 1)).toBeLessThan(0.05);
      }
    }
  });
});

describe('chooseWithObjectives with the prefill sent to each rank', () => {
  const choice = (): SloChoice => ({ at: -1, meets: false, predicted: false });
  const NOW = 100;

  /** Two fast ranks of a model taught afresh (the prefill sent to its ranks is each test's own). */
  function estimates(uncached: number[], load: number[], tightest: number[], cost: number[]): { model: LatencyModel; est: SloEstimates } {
    const model = new LatencyModel();
    teach(model, 1500, (i) => Math.max(0, 1 - i / 500));
    const est = new SloEstimates();
    est.ensure(2);
    est.now = NOW;
    for (let at = 0; at < 2; at++) {
      est.ranks[at] = model.rank(`u#${at}`);
      est.uncached[at] = uncached[at];
      est.ahead[at] = 0;
      est.load[at] = load[at];
      est.cost[at] = cost[at];
      est.tightest[at] = tightest[at];
    }
    return { model, est };
  }

  it('sends a request with a TPOT objective away from a rank being sent prefill, at the same load', () => {
    // The policy's choice and cheapest is rank 0; the prompt is cached on both.
    const { model, est } = estimates([1, 1], [4, 4], [Infinity, Infinity], [0, 1]);
    // Rank 0 was sent 200 blocks over the last second: ~80 blocks a second now.
    for (let t = 0; t < 10; t++) est.ranks[0].sent(20, NOW - 1 + t / 10);
    // Rank 1: 40 + 2 × 5 = 50 ms, within 0.8 × 70 ms; rank 0 the same divided by 1 − 4.7 ms × 80 ≈ 0.62: past it.
    const out = chooseWithObjectives(model, est, 2, { ttft: 0, tpot: 0.07 }, 0, choice());
    expect(est.tpot[1]).toBeLessThan(0.8 * 0.07);
    expect(est.tpot[0]).toBeGreaterThan(0.07);
    expect(out).toEqual({ at: 1, meets: true, predicted: true });
  });

  it('keeps a long uncached prompt off a rank whose stream its own prefill would slow past its objective', () => {
    // Both ranks run a stream with a 64 ms objective at two in flight: one more decode makes 46 ms,
    // within 0.8 × 64 = 51.2 ms. The prompt is 60 blocks new on rank 0, which the policy chose,
    // and 5 on rank 1: its prefill at rank 0 (30 blocks a second over PREFILL_SECONDS) makes ~53 ms there.
    expect(PREFILL_SECONDS).toBe(2);
    const { model, est } = estimates([60, 5], [2, 2], [0.064, 0.064], [0, 1]);
    const out = chooseWithObjectives(model, est, 2, { ttft: 0, tpot: 0 }, 0, choice());
    expect(est.tpot[0]).toBeGreaterThan(0.8 * 0.064);
    expect(est.tpot[1]).toBeLessThan(0.8 * 0.064);
    expect(out.at).toBe(1);
  });
});

describe('RankLatency: the prefill rate', () => {
  it('takes back what is left of one request’s part, decayed since it was sent, not the others’', () => {
    const rank = new RankLatency();
    rank.sent(40, 10);
    rank.sent(40, 12);
    // At 12 s: 20 × e^-1 from the first, 20 from the second.
    expect(rank.prefillRate(12)).toBeCloseTo(20 * Math.exp(-1) + 20, 6);
    rank.withdraw(40, 10, 12);
    expect(rank.prefillRate(12)).toBeCloseTo(20, 6);
    expect(rank.prefilled).toBe(40);
    // Never below none, whatever is taken back.
    rank.withdraw(400, 12, 12);
    expect(rank.prefillRate(12)).toBe(0);
    expect(rank.prefilled).toBe(0);
  });
});

describe('SloTicket: the prefill it counts at its rank', () => {
  function routed(uncached: number) {
    const routing = new SloRouting(parseSlo('slo', { trust: true }, 'prefix-aware')!, createSloMetrics(undefined));
    const ticket = routing.ticket({}, true);
    const est = routing.estimates;
    est.ensure(2);
    const candidates = [{ key: 'u#0' }, { key: 'u#1' }] as unknown as Endpoint[];
    for (let at = 0; at < 2; at++) {
      est.uncached[at] = uncached;
      est.ahead[at] = 0;
      est.load[at] = 0;
      est.cost[at] = at;
    }
    expect(ticket.steer(candidates, 2, 1)).toBe(1);
    return { rank: routing.model.rank('u#1'), ticket, routing, candidates };
  }

  it('counts a request’s uncached blocks at the rank it goes to', () => {
    const { rank, routing } = routed(40);
    expect(rank.prefilled).toBe(40);
    // Read as of the pick (the rate decays from then: on a loaded machine, by 0.5 % before a read of now).
    expect(rank.prefillRate(routing.estimates.now)).toBeCloseTo(40 / PREFILL_SECONDS, 6);
  });

  it('takes them back when the request is disaggregated: its prompt is computed on a prefill rank', () => {
    const { rank, ticket } = routed(40);
    ticket.prefillsElsewhere();
    expect(rank.prefilled).toBe(0);
    expect(rank.prefillRate(performance.now() / 1000)).toBeLessThan(0.01);
    // Once: a second call (the prefill pick's) takes nothing more.
    ticket.prefillsElsewhere();
    expect(rank.prefilled).toBe(0);
  });

  it('takes them back when no 2xx answer came (the engine refused it, or none came), and keeps them with one', () => {
    // One client's requests that vLLM refuses (a prompt past the context length) would otherwise keep the rank's rate up for everyone.
    for (const answer of [{ statusCode: 400 }, { statusCode: 503 }, null, undefined]) {
      const { rank, routing, ticket } = routed(40);
      // Through the route hook the router calls when the response closes.
      sloHooks(routing).closed({ slo: ticket } as never, undefined as never, answer as IncomingMessage | null | undefined);
      expect(rank.prefilled).toBe(0);
      expect(rank.prefillRate(performance.now() / 1000)).toBeLessThan(0.01);
    }
    const { rank, ticket } = routed(40);
    ticket.closed({ statusCode: 200 } as IncomingMessage);
    expect(rank.prefilled).toBe(40);
  });

  it('counts nothing for a request it sheds (nothing goes upstream)', () => {
    const routing = new SloRouting(parseSlo('slo', { trust: true, shed: true }, 'prefix-aware')!, createSloMetrics(undefined));
    // First tokens of 1 s everywhere, from three sources: an objective of 100 ms is met nowhere.
    for (let i = 0; i < 40; i++) {
      const source = `s${i % 3}`;
      routing.model.learnTtft(routing.model.rank(`u#${i % 2}`), source, routing.model.weigh(source), 10, 1, 1);
    }
    const ticket = routing.ticket({ 'x-slo-ttft-ms': '100' }, true);
    const est = routing.estimates;
    est.ensure(2);
    for (let at = 0; at < 2; at++) {
      est.uncached[at] = 40;
      est.ahead[at] = 0;
      est.load[at] = 0;
      est.cost[at] = at;
    }
    expect(ticket.steer([{ key: 'u#0' }, { key: 'u#1' }] as unknown as Endpoint[], 2, 0)).toBe(-1);
    for (const key of ['u#0', 'u#1']) expect(routing.model.rank(key).prefilled).toBe(0);
  });

  it('moves them with a retry that took the request to another rank', () => {
    const { rank, ticket, routing, candidates } = routed(40);
    const answer = Object.assign(new PassThrough(), { statusCode: 200, headers: { 'content-type': 'text/event-stream' } });
    ticket.answered(candidates[0] as never, answer as unknown as IncomingMessage, { writableNeedDrain: false } as ServerResponse, performance.now());
    expect(rank.prefilled).toBe(0);
    expect(routing.model.rank('u#0').prefilled).toBe(40);
    answer.destroy();
  });
});

describe('LatencyModel: one source against the cost of prefill', () => {
  /**
   * 3,000 streams from three honest sources over four ranks, loads 1–12 and 0–3 blocks a token;
   * with `hostile`, as many again from one source reporting its streams 4 × slower whenever its
   * rank was being sent a block a token or more: an attempt to make every rank taking new prompts
   * look slow to everyone's streams.
   */
  function taught(hostile: boolean): LatencyModel {
    const model = new LatencyModel();
    const random = lcg(48);
    const teachOne = (rank: number, source: string, load: number, blocks: number, factor: number) => {
      const at = model.rank(`u#${rank}`);
      model.learnTtft(at, source, model.weigh(source), 10, load, trueTtft(rank, 10, load));
      model.learnTpot(at, source, model.weigh(source), load, blocks, trueTpot(rank, load, blocks) * factor);
    };
    for (let i = 0; i < 3000; i++) {
      const rank = i % 4;
      teachOne(rank, `app${i % 3}`, 1 + Math.floor(random() * 12), random() * 3, 1);
      if (!hostile) continue;
      const [load, blocks] = [1 + Math.floor(random() * 12), random() * 3];
      teachOne(rank, 'evil', load, blocks, blocks >= 1 ? 4 : 1);
    }
    model.prepare();
    return model;
  }

  it('half the traffic, its streams 4 × slower while their rank is sent prefill: no rank’s predicted TPOT moves by 5 %', () => {
    const control = taught(false);
    const attacked = taught(true);
    for (let rank = 0; rank < 4; rank++) {
      for (const [load, blocks] of [[2, 0], [10, 0], [4, 2]]) {
        const truth = trueTpot(rank, load, blocks);
        for (const model of [control, attacked]) {
          expect(Math.abs(model.tpot(model.rank(`u#${rank}`), load, blocks / truth) / truth - 1)).toBeLessThan(0.05);
        }
      }
    }
  });
});
