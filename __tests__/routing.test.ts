import { describe, expect, it } from '@jest/globals';
import { request as httpRequest } from 'node:http';
import request from 'supertest';
import { startEchoUpstream, type EchoUpstream } from './helpers/echo-upstream';
import { metricValue, parseExposition, startGateway } from './helpers/app';
import { closedAfterEach } from './helpers/lifecycle';
import { waitFor } from './helpers/wait';

const started = closedAfterEach();

async function upstreams(count: number): Promise<EchoUpstream[]> {
  const servers = await Promise.all(Array.from({ length: count }, () => startEchoUpstream()));
  started.push(...servers);
  return servers;
}

describe('setUpstreams', () => {
  it('swaps the upstreams without dropping a request in flight, and removes the old series', async () => {
    const [a, b] = await upstreams(2);
    let finishA: () => void = () => undefined;
    a.respond = (_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: 1\n\n');
      finishA = () => res.end('data: [DONE]\n\n');
    };
    const gateway = await startGateway({ upstreams: [{ url: a.url, name: 'a', dataParallelSize: 2 }] });
    started.push(gateway);

    const inFlight = new Promise<string>((resolve, reject) => {
      const outgoing = httpRequest(`${gateway.url}/v1/completions`, { method: 'POST' }, (response) => {
        let text = '';
        response.setEncoding('utf8');
        response.on('data', (chunk: string) => (text += chunk));
        response.on('end', () => resolve(text));
      });
      outgoing.on('error', reject);
      outgoing.end('{}');
    });
    await waitFor(() => a.seen.length > 0);

    gateway.router.setUpstreams([{ url: b.url, name: 'b', dataParallelSize: 2, startRank: 2 }]);
    expect(gateway.router.endpoints().map(({ upstream, rank }) => `${upstream}#${rank}`)).toEqual(['b#2', 'b#3']);
    for (let index = 0; index < 4; index++) expect((await request(gateway.url).post('/v1/completions').send({})).status).toBe(200);
    // rankHeader 'local' (the default): ranks 2 and 3 of a server starting at 2 are its engines 0 and 1.
    expect(b.seen.map((seen) => seen.rankHeaders[0]).sort()).toEqual(['0', '0', '1', '1']);

    finishA();
    expect(await inFlight).toBe('data: 1\n\ndata: [DONE]\n\n');
    const samples = parseExposition((await request(gateway.url).get('/metrics')).text);
    expect(samples.filter((sample) => sample.labels.upstream === 'a')).toEqual([]);
    expect(await metricValue(gateway.registry, 'dp_router_requests_total', { upstream: 'b' })).toBe(4);
    expect(await metricValue(gateway.registry, 'dp_router_inflight_requests')).toBe(0);
  });

  it('keeps the counts and health of endpoints that stay', async () => {
    const [a, b] = await upstreams(2);
    a.respond = (_req, res) => setTimeout(() => res.end('{}'), 150);
    const gateway = await startGateway({ upstreams: [{ url: a.url, name: 'a' }] });
    started.push(gateway);
    const pending = Promise.all([request(gateway.url).post('/').send({}), request(gateway.url).post('/').send({})]);
    await waitFor(() => a.seen.length >= 2);
    gateway.router.setUpstreams([{ url: a.url, name: 'a' }, { url: b.url, name: 'b' }]);
    expect(gateway.router.endpoints()).toEqual([
      { upstream: 'a', rank: 0, inflight: 2, healthy: true },
      { upstream: 'b', rank: 0, inflight: 0, healthy: true },
    ]);
    // Least-outstanding now fills the new, idle endpoint first.
    await request(gateway.url).post('/').send({});
    expect(b.seen).toHaveLength(1);
    await pending;
    expect(gateway.router.endpoints().map((endpoint) => endpoint.inflight)).toEqual([0, 0]);
  });

  it('rejects a wrong list with a TypeError and changes nothing', async () => {
    const [a] = await upstreams(1);
    const gateway = await startGateway({ upstreams: [{ url: a.url, name: 'a', dataParallelSize: 2 }] });
    started.push(gateway);
    expect(() => gateway.router.setUpstreams([])).toThrow(TypeError);
    expect(() => gateway.router.setUpstreams([{ url: 'ftp://x' }])).toThrow(/`upstreams\[0\]\.url` must be an http: or https: URL/);
    expect(gateway.router.endpoints()).toHaveLength(2);
    expect((await request(gateway.url).post('/').send({})).status).toBe(200);
  });
});
