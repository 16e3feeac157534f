/**
 * One contender of `bench:slo`, in this process: a fresh timed mock vLLM (KV events on ZeroMQ)
 * and an Express gateway with dpRouter in front of it, subscribed to its events before it returns.
 */
import express from 'express';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Registry } from 'prom-client';
import { startMockVllm, type MockVllm, type MockVllmOptions } from '../../example-server/mock-vllm';
import { dpRouter, type DpRouter, type DpRouterOptions } from '../../lib';
import { joinStreams, metricSum } from '../receipts/fleet';

export { metricSum };

export interface Fleet {
  readonly mock: MockVllm;
  readonly router: DpRouter | undefined;
  /** Where the client sends: the gateway, or the mock itself without a router. */
  readonly url: string;
  close(): Promise<void>;
}

/** What a contender puts in front of the mock; `undefined`: nothing (the mock balances itself). */
export type RouterShape = Omit<DpRouterOptions, 'upstreams' | 'metrics' | 'logger'> | undefined;

export async function startFleet(mockOptions: MockVllmOptions, shape: RouterShape): Promise<Fleet> {
  const mock = await startMockVllm({ kvEvents: {}, ...mockOptions });
  if (shape === undefined) return { mock, router: undefined, url: mock.url, close: () => mock.close() };
  const kv = mock.kvEvents!;
  const ranks = kv.ranks.length;
  // Only exact prefix routing reads the events (the mock publishes them for every contender alike).
  const exact = shape.policy === 'prefix-aware';
  let router: DpRouter;
  try {
    router = dpRouter({
      upstreams: [{ url: mock.url, name: 'mock', dataParallelSize: ranks, ...(exact && { kvEvents: { endpoint: kv.endpoints, replayEndpoint: kv.replayEndpoints } }) }],
      metrics: { registry: new Registry() },
      logger: false,
      ...shape,
    } as DpRouterOptions);
  } catch (error) {
    await mock.close();
    throw error;
  }
  const app = express();
  app.use(router);
  const server = createServer(app);
  server.keepAliveTimeout = 60_000;
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  if (exact) await joinStreams(mock, router, ranks);
  mock.resetStats();
  return {
    mock,
    router,
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await router.close();
      await mock.close();
    },
  };
}

/** The median of a histogram's observations matching `labels`, interpolated in its buckets; NaN when empty. */
export async function histogramMedian(router: DpRouter, name: string, labels: Record<string, string>): Promise<number> {
  const metric = router.registry.getSingleMetric(name);
  if (metric === undefined) return NaN;
  const { values } = await metric.get();
  const matching = values.filter((sample) => Object.entries(labels).every(([key, value]) => String(sample.labels[key]) === value));
  const buckets = new Map<number, number>();
  for (const sample of matching) {
    if ((sample as { metricName?: string }).metricName !== `${name}_bucket`) continue;
    const le = sample.labels.le === '+Inf' ? Infinity : Number(sample.labels.le);
    buckets.set(le, (buckets.get(le) ?? 0) + sample.value);
  }
  const sorted = [...buckets].sort(([a], [b]) => a - b);
  const total = sorted.at(-1)?.[1] ?? 0;
  if (total === 0) return NaN;
  let previousLe = 0;
  let previousCount = 0;
  for (const [le, count] of sorted) {
    if (count >= total / 2) {
      if (le === Infinity) return previousLe;
      return previousLe + ((total / 2 - previousCount) / Math.max(1, count - previousCount)) * (le - previousLe);
    }
    previousLe = le;
    previousCount = count;
  }
  return NaN;
}
