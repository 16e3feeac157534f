import { afterEach, describe, expect, it } from '@jest/globals';
import { closedAfterEach, type EchoUpstream, echoUpstreams, exchange, type RestartableVllm, startGateway, startRestartableVllm, type TestGateway, waitFor } from '../helpers';

let gateway: TestGateway | undefined;

afterEach(async () => {
  await gateway?.close();
  gateway = undefined;
});

const echo = echoUpstreams();
const started = closedAfterEach();

async function vllm(dataParallelSize: number): Promise<RestartableVllm> {
  const mock = await startRestartableVllm({ dataParallelSize });
  started.push(mock);
  return mock;
}

const probesOf = (upstream: EchoUpstream) => upstream.seen.filter((seen) => seen.url === '/health').length;
/** One probe as its upstream saw it: when it arrived and when the upstream wrote its answer. */
interface TimedProbe {
  arrived: number;
  answered: number;
}

/** Makes `upstream` answer 200 to everything and record, on its own clock, each `/health` probe. */
function timedProbes(upstream: EchoUpstream): TimedProbe[] {
  const probes: TimedProbe[] = [];
  upstream.respond = (req, res) => {
    if (req.url === '/health') probes.push({ arrived: performance.now(), answered: performance.now() });
    res.writeHead(200);
    res.end('{}');
  };
  return probes;
}

/**
 * One probe chain at `intervalMs`: each probe comes at least an interval after the previous one
 * was answered, the only order in which one prober per URL can send them. Probes per rank or per
 * upstream entry would arrive side by side. The 1 ms is the timer clock's granularity (whole ms).
 */
function expectOneProbeChain(probes: readonly TimedProbe[], intervalMs: number): void {
  const gaps = probes.slice(1).map((probe, index) => probe.arrived - probes[index].answered);
  expect(gaps.filter((gap) => gap < intervalMs - 1)).toEqual([]);
}

const healthyOf = (gateway: TestGateway, upstream: string) =>
  gateway.router.endpoints().filter((endpoint) => endpoint.upstream === upstream).map((endpoint) => endpoint.healthy);

describe('active health checks', () => {
  it('probes each upstream URL once per interval, whatever its rank count', async () => {
    const upstream = await echo();
    const probes = timedProbes(upstream);
    gateway = await startGateway({ upstreams: [{ url: upstream.url, name: 'a', dataParallelSize: 8 }], healthCheck: { intervalMs: 50 } });
    await waitFor(() => probes.length >= 4);
    expectOneProbeChain(probes, 50);
    expect(upstream.seen.every((seen) => seen.method === 'GET' && seen.rankHeaders.length === 0)).toBe(true);
  });

  it('shares one probe between upstream entries with the same URL', async () => {
    const upstream = await echo();
    const probes = timedProbes(upstream);
    gateway = await startGateway({
      upstreams: [
        { url: upstream.url, name: 'low', dataParallelSize: 8, ranks: [0, 1] },
        { url: upstream.url, name: 'high', dataParallelSize: 8, ranks: [6, 7] },
      ],
      healthCheck: { intervalMs: 30 },
    });
    await waitFor(() => probes.length >= 3);
    expectOneProbeChain(probes, 30);
  });

  it('takes all ranks of a failing upstream out after unhealthyThreshold probes, and brings them back', async () => {
    const sick = await echo();
    const well = await echo();
    let status = 503;
    sick.respond = (req, res) => {
      res.writeHead(req.url === '/health' ? status : 200);
      res.end('{}');
    };
    gateway = await startGateway({
      upstreams: [
        { url: sick.url, name: 'sick', dataParallelSize: 2 },
        { url: well.url, name: 'well', dataParallelSize: 2, startRank: 2 },
      ],
      healthCheck: { intervalMs: 30, unhealthyThreshold: 2, healthyThreshold: 2 },
    });
    await waitFor(() => healthyOf(gateway!, 'sick').every((healthy) => !healthy));
    expect(healthyOf(gateway, 'well')).toEqual([true, true]);
    const during = await Promise.all(Array.from({ length: 6 }, () => exchange(gateway!.url)));
    expect(during.every((answer) => answer.status === 200)).toBe(true);
    expect(sick.seen.filter((seen) => seen.url !== '/health')).toHaveLength(0);
    status = 200;
    await waitFor(() => healthyOf(gateway!, 'sick').every((healthy) => healthy));
  });

  it('answers 503 in the contract shape when every upstream fails its health check', async () => {
    const sick = await echo();
    sick.respond = (_req, res) => {
      res.writeHead(500);
      res.end();
    };
    gateway = await startGateway({ upstreams: [{ url: sick.url, name: 'sick' }], healthCheck: { intervalMs: 20, unhealthyThreshold: 1 } });
    await waitFor(() => !gateway!.router.endpoints()[0].healthy);
    const answer = await exchange(gateway.url);
    expect(answer.status).toBe(503);
    expect(JSON.parse(answer.body)).toEqual({
      error: { message: expect.any(String), type: 'ServiceUnavailableError', param: null, code: 503 },
    });
  });

  it('fails a probe that does not answer within timeoutMs', async () => {
    const stalled = await echo();
    stalled.respond = () => undefined;
    gateway = await startGateway({ upstreams: [{ url: stalled.url, name: 's' }], healthCheck: { intervalMs: 20, timeoutMs: 50, unhealthyThreshold: 1 } });
    await waitFor(() => !gateway!.router.endpoints()[0].healthy);
  });

  it('follows a killed and restarted vLLM', async () => {
    const mock = await vllm(2);
    gateway = await startGateway({ upstreams: [{ url: mock.url, name: 'm', dataParallelSize: 2 }], healthCheck: { intervalMs: 20, timeoutMs: 200, unhealthyThreshold: 1 } });
    // The second probe is sent only once the first was answered.
    await waitFor(() => mock.current!.stats().requests.filter((seen) => seen.path === '/health').length >= 2);
    expect(healthyOf(gateway, 'm')).toEqual([true, true]);
    await mock.kill();
    await waitFor(() => healthyOf(gateway!, 'm').every((healthy) => !healthy));
    await mock.restart();
    await waitFor(() => healthyOf(gateway!, 'm').every((healthy) => healthy));
    expect((await exchange(gateway.url, { body: '{"model":"mock-model","prompt":"hi","max_tokens":2}' })).status).toBe(200);
  });

  it('brings a server ejected for refused connections back as soon as its probe passes, before the cool-down ends', async () => {
    const mock = await vllm(2);
    gateway = await startGateway({
      upstreams: [{ url: mock.url, name: 'm', dataParallelSize: 2 }],
      retries: false,
      outlierDetection: { consecutiveFailures: 2, baseEjectionMs: 60_000 },
      // Probes alone would take the server out only after many failures: the ejection is the router's own.
      healthCheck: { intervalMs: 20, timeoutMs: 200, unhealthyThreshold: 1000 },
    });
    await mock.kill();
    expect((await exchange(gateway.url)).status).toBe(502);
    expect((await exchange(gateway.url)).status).toBe(502);
    expect(healthyOf(gateway, 'm')).toEqual([false, false]);
    expect((await exchange(gateway.url)).status).toBe(503);
    await mock.restart();
    await waitFor(() => healthyOf(gateway!, 'm').every((healthy) => healthy), 3000);
    expect((await exchange(gateway.url, { body: '{"model":"mock-model","prompt":"hi","max_tokens":2}' })).status).toBe(200);
  });

  it('stops probing on close()', async () => {
    const upstream = await echo();
    gateway = await startGateway({ upstreams: [{ url: upstream.url, name: 'a' }], healthCheck: { intervalMs: 10 } });
    // The clock: a router left running, probing its own upstream at the same interval.
    const witnessUpstream = await echo();
    const witness = await startGateway({ upstreams: [{ url: witnessUpstream.url, name: 'w' }], healthCheck: { intervalMs: 10 } });
    started.push(witness);
    const witnessProbes = () => probesOf(witnessUpstream);
    await waitFor(() => probesOf(upstream) >= 2);
    await gateway.router.close();
    // Three witness rounds let a probe that was on the wire at close() arrive.
    const closedAt = witnessProbes();
    await waitFor(() => witnessProbes() >= closedAt + 3);
    const after = probesOf(upstream);
    // Ten more rounds, each at least 10 ms: a prober still scheduled would have probed again.
    await waitFor(() => witnessProbes() >= closedAt + 13);
    expect(probesOf(upstream)).toBe(after);
  });
});
