import { afterEach, describe, expect, it } from '@jest/globals';
import type { Options } from '../../lib';
import { allIdle, type EchoUpstream, echoUpstreams, exchange, metricValue, type RestartableVllm, sleep, startGateway, startRestartableVllm, type TestGateway, waitFor } from '../helpers';
import { clientOf } from '../../lib/upstreams/outlier-detector';

let gateway: TestGateway | undefined;

afterEach(async () => {
  await gateway?.close();
  gateway = undefined;
});

const echo = echoUpstreams();
const mocks: RestartableVllm[] = [];
afterEach(async () => {
  await Promise.all(mocks.splice(0).map((mock) => mock.close()));
});

const failWith = (status: number) => (_req: unknown, res: import('node:http').ServerResponse) => {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify({ error: { message: 'no', type: 'X', param: null, code: status } }));
};

function pair(a: EchoUpstream, b: EchoUpstream, outlierDetection: Options['outlierDetection'], extra: Partial<Options> = {}): Options {
  return {
    upstreams: [
      { url: a.url, name: 'a' },
      { url: b.url, name: 'b' },
    ],
    policy: 'round-robin',
    retries: false,
    outlierDetection,
    ...extra,
  };
}

const healthyGauge = (gateway: TestGateway, upstream: string) => metricValue(gateway.registry, 'dp_router_endpoint_healthy', { upstream });

// The tests of this block send from one client address; `minimumClients: 1` makes every
// request failure count, as in a deployment whose clients all come through one address.
describe('passive outlier ejection', () => {
  it('ejects after consecutive 5xx, shows it in dp_router_endpoint_healthy, and lets one trial bring it back', async () => {
    const a = await echo();
    const b = await echo();
    a.respond = failWith(500);
    gateway = await startGateway(pair(a, b, { consecutiveFailures: 3, baseEjectionMs: 300, minimumClients: 1 }));
    const statuses: number[] = [];
    for (let index = 0; index < 12; index++) statuses.push((await exchange(gateway.url)).status);
    // The 5xx is passed through unchanged; after the third the endpoint is out of rotation.
    expect(statuses.filter((status) => status === 500)).toHaveLength(3);
    expect(a.seen).toHaveLength(3);
    expect(await healthyGauge(gateway, 'a')).toBe(0);
    expect(await healthyGauge(gateway, 'b')).toBe(1);
    expect(gateway.router.endpoints().find((endpoint) => endpoint.upstream === 'a')?.healthy).toBe(false);

    a.respond = undefined;
    await waitFor(async () => (await healthyGauge(gateway!, 'a')) === 1, 3000);
    for (let index = 0; index < 4; index++) expect((await exchange(gateway.url)).status).toBe(200);
    expect(a.seen.length).toBeGreaterThan(3);
    expect(await healthyGauge(gateway, 'a')).toBe(1);
  });

  it('never counts a 4xx against the endpoint: it is the request that is wrong', async () => {
    const a = await echo();
    const b = await echo();
    a.respond = failWith(400);
    gateway = await startGateway(pair(a, b, { consecutiveFailures: 1, minimumClients: 1 }));
    for (let index = 0; index < 10; index++) await exchange(gateway.url);
    expect(a.seen).toHaveLength(5);
    expect(await healthyGauge(gateway, 'a')).toBe(1);
    expect(await metricValue(gateway.registry, 'dp_router_upstream_errors_total')).toBe(0);
  });

  it('resets the count on a success: only consecutive failures eject', async () => {
    const a = await echo();
    const b = await echo();
    let calls = 0;
    a.respond = (req, res, body) => (++calls % 2 === 0 ? failWith(503)(req, res) : (res.writeHead(200), res.end(body)));
    gateway = await startGateway(pair(a, b, { consecutiveFailures: 2, minimumClients: 1 }));
    for (let index = 0; index < 20; index++) await exchange(gateway.url);
    expect(a.seen).toHaveLength(10);
    expect(await healthyGauge(gateway, 'a')).toBe(1);
    expect(await metricValue(gateway.registry, 'dp_router_upstream_errors_total', { kind: 'status_5xx' })).toBe(5);
  });

  it('re-ejects for twice as long when the half-open trial fails', async () => {
    const a = await echo();
    const b = await echo();
    a.respond = failWith(502);
    gateway = await startGateway(pair(a, b, { consecutiveFailures: 1, baseEjectionMs: 300, minimumClients: 1 }));
    await exchange(gateway.url); // a: ejected for 300 ms
    expect(await healthyGauge(gateway, 'a')).toBe(0);
    await waitFor(async () => (await healthyGauge(gateway!, 'a')) === 1, 2000);
    const reEjected = Date.now();
    // The trial: round-robin reaches a within two requests.
    await exchange(gateway.url);
    await exchange(gateway.url);
    expect(a.seen).toHaveLength(2);
    expect(await healthyGauge(gateway, 'a')).toBe(0);
    await sleep(400 - (Date.now() - reEjected));
    expect(await healthyGauge(gateway, 'a')).toBe(0); // 600 ms this time, not 300
    await waitFor(async () => (await healthyGauge(gateway!, 'a')) === 1, 2000);
  });

  it('sends exactly one trial request to a half-open endpoint at a time', async () => {
    const a = await echo();
    const b = await echo();
    a.respond = failWith(500);
    gateway = await startGateway(pair(a, b, { consecutiveFailures: 1, baseEjectionMs: 100, minimumClients: 1 }, { policy: 'least-outstanding' }));
    await exchange(gateway.url);
    await exchange(gateway.url);
    expect(a.seen).toHaveLength(1);
    await waitFor(async () => (await healthyGauge(gateway!, 'a')) === 1, 2000);
    let release: () => void = () => undefined;
    a.respond = (_req, res) => (release = () => res.end('{}'));
    b.respond = (_req, res) => setTimeout(() => res.end('{}'), 100);
    const burst = Promise.all(Array.from({ length: 8 }, () => exchange(gateway!.url)));
    await waitFor(() => b.seen.length >= 7);
    expect(a.seen).toHaveLength(2);
    release();
    expect((await burst).every((answer) => answer.status === 200)).toBe(true);
    expect(await healthyGauge(gateway, 'a')).toBe(1);
    await waitFor(() => allIdle(gateway!));
  });

  it('ejects for request failures at most maxEjectionPercent of the endpoints, and never the last one in rotation', async () => {
    const a = await echo();
    a.respond = failWith(500);
    gateway = await startGateway({ upstreams: [{ url: a.url, name: 'a', dataParallelSize: 4 }], outlierDetection: { consecutiveFailures: 1, maxEjectionPercent: 50, minimumClients: 1 }, retries: false });
    for (let index = 0; index < 12; index++) expect((await exchange(gateway.url)).status).toBe(500);
    expect(gateway.router.endpoints().filter((endpoint) => !endpoint.healthy)).toHaveLength(2);
    await gateway.close();

    gateway = await startGateway({ upstreams: [{ url: a.url, name: 'a' }], outlierDetection: { consecutiveFailures: 1, maxEjectionPercent: 100, minimumClients: 1 }, retries: false });
    for (let index = 0; index < 5; index++) expect((await exchange(gateway.url)).status).toBe(500);
    expect(gateway.router.endpoints()[0].healthy).toBe(true);
  });

  it('counts first-byte timeouts as request failures too', async () => {
    const a = await echo();
    const b = await echo();
    a.respond = () => undefined; // stalls
    gateway = await startGateway(pair(a, b, { consecutiveFailures: 2, minimumClients: 1 }, { timeouts: { firstByteMs: 80 } }));
    const statuses: number[] = [];
    for (let index = 0; index < 8; index++) statuses.push((await exchange(gateway.url)).status);
    expect(statuses.filter((status) => status === 504)).toHaveLength(2);
    expect(await healthyGauge(gateway, 'a')).toBe(0);
    expect(await metricValue(gateway.registry, 'dp_router_upstream_errors_total', { upstream: 'a', kind: 'timeout' })).toBe(2);
  });

  it('is off with outlierDetection: false', async () => {
    const a = await echo();
    const b = await echo();
    a.respond = failWith(500);
    gateway = await startGateway(pair(a, b, false));
    for (let index = 0; index < 20; index++) await exchange(gateway.url);
    expect(a.seen).toHaveLength(10);
    expect(await healthyGauge(gateway, 'a')).toBe(1);
  });
});

describe('a dead server: connection failures', () => {
  it('takes every rank of a server that refuses connections out together, answers 503 at once, and lets a trial bring it back', async () => {
    const mock = await startRestartableVllm({ dataParallelSize: 2 });
    mocks.push(mock);
    gateway = await startGateway({
      upstreams: [{ url: mock.url, name: 'm', dataParallelSize: 2 }],
      policy: 'round-robin',
      retries: false,
      outlierDetection: { consecutiveFailures: 3, baseEjectionMs: 200 },
    });
    expect((await exchange(gateway.url)).status).toBe(200);
    await mock.kill();
    const answers = [];
    for (let index = 0; index < 8; index++) answers.push(await exchange(gateway.url));
    // Three failed connections, spread over both ranks, are evidence about the one server behind
    // them: both ranks leave together, whatever maxEjectionPercent says, and with no endpoint
    // left the router says so at once.
    expect(answers.map((answer) => answer.status)).toEqual([502, 502, 502, 503, 503, 503, 503, 503]);
    expect(JSON.parse(answers[7].body)).toEqual({ error: { message: expect.any(String), type: 'ServiceUnavailableError', param: null, code: 503 } });
    expect(await healthyGauge(gateway, 'm')).toBe(0);
    expect(gateway.router.endpoints().map((endpoint) => endpoint.healthy)).toEqual([false, false]);
    expect(await metricValue(gateway.registry, 'dp_router_upstream_errors_total', { upstream: 'm' })).toBe(3);

    await mock.restart();
    // After the cool-down one trial goes through; its answer brings both ranks back.
    await waitFor(async () => (await exchange(gateway!.url)).status === 200, 3000);
    expect(gateway.router.endpoints().map((endpoint) => endpoint.healthy)).toEqual([true, true]);
    expect(await healthyGauge(gateway, 'm')).toBe(2);
  });

  it('ejects the server, not the ranks one by one, and keeps the other server in rotation', async () => {
    const a = await echo();
    const dead = await startRestartableVllm({ dataParallelSize: 2, startRank: 2 });
    mocks.push(dead);
    await dead.kill();
    gateway = await startGateway({
      upstreams: [
        { url: a.url, name: 'a', dataParallelSize: 2 },
        { url: dead.url, name: 'dead', dataParallelSize: 2, startRank: 2 },
      ],
      policy: 'round-robin',
      outlierDetection: { consecutiveFailures: 2, baseEjectionMs: 10_000 },
    });
    // Retries carry the refused requests to `a`: nobody sees the dead server.
    for (let index = 0; index < 12; index++) expect((await exchange(gateway.url)).status).toBe(200);
    expect(await healthyGauge(gateway, 'dead')).toBe(0);
    expect(await healthyGauge(gateway, 'a')).toBe(2);
    expect(await metricValue(gateway.registry, 'dp_router_upstream_errors_total', { upstream: 'dead', kind: 'connect' })).toBe(2);
  });

  it('keeps a rank added to an ejected server out with it', async () => {
    const dead = await startRestartableVllm({ dataParallelSize: 2 });
    mocks.push(dead);
    await dead.kill();
    gateway = await startGateway({ upstreams: [{ url: dead.url, name: 'm', dataParallelSize: 2, ranks: [0] }], retries: false, outlierDetection: { consecutiveFailures: 2 } });
    for (let index = 0; index < 2; index++) expect((await exchange(gateway.url)).status).toBe(502);
    gateway.router.setUpstreams([{ url: dead.url, name: 'm', dataParallelSize: 2 }]);
    expect(gateway.router.endpoints().map((endpoint) => endpoint.healthy)).toEqual([false, false]);
    expect((await exchange(gateway.url)).status).toBe(503);
  });
});

describe('what one client provokes', () => {
  /** Four ranks of one echo upstream; a body containing `poison` makes the engine answer 500. */
  async function poisonable(outlierDetection: Options['outlierDetection'] = undefined) {
    const upstream = await echo();
    upstream.respond = (req, res, body) => {
      const status = body.includes('poison') ? 500 : 200;
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ rank: req.headers['x-data-parallel-rank'] }));
    };
    gateway = await startGateway({ upstreams: [{ url: upstream.url, name: 'a', dataParallelSize: 4 }], policy: 'round-robin', retries: false, outlierDetection });
    return upstream;
  }

  it('does not let one client evict endpoints with requests that make the engine fail', async () => {
    await poisonable();
    for (let index = 0; index < 40; index++) {
      const answer = await exchange(gateway!.url, { localAddress: '127.0.0.2', body: '{"prompt":"poison"}' });
      expect(answer.status).toBe(500);
    }
    expect(gateway!.router.endpoints().every((endpoint) => endpoint.healthy)).toBe(true);
    expect(await healthyGauge(gateway!, 'a')).toBe(4);
    // The next forty legitimate requests still have all four ranks.
    const ranks = new Map<string, number>();
    for (let index = 0; index < 40; index++) {
      const answer = await exchange(gateway!.url, { body: '{"prompt":"hello"}' });
      expect(answer.status).toBe(200);
      const rank = JSON.parse(answer.body).rank as string;
      ranks.set(rank, (ranks.get(rank) ?? 0) + 1);
    }
    expect([...ranks.values()]).toEqual([10, 10, 10, 10]);
  });

  it('ejects an endpoint whose failure run comes from minimumClients distinct clients', async () => {
    const upstream = await echo();
    // Rank 1 is broken for everyone.
    upstream.respond = (req, res) => {
      const status = req.headers['x-data-parallel-rank'] === '1' ? 500 : 200;
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end('{}');
    };
    gateway = await startGateway({
      upstreams: [{ url: upstream.url, name: 'a', dataParallelSize: 4 }],
      policy: 'round-robin',
      retries: false,
      outlierDetection: { consecutiveFailures: 3, minimumClients: 3 },
    });
    const clients = ['127.0.0.2', '127.0.0.3', '127.0.0.4'];
    // Rank 1 gets every fourth request; the clients take turns, so its failures come from all three.
    for (let index = 0; index < 12; index++) await exchange(gateway.url, { localAddress: clients[index % 3] });
    expect(gateway.router.endpoints().map((endpoint) => endpoint.healthy)).toEqual([true, false, true, true]);
    expect(await metricValue(gateway.registry, 'dp_router_endpoint_healthy', { upstream: 'a', rank: '1' })).toBe(0);
  });

  it('tells clients behind one address apart by their credentials (a verdict for everyone): one key cannot eject, three can, and both are counted', async () => {
    const upstream = await echo();
    upstream.respond = (req, res) => {
      const status = req.headers['x-data-parallel-rank'] === '1' ? 500 : 200;
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end('{}');
    };
    gateway = await startGateway({ upstreams: [{ url: upstream.url, name: 'a', dataParallelSize: 4 }], policy: 'round-robin', retries: false, outlierDetection: { consecutiveFailures: 3, minimumClients: 3 } });
    const verdicts = (outcome: string) => metricValue(gateway!.registry, 'dp_router_verdicts_total', { upstream: 'a', verdict: 'ejection', outcome });
    expect([await verdicts('taken'), await verdicts('refused_single_source')]).toEqual([0, 0]);
    for (let index = 0; index < 24; index++) await exchange(gateway.url, { headers: { authorization: 'Bearer the-only-key' } });
    expect(gateway.router.endpoints().every((endpoint) => endpoint.healthy)).toBe(true);
    expect(await verdicts('refused_single_source')).toBe(1);
    for (let index = 0; index < 12; index++) await exchange(gateway.url, { headers: { 'x-api-key': `key-${index % 3}` } });
    expect(gateway.router.endpoints().map((endpoint) => endpoint.healthy)).toEqual([true, false, true, true]);
    expect(await verdicts('taken')).toBe(1);
  });

  it.each([
    ['127.0.0.1', '127.0.0.1'],
    ['::ffff:10.1.2.3', '10.1.2.3'],
    ['2001:db8:aa:bb:1:2:3:4', '2001:db8:aa:bb'],
    ['2001:db8:aa:bb::9', '2001:db8:aa:bb'],
    ['2001:DB8:0:0::1', '2001:db8:0:0'],
    ['::1', '0:0:0:0'],
  ])('counts client %s as %s (IPv6 by its /64)', (address, client) => {
    expect(clientOf({ socket: { remoteAddress: address } } as never)).toBe(client);
  });
});
