/**
 * One upstream of `bench:receipts`, in this process: the mock vLLM with KV events (4 ranks), an
 * optional relay in front of it, and an Express gateway with dpRouter on prefix-aware exact
 * routing, its log lines captured; the gateway's subscriptions are joined before it returns.
 */
import express from 'express';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Registry } from 'prom-client';
import { startMockVllm, type MockVllm, type MockVllmOptions } from '../../example-server/mock-vllm';
import { dpRouter, type DpRouter, type ReceiptsOptions, type UpstreamOptions } from '../../lib';
import { startRelay, type Rewrite } from '../lib/relay';

export const RANKS = 4;

export interface Fleet {
  readonly mock: MockVllm;
  readonly router: DpRouter;
  readonly url: string;
  /** Error lines (a rank header not honoured), in order. */
  readonly errors: string[];
  /** Notices (an index not trusted, a verdict lifted), in order. */
  readonly warnings: string[];
  close(): Promise<void>;
}

export interface FleetOptions {
  readonly mock?: MockVllmOptions;
  readonly relay?: Rewrite;
  readonly upstream?: Partial<UpstreamOptions>;
  readonly receipts?: ReceiptsOptions | false;
}

export async function startFleet(options: FleetOptions = {}): Promise<Fleet> {
  const mock = await startMockVllm({ dataParallelSize: RANKS, kvEvents: {}, ...options.mock });
  const relay = options.relay === undefined ? undefined : await startRelay(mock.url, options.relay);
  const kv = mock.kvEvents!;
  const errors: string[] = [];
  const warnings: string[] = [];
  const router = dpRouter({
    upstreams: [{ url: relay?.url ?? mock.url, name: 'mock', dataParallelSize: RANKS, kvEvents: { endpoint: kv.endpoints, replayEndpoint: kv.replayEndpoints.length > 0 ? kv.replayEndpoints : undefined }, ...options.upstream }],
    policy: 'prefix-aware',
    prefixAware: { tokenizer: kv.tokenizer },
    metrics: { registry: new Registry() },
    ...(options.receipts !== undefined && { receipts: options.receipts }),
    logger: { warn: (message) => warnings.push(message), error: (_fields, message) => errors.push(message) },
  });
  const app = express();
  app.use(router);
  const server = createServer(app);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  await joinStreams(mock, router);
  return {
    mock,
    router,
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    errors,
    warnings,
    close: async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await router.close();
      await relay?.close();
      await mock.close();
    },
  };
}

let probes = 0;

/** Requests straight to each rank until the router's stream of it is fresh (a SUB joins asynchronously). */
export async function joinStreams(mock: MockVllm, router: DpRouter, ranks = RANKS): Promise<void> {
  for (let rank = 0; rank < ranks; rank++) {
    for (let attempt = 0; ; attempt++) {
      if (attempt > 400) throw new Error(`rank ${rank}'s KV events never arrived`);
      const res = await fetch(`${mock.url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-data-parallel-rank': String(rank) },
        body: JSON.stringify({ prompt: `probe ${probes++} ${'lorem ipsum dolor '.repeat(8)}`, max_tokens: 1 }),
      });
      await res.arrayBuffer();
      const fresh = (await router.registry.getSingleMetric('dp_router_kv_stream_fresh')!.get()).values.find((sample) => sample.labels.rank === String(rank));
      if (fresh?.value === 1) break;
      await new Promise((resolve) => setTimeout(resolve, 25));
    }
  }
}

/** The sum of a metric's samples matching `labels`. */
export async function metricSum(router: DpRouter, name: string, labels: Record<string, string> = {}): Promise<number> {
  const metric = router.registry.getSingleMetric(name);
  if (metric === undefined) return 0;
  const { values } = await metric.get();
  return values.filter((sample) => Object.entries(labels).every(([key, value]) => String(sample.labels[key]) === value)).reduce((sum, sample) => sum + sample.value, 0);
}
