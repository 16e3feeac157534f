import { describe, expect, it } from '@jest/globals';
import { startMockVllm, type MockVllmOptions } from '../../example-server/mock-vllm';
import { allIdle, closedAfterEach, metricValue, startGateway, waitFor } from '../helpers';
import { SloEstimates, type SloChoice } from '../../lib/slo/choose';
import { LatencyModel } from '../../lib/slo/latency-model';
import { choosePrefill } from '../../lib/slo/prefill-steer';

const started = closedAfterEach();

/**
 * Prefill ranks 0 and 1, rank 1 at a tenth of rank 0's speed: the timed mock's engine step takes
 * 20 ms on rank 0 and 200 ms on rank 1, so a prefill leg (one step for these short prompts) takes
 * about 20 ms there and 200 ms here. Decode ranks 4 and 5, 5 at a quarter of 4's speed: a token
 * every ~10 ms on 4, every ~40 ms on 5. Objectives of 150 ms to the first token and 25 ms per
 * token are met only by prefill 0 with decode 4 (0.8 × 150 = 120 ms < 200 ms; 0.8 × 25 = 20 ms,
 * between 10 and 40).
 */
const PREFILL: MockVllmOptions = { role: 'prefill', connector: 'nixl', dataParallelSize: 2, scheduler: { speeds: [1, 0.1], stepMs: 20 } };
const DECODE: MockVllmOptions = { role: 'decode', connector: 'nixl', dataParallelSize: 2, startRank: 4, scheduler: { speeds: [1, 0.25], stepMs: 10 } };

async function pd(shed = false) {
  const prefill = await startMockVllm(PREFILL);
  started.push(prefill);
  const decode = await startMockVllm(DECODE);
  started.push(decode);
  const gateway = await startGateway({
    upstreams: [
      { url: prefill.url, name: 'p', dataParallelSize: 2, role: 'prefill' },
      { url: decode.url, name: 'd', dataParallelSize: 2, startRank: 4, role: 'decode' },
    ],
    policy: 'prefix-aware',
    exposeDecision: true,
    disaggregation: { connector: 'nixl', prefillPolicy: 'prefix-aware' },
    slo: { trust: true, shed },
  });
  started.push(gateway);
  return { gateway, prefill };
}

/** Distinct prompts (no shared prefix: the cache plays no part). */
function prompt(i: number, who: string): string {
  return `${who} request ${i}: ${'lorem ipsum '.repeat(20)} ${i * 7919}`;
}

async function stream(url: string, text: string, headers: Record<string, string> = {}): Promise<{ status: number; prefill: number; decode: number; decision: string }> {
  const answer = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: 'mock-model', prompt: text, max_tokens: 10, stream: true }),
  });
  await answer.text();
  const decision = answer.headers.get('x-dp-router-decision') ?? '';
  return { status: answer.status, prefill: Number(/prefill=p@(\d+)/.exec(decision)?.[1] ?? -1), decode: Number(/\brank=(\d+)/.exec(decision)?.[1] ?? -1), decision };
}

/** Requests without objectives, two at a time, until both pools' models are warm (16 prefill legs, 16 streams of 8+ tokens). */
async function warmUp(url: string): Promise<number[]> {
  const prefills = [0, 0];
  for (let i = 0; i < 32; i += 2) {
    for (const answer of await Promise.all([0, 1].map((j) => stream(url, prompt(i + j, 'warm'))))) {
      expect(answer.status).toBe(200);
      prefills[answer.prefill]++;
    }
  }
  return prefills;
}

describe('SLO routing of disaggregated requests', () => {
  it('sends a request with objectives to the fast prefill rank and the decode rank that meets its TPOT, once learned', async () => {
    const { gateway } = await pd();
    const prefills = await warmUp(gateway.url);
    // Without objectives the prefill policy spread the warm-up over both prefill ranks (the slow one was measured too).
    expect(prefills[1]).toBeGreaterThan(0);
    const chosen: Array<{ prefill: number; decode: number }> = [];
    let predicted = 0;
    for (let i = 0; i < 12; i++) {
      const answer = await stream(gateway.url, prompt(i, 'interactive'), { 'x-slo-ttft-ms': '150', 'x-slo-tpot-ms': '25' });
      expect(answer.status).toBe(200);
      chosen.push(answer);
      if (/predicted_ttft_ms=\d+; prefill=/.test(answer.decision)) predicted++;
    }
    expect(predicted).toBe(12);
    expect(chosen.filter((pair) => pair.prefill === 0).length).toBeGreaterThanOrEqual(11);
    expect(chosen.filter((pair) => pair.decode === 4).length).toBeGreaterThanOrEqual(11);
    expect(await metricValue(gateway.registry, 'dp_router_slo_requests_total', { outcome: 'met' })).toBeGreaterThanOrEqual(10);
  });

  it('with shed, answers 503 with Retry-After and sends no prefill leg when no pair is predicted to meet the TTFT objective', async () => {
    const { gateway, prefill } = await pd(true);
    await warmUp(gateway.url);
    const before = prefill.stats().requests.length;
    // 30 ms: the fast prefill rank's 20 ms step and the decode rank's first step leave no pair within 0.8 × 30 ms.
    const answer = await fetch(`${gateway.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-slo-ttft-ms': '30' },
      body: JSON.stringify({ model: 'mock-model', prompt: prompt(1, 'hopeless'), max_tokens: 10, stream: true }),
    });
    expect(answer.status).toBe(503);
    expect(((await answer.json()) as { error: { type: string } }).error.type).toBe('ServiceUnavailableError');
    expect(Number(answer.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    expect(prefill.stats().requests.length).toBe(before);
    expect(await metricValue(gateway.registry, 'dp_router_slo_requests_total', { outcome: 'shed' })).toBe(1);
    await waitFor(() => allIdle(gateway), 2000, 'in-flight counts back to 0');
  });

  it('without objectives leaves the prefill policy its choice: both prefill ranks keep serving', async () => {
    const { gateway } = await pd();
    await warmUp(gateway.url);
    const prefills = [0, 0];
    for (let i = 0; i < 8; i += 2) {
      for (const answer of await Promise.all([0, 1].map((j) => stream(gateway.url, prompt(i + j, 'batch'))))) prefills[answer.prefill]++;
    }
    expect(prefills[1]).toBeGreaterThan(0);
  });
});

/**
 * The pure choice, on a prefill model fed the truth set here: prefill rank 0 takes 2 ms per block
 * of prefill + 20 ms, rank 1 four times that.
 */
describe('choosePrefill', () => {
  const SLOWNESS = [1, 4];
  const truth = (rank: number, work: number) => SLOWNESS[rank] * (0.002 * work + 0.02);

  function taught(): { model: LatencyModel; est: SloEstimates } {
    const model = new LatencyModel();
    for (let i = 0; i < 400; i++) {
      const rank = i % 2;
      const work = 5 + ((i * 37) % 50);
      const source = `s${i % 3}`;
      model.learnTtft(model.rank(`p#${rank}`), source, model.weigh(source), work, (i * 7) % 3, truth(rank, work));
    }
    const est = new SloEstimates();
    est.ensure(2);
    est.ranks[0] = model.rank('p#0');
    est.ranks[1] = model.rank('p#1');
    // Rank 1 holds the whole prompt (0 uncached blocks) with 10 blocks queued ahead; rank 0 none of its 10 blocks, nothing ahead.
    est.uncached.set([10, 0]);
    est.ahead.set([0, 10]);
    est.cost.set([1, 0]);
    return { model, est };
  }
  const out = (): SloChoice => ({ at: -1, meets: false, predicted: false });

  it('takes the fast rank when only its pair meets the TTFT objective, though the slow one holds the prompt', () => {
    const { model, est } = taught();
    // Rank 0: 40 ms + 10 ms decode part = 50 ms; rank 1: 160 ms + 10 ms. Objective 150 ms (120 ms with headroom).
    const choice = choosePrefill(model, est, 2, { ttft: 0.15, tpot: 0, decodeWait: 0.01, predictedTpot: NaN }, 1, out());
    expect(choice).toEqual({ at: 0, meets: true, predicted: true });
    expect(est.ttft[0]).toBeCloseTo(0.05, 2);
    expect(est.ttft[1]).toBeCloseTo(0.17, 2);
  });

  it('prefers the cache hit among pairs that meet the objectives, and the least bad when none does', () => {
    const { model, est } = taught();
    expect(choosePrefill(model, est, 2, { ttft: 1, tpot: 0, decodeWait: 0.01, predictedTpot: NaN }, 0, out())).toEqual({ at: 1, meets: true, predicted: true });
    // The decode rank's part alone breaks a 40 ms objective: rank 0 is the least bad.
    expect(choosePrefill(model, est, 2, { ttft: 0.04, tpot: 0, decodeWait: 0.03, predictedTpot: NaN }, 1, out())).toEqual({ at: 0, meets: false, predicted: true });
    // The decode rank's TPOT breaks its objective whichever prefill rank: the TTFT still decides.
    expect(choosePrefill(model, est, 2, { ttft: 0.15, tpot: 0.01, decodeWait: 0.01, predictedTpot: 0.02 }, 1, out())).toEqual({ at: 0, meets: false, predicted: true });
  });

  it('leaves the policy its choice without objectives', () => {
    const { model, est } = taught();
    expect(choosePrefill(model, est, 2, { ttft: 0, tpot: 0, decodeWait: 0.01, predictedTpot: NaN }, 1, out()).at).toBe(1);
  });
});
