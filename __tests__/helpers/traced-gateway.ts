/**
 * A gateway traced by the real OpenTelemetry SDK, run as its own process (the HTTP and Express
 * instrumentations patch modules as Node loads them, which jest's module registry bypasses):
 *
 *   tsx traced-gateway.ts
 *
 * Sends a few requests through dpRouter to a real upstream and prints one JSON line: the
 * finished spans and what the upstream saw of each request.
 */
import { InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { NodeTracerProvider } from '@opentelemetry/sdk-trace-node';
import { registerInstrumentations } from '@opentelemetry/instrumentation';
import { HttpInstrumentation } from '@opentelemetry/instrumentation-http';
import { ExpressInstrumentation } from '@opentelemetry/instrumentation-express';

const exporter = new InMemorySpanExporter();
const provider = new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
provider.register();
registerInstrumentations({ instrumentations: [new HttpInstrumentation(), new ExpressInstrumentation()] });

/** What the upstream saw of one request. */
export interface SeenByUpstream {
  url: string;
  /** Every raw `traceparent` line, in order. */
  traceparents: string[];
  /** Every raw `tracestate` line, in order. */
  tracestates: string[];
}

/** A finished span, as the test reads it. */
export interface ExportedSpan {
  name: string;
  kind: number;
  traceId: string;
  spanId: string;
  parentSpanId: string | undefined;
  attributes: Record<string, unknown>;
  events: Array<{ name: string; attributes: Record<string, unknown> }>;
  status: { code: number; message?: string };
}

async function main(): Promise<void> {
  // Loaded after the instrumentations, as a traced application loads them, and with require
  // as the example gateway's compiled code does: the Express instrumentation patches what
  // require loads, and then makes a span per middleware and request handler, so the router's
  // decision runs under Express's spans, not the HTTP server span.
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const express = require('express') as typeof import('express');
  const { createServer } = await import('node:http');
  const { dpRouter } = await import('../../lib');
  const { Registry } = await import('prom-client');

  // The upstream (jest's helpers are not for a process of its own): records every raw
  // `traceparent` line of each request.
  const seen: SeenByUpstream[] = [];
  // Requests tagged `hold` are answered once `release` is called.
  let release: () => void = () => undefined;
  const released = new Promise<void>((resolve) => (release = resolve));
  const upstream = createServer((req, res) => {
    const traceparents: string[] = [];
    const tracestates: string[] = [];
    for (let index = 0; index < req.rawHeaders.length; index += 2) {
      const name = req.rawHeaders[index].toLowerCase();
      if (name === 'traceparent') traceparents.push(req.rawHeaders[index + 1]);
      if (name === 'tracestate') tracestates.push(req.rawHeaders[index + 1]);
    }
    seen.push({ url: req.url ?? '', traceparents, tracestates });
    req.resume();
    req.on('end', async () => {
      if (req.url?.includes('hold') === true) await released;
      res.writeHead(200, { 'content-type': 'application/json' });
      // What vLLM with --enable-prompt-tokens-details reports: the receipts of prefix-aware picks.
      res.end('{"usage":{"prompt_tokens":100,"total_tokens":101,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":96}}}');
    });
  });
  await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve));
  const upstreamUrl = `http://127.0.0.1:${(upstream.address() as { port: number }).port}`;
  // A port with nothing listening: connections to it are refused, and retried elsewhere.
  const refused = createServer();
  await new Promise<void>((resolve) => refused.listen(0, '127.0.0.1', resolve));
  const refusedUrl = `http://127.0.0.1:${(refused.address() as { port: number }).port}`;
  await new Promise<void>((resolve) => refused.close(() => resolve()));

  const routed = dpRouter({ upstreams: [{ url: upstreamUrl, name: 'echo', dataParallelSize: 2 }], hints: { trust: true }, metrics: false, logger: false });
  const retried = dpRouter({
    upstreams: [
      { url: refusedUrl, name: 'refused' },
      { url: upstreamUrl, name: 'echo' },
    ],
    policy: 'round-robin',
    metrics: false,
    logger: false,
    outlierDetection: { consecutiveFailures: 1 },
  });
  const failing = dpRouter({ upstreams: [{ url: refusedUrl, name: 'refused' }], metrics: false, logger: false });
  const prefixed = dpRouter({ upstreams: [{ url: upstreamUrl, name: 'echo', dataParallelSize: 4 }], policy: 'prefix-aware', metrics: false, logger: false, receipts: { usageEvery: 1 } });
  // One seat: a request waits in the admission queue while another holds it.
  const queuedRegistry = new Registry();
  const queued = dpRouter({
    upstreams: [{ url: upstreamUrl, name: 'echo' }],
    policy: 'prefix-aware',
    admission: { maxInflightPerRank: 1 },
    metrics: { registry: queuedRegistry },
    logger: false,
    receipts: { usageEvery: 1 },
  });
  // A token store that answers late while `gated` (as a shared one across a network may): each
  // request's pick is made before its reservation is answered, and another's may come between.
  const counts = new Map<string, number>();
  let gated = false;
  const late: Array<() => void> = [];
  const answered = <T>(value: () => T): T | Promise<T> => (gated ? new Promise<T>((resolve) => late.push(() => resolve(value()))) : value());
  const store = {
    kind: 'late',
    read: (tenant: string, window: number) => answered(() => ({ current: counts.get(`${tenant}:${window}`) ?? 0, previous: counts.get(`${tenant}:${window - 1}`) ?? 0 })),
    add: (tenant: string, window: number, tokens: number) => void counts.set(`${tenant}:${window}`, (counts.get(`${tenant}:${window}`) ?? 0) + tokens),
  };
  const reserved = dpRouter({ upstreams: [{ url: upstreamUrl, name: 'echo' }], policy: 'prefix-aware', admission: { tokens: { perMinute: 1_000_000, store } }, metrics: false, logger: false, receipts: { usageEvery: 1 } });
  const app = express();
  app.use('/queued', queued);
  app.use('/reserved', reserved);
  app.use('/retried', retried);
  app.use('/failing', failing);
  app.use('/prefixed', prefixed);
  app.use(routed);
  const server = createServer(app);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const base = `http://127.0.0.1:${(server.address() as { port: number }).port}`;

  const answers: Record<string, number> = {};
  const send = async (name: string, path: string, headers: Record<string, string> = {}, body = '{"prompt":"hi"}') => {
    const response = await fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });
    await response.arrayBuffer();
    answers[name] = response.status;
  };
  await send('assigned', '/v1/completions?case=assigned');
  await send('hinted', '/v1/completions?case=hinted', { 'x-data-parallel-rank': '1', traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', tracestate: 'vendor=caller' });
  // A `tracestate` with no `traceparent` belongs to no trace: the gateway starts its own.
  await send('state-only', '/v1/completions?case=state-only', { tracestate: 'vendor=stray' });
  await send('retried', '/retried/v1/completions?case=retried');
  await send('failing', '/failing/v1/completions?case=failing');
  // Eight 64-character blocks: new on the first request, all held by its rank on the second.
  const prompt = JSON.stringify({ prompt: 'You are a careful assistant who answers in short sentences. '.repeat(9) });
  await send('prefix-new', '/prefixed/v1/completions?case=prefix-new', {}, prompt);
  await send('prefix-seen', '/prefixed/v1/completions?case=prefix-seen', {}, prompt);

  // The first waiting request's prompt is held whole on the only endpoint; the second's, picked
  // while the first waits, is new there. Each span carries its own pick's share.
  const queueDepth = async () => (await queuedRegistry.getSingleMetric('dp_router_queue_depth')!.get()).values.reduce((sum, { value }) => sum + value, 0);
  const holding = send('queued-hold', '/queued/v1/completions?case=queued-hold', {}, prompt);
  while (!seen.some((request) => request.url.endsWith('case=queued-hold'))) await new Promise((resolve) => setTimeout(resolve, 5));
  const first = send('queued-first', '/queued/v1/completions?case=queued-first', {}, prompt);
  while ((await queueDepth()) < 1) await new Promise((resolve) => setTimeout(resolve, 5));
  const other = JSON.stringify({ prompt: 'Translate every sentence into French, keeping the original punctuation. '.repeat(8) });
  const second = send('queued-second', '/queued/v1/completions?case=queued-second', {}, other);
  while ((await queueDepth()) < 2) await new Promise((resolve) => setTimeout(resolve, 5));
  release();
  await Promise.all([holding, first, second]);

  // The same with the reservations answered late: the first's share was read after the second's pick.
  await send('reserved-warm', '/reserved/v1/completions?case=reserved-warm', {}, prompt);
  gated = true;
  const reservedFirst = send('reserved-first', '/reserved/v1/completions?case=reserved-first', {}, prompt);
  while (late.length < 1) await new Promise((resolve) => setTimeout(resolve, 5));
  const reservedSecond = send('reserved-second', '/reserved/v1/completions?case=reserved-second', {}, other);
  while (late.length < 2) await new Promise((resolve) => setTimeout(resolve, 5));
  gated = false;
  for (const answer of late.splice(0)) answer();
  await Promise.all([reservedFirst, reservedSecond]);

  await provider.forceFlush();
  const spans: ExportedSpan[] = exporter.getFinishedSpans().map((span) => ({
    name: span.name,
    kind: span.kind,
    traceId: span.spanContext().traceId,
    spanId: span.spanContext().spanId,
    parentSpanId: span.parentSpanContext?.spanId,
    attributes: { ...span.attributes },
    events: span.events.map((event) => ({ name: event.name, attributes: { ...event.attributes } })),
    status: { ...span.status },
  }));
  process.stdout.write(`${JSON.stringify({ spans, seen, answers })}\n`);

  server.closeAllConnections();
  server.close();
  upstream.closeAllConnections();
  upstream.close();
  await Promise.all([routed.close(), retried.close(), failing.close(), prefixed.close(), queued.close(), reserved.close()]);
  await provider.shutdown();
}

main().catch((error: unknown) => {
  process.stderr.write(`${error instanceof Error ? error.stack : String(error)}\n`);
  process.exit(1);
});
