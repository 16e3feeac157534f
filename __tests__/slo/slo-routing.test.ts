import { describe, expect, it } from '@jest/globals';
import { metricValue, startGateway } from '../helpers/app';
import { closedAfterEach } from '../helpers/lifecycle';
import { startTimedUpstream, streamCompletion } from './timed-upstream';

const started = closedAfterEach();

/**
 * Four ranks, 2 and 3 at a quarter of 0 and 1's speed: a token every 10 ms on a fast rank
 * alone, every 40 ms on a slow one; first tokens after 30 ms and 120 ms. An objective of
 * 25 ms per token is met on the fast ranks only (10 ms, up to 15 ms with two streams there).
 */
const SPEEDS = [1, 1, 0.25, 0.25];
const TIMING = { speeds: SPEEDS, ttftMs: 30, tokenMs: 10, slowdown: 0.25 };

/** Distinct prompts (no shared prefix: the cache plays no part). */
function prompt(i: number, who = 'x'): string {
  return `${who} request ${i}: ${'lorem ipsum '.repeat(20)} ${i * 7919}`;
}

/** Enough streams over every rank for the model to warm up (16 first tokens, 16 streams of 8+ tokens). */
async function warmUp(url: string, count = 40): Promise<void> {
  for (let i = 0; i < count; i += 4) {
    await Promise.all([0, 1, 2, 3].map((j) => streamCompletion(url, prompt(i + j, 'warm'), 10)));
  }
}

describe('SLO-aware routing', () => {
  it('sends requests with a TPOT objective to the ranks that meet it, learned from the streams', async () => {
    const upstream = await startTimedUpstream(TIMING);
    started.push(upstream);
    const gateway = await startGateway({
      upstreams: [{ url: upstream.url, name: 'u', dataParallelSize: 4 }],
      policy: 'prefix-aware',
      exposeDecision: true,
      slo: { trust: true },
    });
    started.push(gateway);
    await warmUp(gateway.url);
    // Every rank took some of the warm-up: the model has seen the slow ones too.
    for (const served of upstream.served) expect(served).toBeGreaterThan(0);
    const ranks: number[] = [];
    let predicted = 0;
    for (let i = 0; i < 16; i++) {
      const answer = await streamCompletion(gateway.url, prompt(i, 'interactive'), 10, { 'x-slo-tpot-ms': '25' });
      expect(answer.status).toBe(200);
      ranks.push(answer.rank);
      if (/predicted_ttft_ms=\d+/.test(answer.decision)) predicted++;
    }
    expect(predicted).toBe(16);
    const onFast = ranks.filter((rank) => SPEEDS[rank] === 1).length;
    expect(onFast).toBeGreaterThanOrEqual(15);
    const met = await metricValue(gateway.registry, 'dp_router_slo_requests_total', { outcome: 'met' });
    expect(met).toBeGreaterThanOrEqual(14);
  });

  it('without objectives leaves the policy its choice: requests spread over every rank', async () => {
    const upstream = await startTimedUpstream(TIMING);
    started.push(upstream);
    const gateway = await startGateway({ upstreams: [{ url: upstream.url, name: 'u', dataParallelSize: 4 }], policy: 'prefix-aware', exposeDecision: true, slo: {} });
    started.push(gateway);
    await warmUp(gateway.url);
    const before = [...upstream.served];
    await Promise.all([0, 1, 2, 3, 4, 5, 6, 7].map((i) => streamCompletion(gateway.url, prompt(i, 'batch'), 10)));
    const slow = upstream.served[2] - before[2] + upstream.served[3] - before[3];
    expect(slow).toBeGreaterThan(0);
  });

  it('ignores and removes the objective headers of an untrusted caller', async () => {
    const upstream = await startTimedUpstream(TIMING);
    started.push(upstream);
    const gateway = await startGateway({ upstreams: [{ url: upstream.url, name: 'u', dataParallelSize: 4 }], policy: 'prefix-aware', exposeDecision: true, slo: { shed: true } });
    started.push(gateway);
    await warmUp(gateway.url);
    // An objective of 1 ms cannot be met anywhere: shed, if it were honoured.
    const answer = await streamCompletion(gateway.url, prompt(1, 'untrusted'), 4, { 'x-slo-ttft-ms': '1' });
    expect(answer.status).toBe(200);
    expect(await metricValue(gateway.registry, 'dp_router_slo_requests_total', { outcome: 'shed' })).toBe(0);
    const forwarded = upstream.headers[upstream.headers.length - 1];
    expect(forwarded['x-slo-ttft-ms']).toBeUndefined();
  });

  it('one client whose streams on rank 0 run eight times slower does not move where the others’ objectives are met', async () => {
    // The hostile client (x-api-key: evil) sees rank 0 eight times slower, as if it could fake its own timings there.
    // Tokens every 20 ms on a fast rank alone (80 ms on a slow one): margins that hold on a loaded machine.
    const upstream = await startTimedUpstream({ ...TIMING, tokenMs: 20, slowFor: (req) => req.headers['x-api-key'] === 'evil', hostileRank: 0, hostileFactor: 8 });
    started.push(upstream);
    const gateway = await startGateway({ upstreams: [{ url: upstream.url, name: 'u', dataParallelSize: 4 }], policy: 'prefix-aware', exposeDecision: true, slo: { trust: true } });
    started.push(gateway);
    // As much traffic from the hostile client as from the three honest ones together.
    for (let i = 0; i < 96; i += 8) {
      await Promise.all(
        [0, 1, 2, 3, 4, 5, 6, 7].map((j) => {
          const key = j % 2 === 0 ? 'evil' : `honest-${(j - 1) / 2 % 3}`;
          return streamCompletion(gateway.url, prompt(i + j, key), 10, { 'x-api-key': key });
        }),
      );
    }
    expect(upstream.served[0]).toBeGreaterThan(8);
    const ranks: number[] = [];
    // 48 ms: met on a fast rank (20 ms a token alone, 25 ms with another stream), not on a slow one
    // (80 ms). The fast ranks' predictions, 20–23 ms on an idle machine, read up to 28 ms on a loaded
    // one; within the headroom (0.8 × 48 = 38.4 ms) they stay candidates (at 36 ms, 28.8, rank 0 fell
    // out in a full CI-like run and took none).
    for (let i = 0; i < 12; i++) ranks.push((await streamCompletion(gateway.url, prompt(i, 'interactive'), 10, { 'x-slo-tpot-ms': '48', 'x-api-key': 'honest-0' })).rank);
    // Rank 0 meets the objective for everyone but the hostile client: it keeps taking interactive requests
    // (the pooled view, the hostile client's third of the weight at up to 4 × the prediction, puts it at
    // ~61 ms, past the objective: with every rank's speed pooled, rank 0 took none of the twelve).
    expect(ranks.filter((rank) => rank === 0).length).toBeGreaterThanOrEqual(4);
    expect(ranks.every((rank) => SPEEDS[rank] === 1)).toBe(true);
    // About 25 s alone (the streams' timing is the test's); more on a loaded machine.
  }, 90_000);

  it('sheds with 503 and Retry-After when no rank can meet the objectives, before anything goes upstream', async () => {
    const upstream = await startTimedUpstream(TIMING);
    started.push(upstream);
    const gateway = await startGateway({ upstreams: [{ url: upstream.url, name: 'u', dataParallelSize: 4 }], policy: 'prefix-aware', slo: { trust: true, shed: true } });
    started.push(gateway);
    await warmUp(gateway.url);
    const before = upstream.served.reduce((a, b) => a + b, 0);
    const answer = await fetch(`${gateway.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-slo-ttft-ms': '1' },
      body: JSON.stringify({ model: 'm', prompt: prompt(1, 'shed'), max_tokens: 4, stream: true }),
    });
    expect(answer.status).toBe(503);
    expect(Number(answer.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    expect((await answer.json()) as object).toMatchObject({ error: { type: 'ServiceUnavailableError', code: 503 } });
    expect(upstream.served.reduce((a, b) => a + b, 0)).toBe(before);
    expect(await metricValue(gateway.registry, 'dp_router_slo_requests_total', { outcome: 'shed' })).toBe(1);
  });
});
