import express from 'express';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Logger as PinoLogger } from 'pino';
import { pinoHttp } from 'pino-http';
import { Registry } from 'prom-client';
import { dpRouter, type DpRouter, type UpstreamOptions } from '../lib';
import type { GatewaySettings } from './cli';
import { startMockVllm, type MockVllm } from './mock-vllm';
import { admissionFromFlags } from './admission';

/** A running example gateway. */
export interface RunningGateway {
  server: Server;
  router: DpRouter;
  url: string;
  /** The embedded mock, when no upstream was given. */
  mock: MockVllm | undefined;
  /** What the start-up log line says. */
  summary: string;
  /** Stops accepting, lets in-flight requests finish (up to the drain timeout), then frees everything. */
  close(): Promise<void>;
}

/**
 * Starts the gateway (and the embedded mock vLLM when no upstream is given). With a pino
 * `logger`, the router logs to it and every proxied request gets an access line carrying
 * its routing decision.
 */
export async function startExampleGateway(settings: GatewaySettings, logger?: PinoLogger): Promise<RunningGateway> {
  const mockStart = settings.upstreams.length === 0 ? await startMock(settings) : undefined;
  const mock = mockStart?.mock;
  const mockEvents = mock?.kvEvents;
  const upstreams: UpstreamOptions[] = mock
    ? [
        {
          url: mock.url,
          name: 'mock-vllm',
          dataParallelSize: settings.dpSize,
          ...(mockEvents && { kvEvents: { endpoint: mockEvents.endpoints, replayEndpoint: mockEvents.replayEndpoints, topic: mockEvents.topic } }),
        },
      ]
    : settings.upstreams;
  const tokenizer = settings.tokenizer ?? mockEvents?.tokenizer;
  const registry = new Registry();
  const admission = await admissionFromFlags(settings.admission, (message) => (logger ? logger.warn(message) : process.emitWarning(message)));
  const router = dpRouter({
    upstreams,
    policy: settings.policy,
    hints: { trust: settings.trustHints, onInvalid: settings.onInvalid },
    exposeDecision: settings.exposeDecision,
    healthCheck: settings.healthCheckMs > 0 ? { intervalMs: settings.healthCheckMs } : false,
    loadFeedback: settings.loadFeedbackMs > 0 ? { intervalMs: settings.loadFeedbackMs, weight: settings.loadFeedbackWeight } : false,
    metrics: { registry },
    ...(admission.options !== undefined && { admission: admission.options }),
    ...(tokenizer !== undefined && { prefixAware: { tokenizer } }),
    ...(logger ? { logger } : {}),
  });

  const app = express();
  app.disable('x-powered-by');
  // Liveness never touches an upstream: a restart would not cure a sick engine.
  app.get('/healthz', (_req, res) => {
    res.json({ status: 'ok' });
  });
  app.get('/readyz', (_req, res) => {
    const healthy = router.endpoints().filter((endpoint) => endpoint.healthy).length;
    res.status(healthy > 0 ? 200 : 503).json({ status: healthy > 0 ? 'ready' : 'no healthy endpoint', healthyEndpoints: healthy });
  });
  app.get('/metrics', router.metrics);
  if (logger) {
    // After the probes and the scrape endpoint, which would drown the requests worth reading.
    app.use(
      pinoHttp({
        logger,
        customProps: (req) => (req.dpRank ? { dpRank: { upstream: req.dpRank.upstream, rank: req.dpRank.rank, source: req.dpRank.source } } : {}),
      }),
    );
  }
  app.use(router);

  const server = createServer(app);
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(settings.port, settings.host, () => resolve());
  });
  const address = server.address() as AddressInfo;
  const url = `http://${address.family === 'IPv6' ? `[${address.address}]` : address.address}:${address.port}`;

  let closing: Promise<void> | undefined;
  const close = () =>
    (closing ??= (async () => {
      const drained = new Promise<void>((resolve) => server.close(() => resolve()));
      // Keep-alive connections go idle as their last response ends; close them as they do
      // rather than waiting out the keep-alive timeout.
      const sweeper = setInterval(() => server.closeIdleConnections(), 50).unref();
      const deadline = new Promise<void>((resolve) => setTimeout(resolve, settings.drainTimeoutMs).unref());
      await Promise.race([drained, deadline]);
      clearInterval(sweeper);
      server.closeAllConnections();
      await router.close();
      await admission.close();
      await mock?.close();
    })());

  const summary = describe(url, upstreams, settings, mock) + (mockStart?.eventsOff === undefined ? '' : `; the mock publishes no KV events (${mockStart.eventsOff})`);
  return { server, router, url, mock, summary, close };
}

/**
 * The embedded mock publishes KV events, so that prefix-aware routes on them with no flag; an
 * install without the optional packages (zeromq, msgpackr, the tokenizers) or the mock's
 * tokenizer files gets a mock without them. Nothing is bound before that fails.
 */
async function startMock(settings: GatewaySettings): Promise<{ mock: MockVllm; eventsOff?: string }> {
  const options = { dataParallelSize: settings.dpSize, decodeMsPerToken: settings.mockDecodeMs, ...(settings.mockMaxNumSeqs > 0 && { maxNumSeqs: settings.mockMaxNumSeqs }) };
  try {
    return { mock: await startMockVllm({ ...options, kvEvents: {} }) };
  } catch (error) {
    return { mock: await startMockVllm(options), eventsOff: (error as Error).message };
  }
}

function describe(url: string, upstreams: readonly UpstreamOptions[], settings: GatewaySettings, mock: MockVllm | undefined): string {
  const targets = upstreams
    .map((upstream) => `${mock ? `embedded mock vLLM ${upstream.url}` : upstream.url} ranks ${rankList(upstream)} (${upstream.rankHeader ?? 'global'} header)`)
    .join(', ');
  const hints = settings.trustHints ? `hints trusted, invalid → ${settings.onInvalid}` : 'hints untrusted';
  const exact = settings.policy === 'prefix-aware' && upstreams.some((upstream) => upstream.kvEvents !== undefined) ? ' (exact, on KV events)' : '';
  return `express-dp-router listening on ${url} → ${targets}; policy ${settings.policy}${exact}; ${hints}; metrics at ${url}/metrics`;
}

function rankList(upstream: UpstreamOptions): string {
  const start = upstream.startRank ?? 0;
  const ranks = upstream.ranks ?? Array.from({ length: upstream.dataParallelSize ?? 1 }, (_, offset) => start + offset);
  const contiguous = ranks.every((rank, index) => index === 0 || rank === ranks[index - 1] + 1);
  return contiguous && ranks.length > 2 ? `${ranks[0]}-${ranks[ranks.length - 1]}` : ranks.join(',');
}
