import { describe, expect, it } from '@jest/globals';
import { Registry } from 'prom-client';
import { EndpointTable } from '../lib/endpoints';
import { createMetrics } from '../lib/metrics';
import { parseOptions } from '../lib/options';
import { parseExposition, sumSamples } from './helpers/app';

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
    expect(samples.filter((sample) => sample.name === 'dp_router_requests_total')).toHaveLength(4);
    expect(sumSamples(samples, 'dp_router_upstream_errors_total', { rank: '1', kind: 'timeout' })).toBe(1);
    expect(samples.filter((sample) => sample.name === 'dp_router_upstream_errors_total')).toHaveLength(8);
    expect(sumSamples(samples, 'dp_router_rank_hints_total', { outcome: 'accepted' })).toBe(1);
    expect(sumSamples(samples, 'dp_router_request_duration_seconds_count', { rank: '3' })).toBe(1);
    expect(sumSamples(samples, 'dp_router_request_duration_seconds_count', { rank: '1' })).toBe(0);
    expect(sumSamples(samples, 'dp_router_inflight_requests', { rank: '3' })).toBe(2);
    expect(sumSamples(samples, 'dp_router_endpoint_healthy', { rank: '1' })).toBe(0);
    expect(sumSamples(samples, 'dp_router_endpoint_healthy', { rank: '3' })).toBe(1);
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
