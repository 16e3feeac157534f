import { afterEach, describe, expect, it } from '@jest/globals';
import type { Options } from '../../lib';
import { metricValue, startGateway, type TestGateway } from '../helpers/app';
import type { EchoUpstream } from '../helpers/echo-upstream';
import { allIdle, exchange, sleep, waitFor, echoUpstreams } from './support';

let gateway: TestGateway | undefined;

afterEach(async () => {
  await gateway?.close();
  gateway = undefined;
});

const echo = echoUpstreams();

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

describe('passive outlier ejection', () => {
  it('ejects after consecutive 5xx, shows it in dp_router_endpoint_healthy, and lets one trial bring it back', async () => {
    const a = await echo();
    const b = await echo();
    a.respond = failWith(500);
    gateway = await startGateway(pair(a, b, { consecutiveFailures: 3, baseEjectionMs: 300 }));
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
    gateway = await startGateway(pair(a, b, { consecutiveFailures: 1 }));
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
    gateway = await startGateway(pair(a, b, { consecutiveFailures: 2 }));
    for (let index = 0; index < 20; index++) await exchange(gateway.url);
    expect(a.seen).toHaveLength(10);
    expect(await healthyGauge(gateway, 'a')).toBe(1);
    expect(await metricValue(gateway.registry, 'dp_router_upstream_errors_total', { kind: 'status_5xx' })).toBe(5);
  });

  it('re-ejects for twice as long when the half-open trial fails', async () => {
    const a = await echo();
    const b = await echo();
    a.respond = failWith(502);
    gateway = await startGateway(pair(a, b, { consecutiveFailures: 1, baseEjectionMs: 300 }));
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
    gateway = await startGateway(pair(a, b, { consecutiveFailures: 1, baseEjectionMs: 100 }, { policy: 'least-outstanding' }));
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

  it('ejects at most maxEjectionPercent of the endpoints, and never the last one in rotation', async () => {
    const a = await echo();
    a.respond = failWith(500);
    gateway = await startGateway({ upstreams: [{ url: a.url, name: 'a', dataParallelSize: 4 }], outlierDetection: { consecutiveFailures: 1, maxEjectionPercent: 50 }, retries: false });
    for (let index = 0; index < 12; index++) expect((await exchange(gateway.url)).status).toBe(500);
    expect(gateway.router.endpoints().filter((endpoint) => !endpoint.healthy)).toHaveLength(2);
    await gateway.close();

    gateway = await startGateway({ upstreams: [{ url: a.url, name: 'a' }], outlierDetection: { consecutiveFailures: 1, maxEjectionPercent: 100 }, retries: false });
    for (let index = 0; index < 5; index++) expect((await exchange(gateway.url)).status).toBe(500);
    expect(gateway.router.endpoints()[0].healthy).toBe(true);
  });

  it('counts connect errors and timeouts as failures too', async () => {
    const a = await echo();
    const b = await echo();
    a.respond = () => undefined; // stalls
    gateway = await startGateway(pair(a, b, { consecutiveFailures: 2 }, { timeouts: { firstByteMs: 80 } }));
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
