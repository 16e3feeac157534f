import { describe, expect, it } from '@jest/globals';
import { Counter, Histogram, Registry } from 'prom-client';
import { CollectedCounter, CollectedHistogram, counterFamily, histogramFamily } from '../../lib/observe/collected-metrics';
import { createMetrics } from '../../lib/observe/metrics';
import { EndpointTable } from '../../lib/upstreams/endpoints';
import { parseOptions } from '../../lib/options';
import { parseExposition, sumSamples } from '../helpers/app';

const tableOf = (name: string, ranks: number[]) =>
  new EndpointTable(parseOptions({ upstreams: [{ url: 'http://127.0.0.1:1', name, dataParallelSize: 8, ranks }] }).upstreams);

const BUCKETS = [0.01, 0.1, 1, 10];
const SAMPLES = [0.005, 0.01, 0.05, 0.5, 0.5, 3, 10, 42, 1e-9, 7.25];

describe('collected counters and histograms', () => {
  it("export exactly what prom-client's own Histogram and Counter do for the same updates", async () => {
    const own = new Registry();
    const histogram = new Histogram({ name: 'h_seconds', help: 'h', labelNames: ['upstream', 'rank'], buckets: BUCKETS, registers: [own] });
    const counter = new Counter({ name: 'c_total', help: 'c', labelNames: ['upstream', 'rank'], registers: [own] });
    const collected = new Registry();
    const series = histogramFamily(collected, 'h_seconds', 'h', ['upstream', 'rank'], BUCKETS).join();
    const counts = counterFamily(collected, 'c_total', 'c', ['upstream', 'rank']).join();
    const labels = [
      { upstream: 'a', rank: '0' },
      { upstream: 'a "quoted"\\ name', rank: '12' },
    ];
    const observers = labels.map((one) => series.add(one));
    const incs = labels.map((one) => counts.add(one));
    labels.forEach((one) => histogram.zero(one));
    labels.forEach((one) => counter.inc(one, 0));
    SAMPLES.forEach((value, at) => {
      histogram.observe(labels[at % 2], value);
      observers[at % 2].observe(value);
      counter.inc(labels[at % 3 === 0 ? 1 : 0]);
      incs[at % 3 === 0 ? 1 : 0].inc();
    });
    const sorted = (text: string) => text.split('\n').sort();
    expect(sorted(await collected.metrics())).toEqual(sorted(await own.metrics()));
    const keyOf = (sample: { metricName?: string; labels: object }) => `${sample.metricName ?? ''} ${JSON.stringify(Object.entries(sample.labels).sort())}`;
    const json = async (registry: Registry) => (await registry.getMetricsAsJSON()).map((metric) => ({ ...metric, values: [...metric.values].sort((x, y) => keyOf(x).localeCompare(keyOf(y))) }));
    expect(await json(collected)).toEqual(await json(own));
    expect(collected.getSingleMetric('h_seconds')).toBeInstanceOf(Histogram);
    expect(collected.getSingleMetric('c_total')).toBeInstanceOf(Counter);
  });

  it('sum the routers that share a series; a closed one leaves its counts, a removed series leaves with its own', async () => {
    const registry = new Registry();
    const first = counterFamily(registry, 'c_total', 'c', ['rank']).join();
    const second = counterFamily(registry, 'c_total', 'c', ['rank']).join();
    const a = first.add({ rank: '0' });
    const b = second.add({ rank: '0' });
    const gone = second.add({ rank: '1' });
    a.inc();
    b.inc();
    b.inc();
    gone.inc();
    const value = async (rank: string) => sumSamples(parseExposition(await registry.metrics()), 'c_total', { rank });
    expect(await value('0')).toBe(3);
    // One line per series, however many routers report it.
    expect(parseExposition(await registry.metrics()).filter((sample) => sample.name === 'c_total')).toHaveLength(2);
    second.remove(gone);
    expect(parseExposition(await registry.metrics()).some((sample) => sample.labels.rank === '1')).toBe(false);
    first.leave();
    a.inc();
    // Counted until it closed, not after.
    expect(await value('0')).toBe(3);
    // A router started after it continues the series.
    const third = counterFamily(registry, 'c_total', 'c', ['rank']).join();
    third.add({ rank: '0' }).inc();
    expect(await value('0')).toBe(4);
    registry.resetMetrics();
    expect(await value('0')).toBe(0);
  });

  it('join a plain prom-client metric registered under the name already, through its own updates', async () => {
    const registry = new Registry();
    const plain = new Counter({ name: 'c_total', help: 'c', labelNames: ['rank'], registers: [registry] });
    const plainHistogram = new Histogram({ name: 'h_seconds', help: 'h', labelNames: ['rank'], buckets: BUCKETS, registers: [registry] });
    const counts = counterFamily(registry, 'c_total', 'c', ['rank']).join();
    const series = histogramFamily(registry, 'h_seconds', 'h', ['rank'], BUCKETS).join();
    const zero = counts.add({ rank: '0' });
    const timed = series.add({ rank: '0' });
    expect(registry.getSingleMetric('c_total')).toBe(plain);
    expect(registry.getSingleMetric('c_total')).not.toBeInstanceOf(CollectedCounter);
    expect(registry.getSingleMetric('h_seconds')).not.toBeInstanceOf(CollectedHistogram);
    zero.inc();
    timed.observe(0.5);
    expect((await plain.get()).values).toEqual([{ labels: { rank: '0' }, value: 1 }]);
    expect((await plainHistogram.get()).values.find((sample) => sample.metricName === 'h_seconds_count')?.value).toBe(1);
    counts.remove(zero);
    expect((await plain.get()).values).toEqual([]);
  });

  it("carry the router's per-request counts: requests, duration and time to first token", async () => {
    const registry = new Registry();
    const table = tableOf('a', [0, 1]);
    const metrics = createMetrics(registry, 'dp_router_', table, []);
    const [zero, one] = table.all;
    for (let i = 0; i < 5; i++) metrics.dispatched(zero, 'assigned');
    metrics.dispatched(one, 'hint');
    metrics.finished(zero, 0.03);
    metrics.finished(zero, 700);
    let samples = parseExposition(await registry.metrics());
    expect(sumSamples(samples, 'dp_router_requests_total', { rank: '0', source: 'assigned' })).toBe(5);
    expect(sumSamples(samples, 'dp_router_requests_total', { rank: '1', source: 'hint' })).toBe(1);
    const buckets = samples.filter((sample) => sample.name === 'dp_router_request_duration_seconds_bucket' && sample.labels.rank === '0');
    expect(buckets.find((sample) => sample.labels.le === '0.05')?.value).toBe(1);
    expect(buckets.find((sample) => sample.labels.le === '600')?.value).toBe(1);
    expect(buckets.find((sample) => sample.labels.le === '+Inf')?.value).toBe(2);
    expect(sumSamples(samples, 'dp_router_request_duration_seconds_sum', { rank: '0' })).toBeCloseTo(700.03);
    metrics.close();
    // Another router on the registry, after the first closed: the counts go on from where they were.
    const nextTable = tableOf('a', [0]);
    const next = createMetrics(registry, 'dp_router_', nextTable, []);
    next.dispatched(nextTable.all[0], 'assigned');
    metrics.dispatched(zero, 'assigned');
    samples = parseExposition(await registry.metrics());
    expect(sumSamples(samples, 'dp_router_requests_total', { rank: '0', source: 'assigned' })).toBe(6);
    expect(sumSamples(samples, 'dp_router_request_duration_seconds_count', { rank: '0' })).toBe(2);
  });
});
