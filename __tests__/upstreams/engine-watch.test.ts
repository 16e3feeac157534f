import { describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { startMockVllm, type MockVllm } from '../../example-server/mock-vllm';
import { metricValue, parseExposition, startGateway, sumSamples, type TestGateway } from '../helpers/app';
import { closedAfterEach } from '../helpers/lifecycle';
import { waitFor } from '../helpers/wait';

const started = closedAfterEach();

/** The polls of `/metrics` that reached the mock, by its own log. */
const polls = (mock: MockVllm) => mock.stats().requests.filter((seen) => seen.path === '/metrics').length;

/**
 * Resolves once a poll sent after this call has been applied: polls are serial, so the second
 * one to arrive from now on was sent after the first ended.
 */
async function pollApplied(mock: MockVllm, timeoutMs = 5000): Promise<void> {
  const before = polls(mock);
  await waitFor(() => polls(mock) >= before + 2, timeoutMs);
}

const completion = (gateway: TestGateway) =>
  request(gateway.url).post('/v1/completions').send({ model: 'mock-model', prompt: 'hi', max_tokens: 1 });

describe('rank discovery', () => {
  it("learns the ranks from the engine labels of the upstream's /metrics and routes to them", async () => {
    const mock = await startMockVllm({ dataParallelSize: 4, startRank: 4 });
    started.push(mock);
    const warnings: string[] = [];
    const notices: string[] = [];
    {
      const gateway = await startGateway({
        upstreams: [{ url: mock.url, name: 'node-b', discover: { intervalMs: 50 } }],
        policy: 'round-robin',
        logger: { warn: (message) => warnings.push(message), info: (_fields, message) => notices.push(message) },
      });
      started.push(gateway);
      await waitFor(() => gateway.router.endpoints().length === 4);
      expect(gateway.router.endpoints().map((endpoint) => endpoint.rank)).toEqual([4, 5, 6, 7]);
      const served = new Set<string>();
      for (let index = 0; index < 8; index++) {
        const answer = await completion(gateway);
        expect(answer.status).toBe(200);
        served.add(answer.body.choices[0].text.slice(5, 6));
      }
      expect([...served].sort()).toEqual(['4', '5', '6', '7']);
      const samples = parseExposition((await request(gateway.url).get('/metrics')).text);
      expect(sumSamples(samples, 'dp_router_requests_total', { rank: '0' })).toBe(0);
      expect(samples.some((sample) => sample.name === 'dp_router_requests_total' && sample.labels.rank === '0')).toBe(false);
      expect(sumSamples(samples, 'dp_router_requests_total', { upstream: 'node-b' })).toBe(8);
      // Three more polls of the same report: none says so again. (`discover` also reads the
      // models the server lists, and says so once.) Routine news, at info (48.16).
      const before = polls(mock);
      await waitFor(() => polls(mock) >= before + 3);
      expect(warnings).toEqual([]);
      expect(notices).toEqual([
        "express-dp-router: upstream 'node-b' serves ranks 4, 5, 6, 7 by its /metrics (was: 0); routing to those now.",
        "express-dp-router: upstream 'node-b' serves mock-model by its /v1/models; routing those models to it.",
      ]);
    }
  });

  it('48.3: narrows the ranks a `ranks` option lists to those served, never widening past them', async () => {
    const wide = await startMockVllm({ dataParallelSize: 8 });
    started.push(wide);
    const warnings: string[] = [];
    const gateway = await startGateway({
      upstreams: [{ url: wide.url, name: 'node', dataParallelSize: 8, ranks: [0, 2, 4, 6], discover: { intervalMs: 30 } }],
      policy: 'round-robin',
      logger: { warn: (message) => warnings.push(message), info: (_fields, message) => warnings.push(message) },
    });
    started.push(gateway);
    // Several polls of a server that serves all eight: still the four listed.
    await pollApplied(wide);
    await pollApplied(wide);
    expect(gateway.router.endpoints().map((endpoint) => endpoint.rank)).toEqual([0, 2, 4, 6]);
    const served = new Set<string>();
    for (let index = 0; index < 8; index++) served.add((await completion(gateway)).body.choices[0].text.slice(5, 6));
    expect([...served].sort()).toEqual(['0', '2', '4', '6']);
    expect(warnings.filter((warning) => warning.includes('by its /metrics'))).toEqual([]);
    // Restarted with four engines: of the listed ranks, those it serves.
    await wide.close();
    const narrow = await startMockVllm({ dataParallelSize: 4, port: Number(new URL(wide.url).port) });
    started.push(narrow);
    await waitFor(() => gateway.router.endpoints().length === 2);
    expect(gateway.router.endpoints().map((endpoint) => endpoint.rank)).toEqual([0, 2]);
    expect(warnings.filter((warning) => warning.includes('by its /metrics'))).toEqual([
      "express-dp-router: upstream 'node' serves ranks 0, 1, 2, 3 by its /metrics (was: 0, 2, 4, 6); routing to 0, 2 of them now (its `ranks`).",
    ]);
    // Back to eight: the listed four again, not eight.
    await narrow.close();
    const again = await startMockVllm({ dataParallelSize: 8, port: Number(new URL(wide.url).port) });
    started.push(again);
    await waitFor(() => gateway.router.endpoints().length === 4);
    await pollApplied(again);
    expect(gateway.router.endpoints().map((endpoint) => endpoint.rank)).toEqual([0, 2, 4, 6]);
  });

  it('keeps the configured ranks while the upstream cannot be read, counting the failures', async () => {
    const mock = await startMockVllm({ dataParallelSize: 2 });
    started.push(mock);
    mock.fault = { kind: 'status', status: 500 };
    const gateway = await startGateway({ upstreams: [{ url: mock.url, name: 'node-a', dataParallelSize: 2, discover: { intervalMs: 20 } }] });
    started.push(gateway);
    await waitFor(async () => (await metricValue(gateway.registry, 'dp_router_upstream_scrape_failures_total', { upstream: 'node-a' })) >= 2);
    expect(gateway.router.endpoints().map((endpoint) => endpoint.rank)).toEqual([0, 1]);
  });

  it('takes a rank that disappears out of rotation', async () => {
    const wide = await startMockVllm({ dataParallelSize: 4 });
    started.push(wide);
    const gateway = await startGateway({ upstreams: [{ url: wide.url, name: 'node', dataParallelSize: 4, discover: { intervalMs: 30 } }] });
    started.push(gateway);
    await waitFor(() => gateway.router.endpoints().length === 4);
    // The same server now reports two engines only, as after a restart with a smaller size.
    await wide.close();
    const narrow = await startMockVllm({ dataParallelSize: 2, port: Number(new URL(wide.url).port) });
    started.push(narrow);
    await waitFor(() => gateway.router.endpoints().length === 2);
    for (let index = 0; index < 6; index++) expect(['0', '1']).toContain((await completion(gateway)).body.choices[0].text.slice(5, 6));
  });
});

describe('load feedback', () => {
  /**
   * Keeps `count` requests running on `rank` directly at the mock, bypassing the gateway, until
   * released: they ask for more tokens than any test waits for, so that a slow machine cannot let
   * them finish while the test still counts on them.
   */
  function occupy(mock: MockVllm, rank: number, count: number): { release: () => Promise<void> } {
    const abort = new AbortController();
    const requests = Array.from({ length: count }, () =>
      fetch(`${mock.url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-data-parallel-rank': String(rank) },
        body: JSON.stringify({ model: 'mock-model', prompt: 'batch job', max_tokens: 4000 }),
        signal: abort.signal,
      }).then((answer) => answer.text()).catch(() => undefined),
    );
    return {
      release: async () => {
        abort.abort();
        await Promise.all(requests);
        await waitFor(() => mock.stats().perRank[rank].running === 0);
      },
    };
  }

  async function ranksChosen(gateway: TestGateway, count: number): Promise<string[]> {
    const ranks: string[] = [];
    for (let index = 0; index < count; index++) {
      const answer = await request(gateway.url).post('/v1/completions').send({ model: 'mock-model', prompt: 'hi', max_tokens: 1 });
      ranks.push(answer.body.choices[0].text.slice(5, 6));
    }
    return ranks;
  }

  it('steers away from a rank that other clients keep busy, which local counts cannot see', async () => {
    const mock = await startMockVllm({ dataParallelSize: 4, decodeMsPerToken: 25 });
    started.push(mock);
    const blind = await startGateway({ upstreams: [{ url: mock.url, dataParallelSize: 4 }] });
    const informed = await startGateway({ upstreams: [{ url: mock.url, dataParallelSize: 4 }], loadFeedback: { intervalMs: 20, weight: 1 } });
    started.push(blind, informed);
    const batch = occupy(mock, 0, 6);
    await waitFor(() => mock.stats().perRank[0].running === 6);
    await pollApplied(mock);
    expect((await ranksChosen(blind, 8)).filter((rank) => rank === '0')).toHaveLength(2);
    expect((await ranksChosen(informed, 8)).filter((rank) => rank === '0')).toHaveLength(0);
    await batch.release();
  });

  it('falls back to local counts when a poll fails, and counts it', async () => {
    const mock = await startMockVllm({ dataParallelSize: 2, decodeMsPerToken: 25 });
    started.push(mock);
    // A timeout a loaded machine's own polls stay within, and an interval the four requests below fit in.
    const gateway = await startGateway({ upstreams: [{ url: mock.url, name: 'm', dataParallelSize: 2 }], loadFeedback: { intervalMs: 1000, timeoutMs: 250, weight: 1 } });
    started.push(gateway);
    const failures = () => metricValue(gateway.registry, 'dp_router_upstream_scrape_failures_total', { upstream: 'm' });
    const batch = occupy(mock, 0, 4);
    await waitFor(() => mock.stats().perRank[0].running === 4);
    await pollApplied(mock);
    expect(await ranksChosen(gateway, 4)).toEqual(['1', '1', '1', '1']);

    // The failure counted must be the stalled poll's, the last before the next one.
    const before = await failures();
    const seen = polls(mock);
    mock.fault = { kind: 'stall' };
    await waitFor(() => polls(mock) > seen, 3000);
    mock.fault = undefined;
    await waitFor(async () => (await failures()) > before, 2000);
    expect(await failures()).toBe(before + 1);
    // Until the next poll, 1 s on, only this gateway's own (idle) counts steer.
    expect((await ranksChosen(gateway, 4)).sort()).toEqual(['0', '0', '1', '1']);
    await batch.release();
  });
});
