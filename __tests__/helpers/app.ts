import express from 'express';
import { createServer, type RequestListener, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Registry } from 'prom-client';
import { version as expressVersion } from 'express/package.json';
import { dpRouter, type DpRouter, type Options } from '../../lib';

/**
 * The Express major version under test: 5, or 4 in the `express4` jest project, which maps
 * `express` to the `express4` dev dependency (`npm run test:express4`).
 */
export const expressMajor = Number(expressVersion.split('.')[0]);

export interface TestGateway {
  app: express.Express;
  router: DpRouter;
  registry: Registry;
  server: Server;
  url: string;
  close(): Promise<void>;
}

/** An HTTP server for `app` on 127.0.0.1:0; `close()` drops its connections and waits. */
export async function serve(app: RequestListener): Promise<{ server: Server; url: string; close(): Promise<void> }> {
  const server = createServer(app);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    server,
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/**
 * A gateway on 127.0.0.1:0: Express with the router at `mount` and metrics at `/metrics`,
 * on a fresh registry unless the options name one.
 */
export async function startGateway(options: Options, mount = '/'): Promise<TestGateway> {
  const registry = new Registry();
  const router = dpRouter({ metrics: { registry }, ...options });
  const app = express();
  app.get('/metrics', router.metrics);
  app.use(mount, router);
  const { server, url, close } = await serve(app);
  return {
    app,
    router,
    registry: router.registry,
    server,
    url,
    close: async () => {
      await close();
      await router.close();
    },
  };
}

/** Sums a metric's samples that match `labels`, from the registry as Prometheus would scrape it. */
export async function metricValue(registry: Registry, name: string, labels: Record<string, string> = {}): Promise<number> {
  const metric = registry.getSingleMetric(name);
  if (!metric) throw new Error(`no metric ${name}`);
  const { values } = await metric.get();
  return values
    .filter((sample) => Object.entries(labels).every(([key, value]) => String(sample.labels[key]) === value))
    .reduce((sum, sample) => sum + sample.value, 0);
}

/** One sample of the Prometheus text format. */
export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** Parses Prometheus text exposition (what a scraper reads), enough for label-matching sums. */
export function parseExposition(text: string): Sample[] {
  const samples: Sample[] = [];
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!match) throw new Error(`unparsable exposition line: ${line}`);
    const labels: Record<string, string> = {};
    for (const pair of (match[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[pair[1]] = pair[2];
    samples.push({ name: match[1], labels, value: Number(match[3]) });
  }
  return samples;
}

/** Sums samples of `name` whose labels include `labels`. */
export function sumSamples(samples: readonly Sample[], name: string, labels: Record<string, string> = {}): number {
  return samples
    .filter((sample) => sample.name === name && Object.entries(labels).every(([key, value]) => sample.labels[key] === value))
    .reduce((sum, sample) => sum + sample.value, 0);
}

/** Every endpoint's in-flight count is back to 0. */
export function allIdle(gateway: TestGateway): boolean {
  return gateway.router.endpoints().every((endpoint) => endpoint.inflight === 0);
}
