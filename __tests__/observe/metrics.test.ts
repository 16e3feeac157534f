import { afterEach, describe, expect, it } from '@jest/globals';
import { request, type IncomingMessage } from 'node:http';
import { Registry } from 'prom-client';
import { EndpointTable } from '../../lib/upstreams/endpoints';
import { createMetrics } from '../../lib/observe/metrics';
import { parseOptions } from '../../lib/options';
import { metricValue, parseExposition, startGateway, sumSamples, type TestGateway } from '../helpers/app';
import { startEchoUpstream, type EchoUpstream } from '../helpers/echo-upstream';

const tableOf = (name: string, ranks: number[]) =>
  new EndpointTable(parseOptions({ upstreams: [{ url: 'http://127.0.0.1:1', name, dataParallelSize: 8, ranks }] }).upstreams);

describe('createMetrics', () => {
  it('zero-fills every configured series and counts per endpoint', async () => {
    const registry = new Registry();
    const table = tableOf('a', [1, 3]);
    const metrics = createMetrics(registry, 'dp_router_', table, []);
    const [one, three] = table.all;
    metrics.dispatched(three, 'hint');
    metrics.upstreamError(one, 'timeout');
    metrics.hint('accepted');
    metrics.finished(three, 0.2);
    three.inflight = 2;
    table.setHealthy(one, false);

    const samples = parseExposition(await registry.metrics());
    expect(sumSamples(samples, 'dp_router_requests_total', { rank: '3', source: 'hint' })).toBe(1);
    expect(sumSamples(samples, 'dp_router_requests_total', { rank: '1' })).toBe(0);
    // Two endpoints by source, and the upstream's balanced one (rank "vllm": requests vLLM balances itself), which no hint reaches.
    expect(samples.filter((sample) => sample.name === 'dp_router_requests_total').map(({ labels }) => `${labels.rank}/${labels.source}`)).toEqual([
      '1/hint',
      '1/assigned',
      '3/hint',
      '3/assigned',
      'vllm/assigned',
    ]);
    expect(sumSamples(samples, 'dp_router_upstream_errors_total', { rank: '1', kind: 'timeout' })).toBe(1);
    expect(samples.filter((sample) => sample.name === 'dp_router_upstream_errors_total')).toHaveLength(12);
    expect(samples.filter((sample) => sample.name === 'dp_router_endpoint_healthy').map((sample) => sample.labels.rank)).toEqual(['1', '3']);
    expect(samples.filter((sample) => sample.name === 'dp_router_rank_header_rejections_total').map((sample) => sample.labels)).toEqual([
      { upstream: 'a', evidence: 'answer' },
      { upstream: 'a', evidence: 'metrics' },
    ]);
    expect(sumSamples(samples, 'dp_router_rank_hints_total', { outcome: 'accepted' })).toBe(1);
    expect(sumSamples(samples, 'dp_router_request_duration_seconds_count', { rank: '3' })).toBe(1);
    expect(sumSamples(samples, 'dp_router_request_duration_seconds_count', { rank: '1' })).toBe(0);
    expect(sumSamples(samples, 'dp_router_inflight_requests', { rank: '3' })).toBe(2);
    expect(sumSamples(samples, 'dp_router_endpoint_healthy', { rank: '1' })).toBe(0);
    expect(sumSamples(samples, 'dp_router_endpoint_healthy', { rank: '3' })).toBe(1);
  });

  it('zero-fills time to first token, retries and ejections per endpoint, and drops them with the endpoint', async () => {
    const registry = new Registry();
    const table = tableOf('a', [1, 3]);
    const metrics = createMetrics(registry, 'dp_router_', table, []);
    let samples = parseExposition(await registry.metrics());
    for (const name of ['dp_router_time_to_first_token_seconds_count', 'dp_router_retries_total', 'dp_router_ejections_total']) {
      expect(samples.filter((sample) => sample.name === name).map((sample) => sample.labels)).toEqual([
        { upstream: 'a', rank: '1' },
        { upstream: 'a', rank: '3' },
        { upstream: 'a', rank: 'vllm' },
      ]);
      expect(sumSamples(samples, name)).toBe(0);
    }
    const buckets = samples.filter((sample) => sample.name === 'dp_router_time_to_first_token_seconds_bucket' && sample.labels.rank === '1');
    expect(buckets.map((sample) => sample.labels.le)).toEqual(['0.01', '0.025', '0.05', '0.1', '0.2', '0.5', '1', '2', '5', '10', '20', '30', '60', '+Inf']);

    metrics.retried(table.all[0]);
    metrics.ejected(table.all[1]);
    samples = parseExposition(await registry.metrics());
    expect(sumSamples(samples, 'dp_router_retries_total', { rank: '1' })).toBe(1);
    expect(sumSamples(samples, 'dp_router_ejections_total', { rank: '3' })).toBe(1);

    metrics.track(table.reconfigure(tableOf('a', [3]).upstreams), []);
    samples = parseExposition(await registry.metrics());
    for (const name of ['dp_router_time_to_first_token_seconds_count', 'dp_router_retries_total', 'dp_router_ejections_total']) {
      expect(samples.filter((sample) => sample.name === name).map((sample) => sample.labels.rank)).toEqual(['3', 'vllm']);
    }
  });

  it('shares families between routers on one registry and prefix, and stops reporting a closed one', async () => {
    const registry = new Registry();
    const first = tableOf('a', [0]);
    const second = tableOf('b', [0]);
    const firstMetrics = createMetrics(registry, 'gw_', first, []);
    expect(() => createMetrics(registry, 'gw_', second, [])).not.toThrow();
    first.all[0].inflight = 1;
    second.all[0].inflight = 2;
    let samples = parseExposition(await registry.metrics());
    expect(sumSamples(samples, 'gw_inflight_requests', { upstream: 'a' })).toBe(1);
    expect(sumSamples(samples, 'gw_inflight_requests', { upstream: 'b' })).toBe(2);
    firstMetrics.close();
    samples = parseExposition(await registry.metrics());
    expect(samples.some((sample) => sample.name === 'gw_inflight_requests' && sample.labels.upstream === 'a')).toBe(false);
    expect(sumSamples(samples, 'gw_inflight_requests', { upstream: 'b' })).toBe(2);
  });

  it('keeps prefixes apart on one registry', async () => {
    const registry = new Registry();
    createMetrics(registry, 'one_', tableOf('a', [0]), []);
    createMetrics(registry, 'two_', tableOf('a', [0]), []);
    const names = new Set(parseExposition(await registry.metrics()).map((sample) => sample.name.split('_')[0]));
    expect(names).toEqual(new Set(['one', 'two']));
  });
});

describe('time to first token, retries and ejections through the router', () => {
  let upstream: EchoUpstream;
  let gateway: TestGateway;
  afterEach(async () => {
    await gateway?.close();
    await upstream?.close();
  });

  /** Observations of time to first token (the histogram's count), where `labels` match. */
  const firstTokens = async (labels: Record<string, string> = {}) =>
    sumSamples(parseExposition(await gateway.registry.metrics()), 'dp_router_time_to_first_token_seconds_count', labels);

  it('observes a JSON answer once, on the endpoint that answered, and no error answer', async () => {
    upstream = await startEchoUpstream();
    gateway = await startGateway({ upstreams: [{ url: upstream.url, dataParallelSize: 2 }], hints: { trust: true } });
    await fetch(`${gateway.url}/v1/completions`, { method: 'POST', headers: { 'x-data-parallel-rank': '1' }, body: '{}' }).then((r) => r.arrayBuffer());
    expect(await firstTokens({ rank: '1' })).toBe(1);
    expect(await firstTokens({ rank: '0' })).toBe(0);
    upstream.respond = (_req, res) => {
      res.writeHead(500, { 'content-type': 'application/json' });
      res.end('{"error":{}}');
    };
    await fetch(`${gateway.url}/v1/completions`, { method: 'POST', headers: { 'x-data-parallel-rank': '1' }, body: '{}' }).then((r) => r.arrayBuffer());
    expect(await firstTokens()).toBe(1);
  });

  it.each([
    ['nothing', 'text/event-stream; charset=utf-8', ''],
    ['an SSE comment', 'text/event-stream; charset=utf-8', ': ping\n\n'],
    ['a leading blank line', 'text/event-stream', '\n'],
    ['CRLF blank lines and a comment', 'text/event-stream', '\r\n: keep-alive\r\n\r\n'],
    ['a byte-order mark and a comment', 'text/event-stream', '\ufeff:\n\n'],
    ['a capitalised media type', 'Text/Event-Stream', ''],
    ['a capitalised media type and a comment', 'Text/Event-Stream; charset=UTF-8', ': ping\n\n'],
  ])('times a stream to its first event, not its headers, after %s', async (_case, contentType, prelude) => {
    upstream = await startEchoUpstream();
    // The headers (and the prelude) go out at once and the first event a while later. Measured
    // at the event, the time cannot be shorter than the pause, however slow the machine; at the
    // headers or the prelude it would be.
    const pauseMs = 300;
    upstream.respond = (_req, res) => {
      res.writeHead(200, { 'content-type': contentType });
      if (prelude === '') res.flushHeaders();
      else res.write(prelude);
      setTimeout(() => {
        res.write('data: {"choices":[{"text":"a"}]}\n\n');
        res.end('data: [DONE]\n\n');
      }, pauseMs);
    };
    gateway = await startGateway({ upstreams: [{ url: upstream.url }] });
    const response = await new Promise<IncomingMessage>((resolve, reject) => {
      const sent = request(`${gateway.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' } }, resolve);
      sent.on('error', reject);
      sent.end('{"stream":true}');
    });
    expect(response.headers['content-type']).toMatch(/^text\/event-stream/i);
    response.resume();
    await new Promise((resolve) => response.once('end', resolve));
    const samples = parseExposition(await gateway.registry.metrics());
    expect(sumSamples(samples, 'dp_router_time_to_first_token_seconds_count')).toBe(1);
    expect(sumSamples(samples, 'dp_router_time_to_first_token_seconds_sum')).toBeGreaterThanOrEqual(pauseMs / 1000);
  });

  it('counts a retry against the endpoint that failed and an ejection when the detector ejects', async () => {
    upstream = await startEchoUpstream();
    // Nothing listens there once the placeholder is closed: connections are refused.
    const placeholder = await startEchoUpstream();
    await placeholder.close();
    gateway = await startGateway({
      upstreams: [
        { url: placeholder.url, name: 'refused' },
        { url: upstream.url, name: 'echo' },
      ],
      policy: 'round-robin',
      outlierDetection: { consecutiveFailures: 1 },
    });
    const response = await fetch(`${gateway.url}/v1/models`);
    expect(response.status).toBe(200);
    expect(await metricValue(gateway.registry, 'dp_router_retries_total', { upstream: 'refused' })).toBe(1);
    expect(await metricValue(gateway.registry, 'dp_router_retries_total', { upstream: 'echo' })).toBe(0);
    expect(await metricValue(gateway.registry, 'dp_router_ejections_total', { upstream: 'refused' })).toBe(1);
    expect(await firstTokens()).toBe(1);
    expect(await firstTokens({ upstream: 'echo' })).toBe(1);
  });
});
