import { afterEach, describe, expect, it } from '@jest/globals';
import type { Options } from '../../lib';
import { allIdle, exchange, type Exchange, metricValue, type RestartableVllm, startGateway, startRestartableVllm, type TestGateway, waitFor } from '../helpers';

let gateway: TestGateway | undefined;
const mocks: RestartableVllm[] = [];
const loads: Array<{ stop(): Promise<void> }> = [];

afterEach(async () => {
  await Promise.all(loads.splice(0).map((load) => load.stop()));
  await gateway?.close();
  gateway = undefined;
  await Promise.all(mocks.splice(0).map((mock) => mock.close()));
});

async function twoVllms(extra: Partial<Options> = {}): Promise<[RestartableVllm, RestartableVllm]> {
  const a = await startRestartableVllm({ dataParallelSize: 2, decodeMsPerToken: 1 });
  const b = await startRestartableVllm({ dataParallelSize: 2, startRank: 2, decodeMsPerToken: 1 });
  mocks.push(a, b);
  gateway = await startGateway({
    upstreams: [
      { url: a.url, name: 'a', dataParallelSize: 2 },
      { url: b.url, name: 'b', dataParallelSize: 2, startRank: 2 },
    ],
    outlierDetection: { consecutiveFailures: 3, baseEjectionMs: 200, maxEjectionMs: 400 },
    ...extra,
  });
  return [a, b];
}

/** One exchange of a traffic client: which client, when it was sent and when it ended (performance.now()). */
type Logged = Exchange & { client: number; sent: number; at: number };

/** Runs `concurrency` clients in a loop until `stop()` is called; records every exchange in order. */
function traffic(url: string, concurrency: number, stream = false) {
  const log: Logged[] = [];
  let running = true;
  const body = JSON.stringify({ model: 'mock-model', prompt: 'chaos', max_tokens: 4, stream });
  const workers = Array.from({ length: concurrency }, async (_, client) => {
    while (running) {
      const sent = performance.now();
      const answer = await exchange(url, { body });
      log.push({ ...answer, client, sent, at: performance.now() });
    }
  });
  const load = {
    log,
    /** Every client has finished a request sent after `time`: none sent before it is still running. */
    allSentAfter: (time: number) => new Set(log.filter((answer) => answer.sent > time).map((answer) => answer.client)).size === concurrency,
    stop: async () => {
      running = false;
      await Promise.all(workers);
    },
  };
  loads.push(load);
  return load;
}

const servedBy = (answer: Exchange) => answer.headers['x-mock-rank'];
const failed = (answer: Exchange) => answer.status !== 200 || answer.ending !== 'end';
const onA = (answer: Exchange) => ['0', '1'].includes(String(servedBy(answer)));
const onB = (answer: Exchange) => ['2', '3'].includes(String(servedBy(answer)));
const ejected = (upstream: string) =>
  gateway!.router.endpoints().filter((endpoint) => endpoint.upstream === upstream).every((endpoint) => !endpoint.healthy);
/** Once `load` reaches both upstreams, kills `b` and waits until the router has taken it out. */
async function killDuring(load: { log: readonly Logged[] }, b: RestartableVllm): Promise<{ killedAt: number; ejectedAt: number }> {
  await waitFor(() => load.log.some(onA) && load.log.some(onB));
  const killedAt = performance.now();
  await b.kill();
  await waitFor(() => ejected('b'));
  return { killedAt, ejectedAt: performance.now() };
}

/** The exchanges that ended after the last failed one. */
const sinceLastFailure = (log: readonly Logged[]) => {
  const lastFailure = Math.max(...log.filter(failed).map((answer) => answer.at));
  return log.filter((answer) => answer.at > lastFailure);
};

describe('chaos: upstreams killed, restarted and stalled during traffic', () => {
  it('keeps serving on the other upstream when one is killed, and returns to it when it is back', async () => {
    const [, b] = await twoVllms();
    const load = traffic(gateway!.url, 8);
    const { killedAt, ejectedAt } = await killDuring(load, b);
    await waitFor(() => load.log.filter((answer) => answer.sent > ejectedAt).length > 10);
    const afterKill = load.log.filter((answer) => answer.at > killedAt);
    // Refused connections are retried on `a`; only requests cut mid-answer can fail.
    expect(afterKill.filter(failed).length).toBeLessThanOrEqual(8);
    const settled = load.log.filter((answer) => answer.sent > ejectedAt);
    expect(settled.length).toBeGreaterThan(10);
    expect(settled.every((answer) => !failed(answer) && onA(answer))).toBe(true);

    await b.restart();
    const restartedAt = performance.now();
    await waitFor(() => load.log.some((answer) => answer.at > restartedAt && onB(answer)), 5000);
    await waitFor(() => gateway!.router.endpoints().every((endpoint) => endpoint.healthy), 5000);
    await load.stop();
    expect(load.log.filter((answer) => answer.at > restartedAt).filter(failed).length).toBeLessThanOrEqual(2);
    await waitFor(() => allIdle(gateway!));
    expect(await metricValue(gateway!.registry, 'dp_router_inflight_requests')).toBe(0);
    expect(await metricValue(gateway!.registry, 'dp_router_upstream_errors_total', { upstream: 'b' })).toBeGreaterThan(0);
  });

  it('with retries off, a killed upstream costs at most a few failed requests before it is ejected', async () => {
    const [, b] = await twoVllms({ retries: false, outlierDetection: { consecutiveFailures: 3, baseEjectionMs: 5000 } });
    const load = traffic(gateway!.url, 4);
    const { killedAt, ejectedAt } = await killDuring(load, b);
    // Nothing sent before the ejection is still running, and more than 8 answers came since the last failure.
    await waitFor(() => load.allSentAfter(ejectedAt) && sinceLastFailure(load.log).length > 8);
    await load.stop();
    const failures = load.log.filter((answer) => answer.at > killedAt && failed(answer));
    // Three failures eject an endpoint, and `b` has two; requests cut at the kill come on top.
    expect(failures.length).toBeLessThanOrEqual(2 * 3 + 4);
    expect(failures.every((answer) => answer.status === 502 || answer.ending === 'error')).toBe(true);
    // Then the failures stop: everything after the last one succeeded, on `a`.
    const after = sinceLastFailure(load.log);
    expect(after.length).toBeGreaterThan(8);
    expect(after.filter(failed)).toHaveLength(0);
    expect(after.every(onA)).toBe(true);
  });

  it('routes around a stalled upstream: first-byte timeouts answer 504, then it is ejected', async () => {
    // First-byte timeouts are request failures; these clients share one address, so every one counts.
    const [, b] = await twoVllms({ timeouts: { firstByteMs: 150 }, outlierDetection: { consecutiveFailures: 3, baseEjectionMs: 200, maxEjectionMs: 400, minimumClients: 1 } });
    b.current!.fault = { kind: 'stall' };
    const load = traffic(gateway!.url, 4);
    // Taken out (for 200 to 400 ms at a time) while more than 8 requests succeeded on `a`.
    await waitFor(() => ejected('b') && load.log.filter((answer) => answer.status === 200).length > 8);
    await load.stop();
    const timeouts = load.log.filter((answer) => answer.status === 504);
    expect(timeouts.length).toBeGreaterThan(0);
    expect(timeouts.length).toBeLessThanOrEqual(4 * 3);
    expect(timeouts.every((answer) => JSON.parse(answer.body).error.type === 'GatewayTimeoutError')).toBe(true);
    expect(load.log.filter((answer) => answer.status === 200).length).toBeGreaterThan(8);
    expect(load.log.every((answer) => answer.status === 200 || answer.status === 504)).toBe(true);
    await waitFor(() => allIdle(gateway!));
    // Every stalled upstream request was destroyed: the mock holds nothing running.
    await waitFor(() => Object.values(b.current!.stats().perRank).every((rank) => rank.running === 0));
  });

  it('ends the client stream when the upstream dies mid-stream, counting a reset', async () => {
    const a = await startRestartableVllm({ dataParallelSize: 2, decodeMsPerToken: 1 });
    mocks.push(a);
    gateway = await startGateway({ upstreams: [{ url: a.url, name: 'a', dataParallelSize: 2 }] });
    a.current!.fault = { kind: 'die-mid-stream', afterChunks: 2 };
    const answer = await exchange(gateway.url, { body: JSON.stringify({ model: 'mock-model', prompt: 'x', max_tokens: 20, stream: true }) });
    expect(answer.status).toBe(200);
    expect(answer.ending).toBe('error');
    expect(answer.body.startsWith('data: ')).toBe(true);
    expect(answer.body).not.toContain('[DONE]');
    expect(await metricValue(gateway.registry, 'dp_router_upstream_errors_total', { kind: 'reset' })).toBe(1);
    await waitFor(() => allIdle(gateway!));
  });
});
