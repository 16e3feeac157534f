import express from 'express';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Logger as PinoLogger } from 'pino';
import { pinoHttp } from 'pino-http';
import { Registry } from 'prom-client';
import { dpRouter, type AdmissionOptions, type DpRouter, type RankHeaderMode, type UpstreamEntry, type UpstreamOptions } from '../lib';
import { gatewayErrorOf } from '../lib/errors';
import { redactUrl } from '../lib/upstreams/upstream-url';
import { DEFAULT_MOCK_PORT, type GatewaySettings } from './cli';
import { startMockVllm, type MockVllm, type MockVllmOptions } from './mock-vllm';
import { timedMockOptions } from './mock-vllm/timing-flags';
import { admissionFromFlags } from './admission';
import { listenProblem } from './listen-problem';
import { learnStartRanks } from './start-rank';
import { servicesSummary } from './startup-line';

/** A running example gateway. */
export interface RunningGateway {
  server: Server;
  router: DpRouter;
  url: string;
  /** The embedded mock, when no upstream was given (with `--pd`, the decode server). */
  mock: MockVllm | undefined;
  /** With `--pd`: the embedded prefill server. */
  prefillMock: MockVllm | undefined;
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
  const pd = settings.disaggregation;
  const embedded = settings.upstreams.length === 0;
  // Before anything is bound: a server whose engines cannot be told stops the start.
  const configured = await learnStartRanks(settings.upstreams);
  // The mock reads the header as vLLM does; --rank-header none or global is sent to it as to any
  // server, so that what it does (vLLM balancing, for none) can be watched from a laptop.
  const rankHeader = settings.rankHeader ?? 'local';
  // With --pd the prefill mock publishes the KV events prefix-aware picks prefill ranks on.
  const prefillStart = embedded && pd ? await startMock(settings, { role: 'prefill', connector: pd.connector }) : undefined;
  const mockStart = embedded ? await startMock(settings, pd && { role: 'decode', connector: pd.connector }) : undefined;
  const mock = mockStart?.mock;
  const prefillMock = prefillStart?.mock;
  const mockEvents = prefillMock?.kvEvents ?? mock?.kvEvents;
  const upstreams: UpstreamEntry[] = prefillMock && mock
    ? [embeddedUpstream(prefillMock, 'mock-prefill', settings.dpSize, 'prefill', rankHeader), { url: mock.url, name: 'mock-decode', dataParallelSize: settings.dpSize, role: 'decode', rankHeader }]
    : mock
    ? [
        {
          url: mock.url,
          name: 'mock-vllm',
          dataParallelSize: settings.dpSize,
          rankHeader,
          // Only prefix-aware reads them; the router warns about KV events nothing reads.
          ...(mockEvents && settings.policy === 'prefix-aware' && { kvEvents: { endpoint: mockEvents.endpoints, replayEndpoint: mockEvents.replayEndpoints, topic: mockEvents.topic } }),
        },
      ]
    : configured;
  const tokenizer = settings.tokenizer ?? mockEvents?.tokenizer;
  const registry = new Registry();
  const peers = settings.peers;
  const admission = await admissionFromFlags(settings.admission, (message) => (logger ? logger.warn(message) : process.emitWarning(message)), peers?.redis === true, (message) => (logger ? logger.error(message) : process.emitWarning(message)));
  const router = dpRouter({
    upstreams,
    policy: settings.policy,
    hints: { trust: settings.trustHints, onInvalid: settings.onInvalid },
    exposeDecision: settings.exposeDecision,
    healthCheck: settings.healthCheckMs > 0 ? { intervalMs: settings.healthCheckMs } : false,
    loadFeedback: settings.loadFeedbackMs > 0 ? { intervalMs: settings.loadFeedbackMs, weight: settings.loadFeedbackWeight } : false,
    metrics: { registry },
    ...(admission.options !== undefined && { admission: admission.options }),
    ...((tokenizer !== undefined || settings.placementSlack !== undefined || settings.chatTemplateKwargs !== undefined) && {
      prefixAware: { tokenizer, placementSlack: settings.placementSlack, chatTemplateKwargs: settings.chatTemplateKwargs },
    }),
    ...(peers !== undefined && {
      peers: peers.redis
        ? { redis: admission.redis, secret: peers.secret }
        : { listen: peers.listen, dns: peers.dns, secret: peers.secret, addresses: peers.addresses.length > 0 ? peers.addresses : undefined },
    }),
    ...(pd && { disaggregation: { connector: pd.connector } }),
    ...(settings.slo !== undefined && { slo: settings.slo }),
    ...(logger ? { logger } : {}),
  });

  const app = express();
  app.disable('x-powered-by');
  // Liveness never touches an upstream: a restart would not cure a sick engine.
  app.get('/healthz', (_req, res) => {
    res.json({ status: 'ok' });
  });
  // Token budgets in a Redis that is down are not enforced (the router fails open): still ready,
  // flagged degraded; a Redis that refused our credentials from the start is not (docs/deploying.md).
  app.get('/readyz', (_req, res) => {
    const healthy = router.endpoints().filter((endpoint) => endpoint.healthy).length;
    const store = admission.readiness();
    const ready = healthy > 0 && store !== 'refused';
    const status = healthy === 0 ? 'no healthy endpoint' : store === 'refused' ? 'the token store (--redis) refuses its credentials' : 'ready';
    res.status(ready ? 200 : 503).json({ status, healthyEndpoints: healthy, ...(store !== 'ok' && { degraded: ['token budgets not enforced: Redis unreachable or refusing credentials'] }) });
  });
  app.get('/metrics', router.metrics);
  if (logger) {
    // After the probes and the scrape endpoint, which would drown the requests worth reading.
    app.use(
      pinoHttp({
        logger,
        redact: { paths: REDACTED_HEADERS, censor: '[Redacted]' },
        customProps: (req) => (req.dpRank ? { dpRank: { upstream: req.dpRank.upstream, rank: req.dpRank.rank, source: req.dpRank.source } } : {}),
        // A 5xx is the gateway's answer (or an upstream's passed through), not a fault of this
        // code: its line carries the vLLM error it answered, not a stack pino-http made up.
        customErrorMessage: (_req, res, error) => {
          const answered = gatewayErrorOf(res);
          if (answered) return `${answered.type}: ${answered.message}`;
          return madeUp(error, res.statusCode) ? `upstream answered ${res.statusCode}` : 'request errored';
        },
        customErrorObject: (_req, res, error, fields: Record<string, unknown>) => {
          if (!madeUp(error, res.statusCode)) return fields;
          const { err: _madeUp, ...rest } = fields;
          const answered = gatewayErrorOf(res);
          return answered ? { ...rest, error: { type: answered.type, message: answered.message } } : rest;
        },
      }),
    );
  }
  app.use(router);

  const server = createServer(app);
  try {
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(settings.port, settings.host, () => resolve());
    });
  } catch (error) {
    // Nothing started so far outlives the failed start.
    await router.close();
    await admission.close();
    await mock?.close();
    await prefillMock?.close();
    throw listenProblem(error, 'the gateway', hostPort(settings.host, settings.port), 'give --port N or set PORT (0: any free port)');
  }
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
      await prefillMock?.close();
    })());

  const summary = describe(url, upstreams, settings, mock, admission.options) + (mockStart?.eventsOff === undefined ? '' : `; the mock publishes no KV events (${mockStart.eventsOff})`);
  return { server, router, url, mock, prefillMock, summary, close };
}

/**
 * Credentials pino-http's default serializers would write with every request and response:
 * vLLM's `--api-key` arrives as `Authorization: Bearer …`, and a log store is read by more people
 * than the key is given to. The header stays in the line, its value does not.
 */
export const REDACTED_HEADERS = [
  'req.headers.authorization',
  'req.headers["proxy-authorization"]',
  'req.headers.cookie',
  'req.headers["x-api-key"]',
  'res.headers["set-cookie"]',
];

/** pino-http's stand-in for a 5xx without an error: `new Error('failed with status code 502')`. */
function madeUp(error: Error, status: number): boolean {
  return error.message === `failed with status code ${status}`;
}

/**
 * The embedded mock publishes KV events, so that prefix-aware routes on them with no flag; an
 * install without the optional packages (zeromq, msgpackr, the tokenizers) or the mock's
 * tokenizer files gets a mock without them. Nothing is bound before that fails.
 */
async function startMock(settings: GatewaySettings, role?: Pick<MockVllmOptions, 'role' | 'connector'>): Promise<{ mock: MockVllm; eventsOff?: string }> {
  const { scheduler, cpuBlocksPerRank } = timedMockOptions(settings.mockTiming, settings.dpSize, '--mock-speeds');
  const options: MockVllmOptions = {
    dataParallelSize: settings.dpSize,
    ...(scheduler ? { scheduler } : { decodeMsPerToken: settings.mockDecodeMs }),
    ...(settings.mockMaxNumSeqs > 0 && { maxNumSeqs: settings.mockMaxNumSeqs }),
    ...role,
  };
  // The decode server of --pd publishes none: prefill ranks are the ones picked on prefixes.
  if (role?.role === 'decode') return { mock: await startMockVllm(options) };
  // A gateway on any port (--port 0: tests, several at once) puts its mock on any port too.
  const port = settings.mockPort ?? (settings.port === 0 ? 0 : undefined);
  // The CPU tier keeps token blocks: it needs the tokenizer that comes with the events.
  const start = (withEvents: boolean) => startMockOnPort(port, { ...options, ...(withEvents && { kvEvents: {}, ...(cpuBlocksPerRank && { cpuBlocksPerRank }) }) });
  try {
    return { mock: await start(true) };
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'EADDRINUSE') throw error;
    return { mock: await start(false), eventsOff: (error as Error).message };
  }
}

/**
 * The mock on `--mock-port`; without one, on {@link DEFAULT_MOCK_PORT}, where prometheus.yml
 * scrapes it. A taken port is an error that names `--mock-port`: a mock moved elsewhere in
 * silence would leave prometheus.yml scraping whatever holds its port.
 */
export async function startMockOnPort(port: number | undefined, options: MockVllmOptions, defaultPort = DEFAULT_MOCK_PORT): Promise<MockVllm> {
  const chosen = port ?? defaultPort;
  try {
    return await startMockVllm({ ...options, port: chosen });
  } catch (error) {
    const where = port === undefined ? ', where example-server/prometheus.yml scrapes it,' : '';
    throw listenProblem(error, `the embedded mock vLLM${where}`, hostPort(options.host ?? '127.0.0.1', chosen), 'give --mock-port N (0: any free port; prometheus.yml\'s vllm job then needs that port)');
  }
}

function hostPort(host: string, port: number): string {
  return host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
}

/** An embedded mock as an upstream, subscribed to its KV events when it publishes them. */
function embeddedUpstream(mock: MockVllm, name: string, dpSize: number, role: 'prefill' | 'both', rankHeader: RankHeaderMode): UpstreamOptions {
  const events = mock.kvEvents;
  return {
    url: mock.url,
    name,
    dataParallelSize: dpSize,
    role,
    rankHeader,
    ...(mock.bootstrapPort !== undefined && { bootstrapPort: mock.bootstrapPort }),
    ...(events && { kvEvents: { endpoint: events.endpoints, replayEndpoint: events.replayEndpoints, topic: events.topic } }),
  };
}

function describe(url: string, upstreams: readonly UpstreamEntry[], settings: GatewaySettings, mock: MockVllm | undefined, admission: AdmissionOptions | undefined): string {
  const targets = upstreams
    .map((upstream) => {
      const where = 'dns' in upstream && upstream.dns !== undefined ? `every address of ${upstream.dns.name}:${upstream.dns.port}` : mock ? `embedded mock vLLM ${upstream.url}` : redactUrl(upstream.url!);
      const models = upstream.models === undefined ? '' : `, models ${upstream.models.join(', ')}`;
      const role = upstream.role && upstream.role !== 'both' ? `, ${upstream.role}` : '';
      return `${where} ranks ${rankList(upstream)} (${headerList(upstream)}${models}${role})`;
    })
    .join(', ');
  const hints = settings.trustHints ? `hints trusted, invalid → ${settings.onInvalid}` : 'hints untrusted';
  const exact = settings.policy === 'prefix-aware' && upstreams.some((upstream) => upstream.kvEvents !== undefined) ? ' (exact, on KV events)' : '';
  const pd = settings.disaggregation ? `; prefill/decode disaggregated (${settings.disaggregation.connector}, prefill policy prefix-aware)` : '';
  return `express-dp-router listening on ${url} → ${targets}; policy ${settings.policy}${exact}${pd}; ${hints}${servicesSummary(settings, admission)}; metrics at ${url}/metrics`;
}

function ranksOf(upstream: UpstreamEntry): number[] {
  const start = upstream.startRank ?? 0;
  return [...(upstream.ranks ?? Array.from({ length: upstream.dataParallelSize ?? 1 }, (_, offset) => start + offset))];
}

function rankList(upstream: UpstreamEntry): string {
  return shortList(ranksOf(upstream));
}

/** What each rank is sent as, in the ranks' order: `X-data-parallel-rank 0-3` for ranks 4-7 of a node starting at 4. */
function headerList(upstream: UpstreamEntry): string {
  const mode = upstream.rankHeader ?? 'local';
  if (mode === 'none') return 'no rank header';
  const start = mode === 'global' ? 0 : upstream.startRank ?? 0;
  return `X-data-parallel-rank ${shortList(ranksOf(upstream).map((rank) => rank - start))}${mode === 'global' ? ', global' : ''}`;
}

function shortList(ranks: readonly number[]): string {
  const contiguous = ranks.every((rank, index) => index === 0 || rank === ranks[index - 1] + 1);
  return contiguous && ranks.length > 2 ? `${ranks[0]}-${ranks[ranks.length - 1]}` : ranks.join(',');
}
