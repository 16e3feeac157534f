import { describe, expect, it } from '@jest/globals';
import { startMockVllm, type MockVllmOptions } from '../../example-server/mock-vllm';
import { closedAfterEach, metricValue, startGateway } from '../helpers';

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

async function pd() {
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
    slo: { trust: true },
  });
  started.push(gateway);
  return gateway;
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
    const gateway = await pd();
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

  it('without objectives leaves the prefill policy its choice: both prefill ranks keep serving', async () => {
    const gateway = await pd();
    await warmUp(gateway.url);
    const prefills = [0, 0];
    for (let i = 0; i < 8; i += 2) {
      for (const answer of await Promise.all([0, 1].map((j) => stream(gateway.url, prompt(i + j, 'batch'))))) prefills[answer.prefill]++;
    }
    expect(prefills[1]).toBeGreaterThan(0);
  });
});
