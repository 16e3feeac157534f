/**
 * One contender of the overhead benchmark, run as its own process:
 *
 *   contender.ts <kind> <upstream-url>
 *
 * kinds: `baseline` (Express + http-proxy-middleware with a keep-alive agent, what a user
 * would mount themselves), `baseline-json` (the same behind `express.json()` with
 * `fixRequestBody`), `router:<policy>` (Express + dpRouter with that policy, default
 * options), `router:<policy>+nometrics` / `+noretry` / `+nobuffer` / `+noreceipts` (the same with
 * `metrics: false` / `retries: false` / `requestBuffering: false` / `receipts: false`, diagnostic), `+pino` (a pino logger at info, so the per-decision debug
 * line is checked and skipped), `+otel` (the OpenTelemetry SDK registered and a recording
 * span made active per request, as the HTTP instrumentation would: the router traces) and
 * `+otelidle` (the same span, with a non-recording stand-in made active in its place: the
 * router finds nothing to record, so `+otel` against it is the router's own tracing work),
 * `+pools1` / `+pools2` (routing by model: one pool serving the request's model, or two),
 * `+exact` (with `prefix-aware`: exact prefix routing, the mock's tokenizer and a KV-event
 * publisher per rank in this process: exact-contender.ts),
 * and `bare-http` (a bare node:http proxy without Express, for context).
 * The router comes from `DP_ROUTER_BENCH_LIB` (contender-process.ts sets it: the compiled
 * package, or the sources under tsx); by default, the sources next to this file.
 * Prints `READY <port>`.
 */
import { Agent, createServer, request as httpRequest } from 'node:http';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import express from 'express';
import { createProxyMiddleware, fixRequestBody } from 'http-proxy-middleware';
import type { PolicyName } from '../../lib/types';
import { ROUTER_UPSTREAM } from './scenario';

// A runtime require, so that the transpiled contender loads dist/ and never the sources.
const library = process.env.DP_ROUTER_BENCH_LIB ?? `${__dirname}/../../lib`;
const { dpRouter } = require(library) as typeof import('../../lib');

const [kind, upstreamUrl] = process.argv.slice(2);
if (!kind || !upstreamUrl) {
  process.stderr.write('usage: contender.ts <baseline|baseline-json|router:POLICY> <upstream-url>\n');
  process.exit(2);
}

if (kind === 'bare-http') startBareProxy(upstreamUrl);

const app = express();
app.disable('x-powered-by');
if (process.env.DP_ROUTER_BENCH_PROBE) app.get('/bench-probe', probe());
if (kind === 'bare-http') {
  // served by startBareProxy
} else if (kind === 'baseline' || kind === 'baseline-json') {
  const agent = new Agent({ keepAlive: true });
  if (kind === 'baseline-json') app.use(express.json({ limit: '16mb' }));
  app.use(
    createProxyMiddleware({
      target: upstreamUrl,
      agent,
      changeOrigin: true,
      on: kind === 'baseline-json' ? { proxyReq: fixRequestBody } : {},
    }),
  );
} else if (kind === 'baseline-routeropts') {
  // Diagnostic: the baseline with dpRouter's http-proxy-middleware settings (LIFO agent,
  // default plugins ejected, three event handlers doing nothing), to tell the proxy
  // settings' cost from the router's own.
  const agent = new Agent({ keepAlive: true, scheduling: 'lifo' });
  const noop = () => undefined;
  app.use(
    createProxyMiddleware({
      target: upstreamUrl,
      agent,
      changeOrigin: true,
      ejectPlugins: true,
      plugins: [(proxyServer) => ['proxyReq', 'proxyRes', 'error'].forEach((event) => proxyServer.on(event, noop))],
    }),
  );
} else if (kind.startsWith('router:')) {
  // `router:<policy>[+nometrics][+noretry]`: the flags (diagnostic, not in the default set)
  // switch off prom-client metrics or retries (whose body buffering) to isolate their share.
  const [name, ...flags] = kind.slice('router:'.length).split('+');
  const policy = name as PolicyName;
  const extra: Record<string, unknown> = {};
  let upstreams: unknown[] = [{ url: upstreamUrl, ...ROUTER_UPSTREAM }];
  for (const flag of flags) {
    if (flag === 'nometrics') extra.metrics = false;
    else if (flag === 'noretry') extra.retries = false;
    // Admission configured with room to spare: what it costs when nothing waits.
    else if (flag === 'admission') extra.admission = { maxInflightPerRank: 1_000_000, tenant: { header: 'x-tenant-id', trust: true } };
    // Admission with a token budget no tenant reaches: what reading each answer's usage costs.
    else if (flag === 'tokens') extra.admission = { maxInflightPerRank: 1_000_000, tenant: { header: 'x-tenant-id', trust: true }, tokens: { perMinute: 1e12 } };
    // Prefill/decode disaggregation (NIXL): both roles on the benchmark's upstream, which answers a prefill leg at once.
    else if (flag === 'pd') {
      upstreams = [
        { url: upstreamUrl, name: 'bench-prefill', ...ROUTER_UPSTREAM, role: 'prefill' },
        { url: upstreamUrl, name: 'bench-decode', ...ROUTER_UPSTREAM, role: 'decode' },
      ];
      extra.disaggregation = { connector: 'nixl' };
    }
    else if (flag === 'nobuffer') extra.requestBuffering = false;
    else if (flag === 'noreceipts') extra.receipts = false;
    else if (flag === 'pino') extra.logger = require('pino')({ level: 'info' }, require('pino').destination('/dev/null'));
    else if (flag === 'otel' || flag === 'otelidle') app.use(spanPerRequest(flag === 'otel'));
    // Routing by model: one pool serving the benchmark's model, or two (the request's model on ranks 0 and 2).
    else if (flag === 'pools1') upstreams = [{ url: upstreamUrl, ...ROUTER_UPSTREAM, models: ['bench'] }];
    else if (flag === 'pools2') {
      upstreams = [
        { url: upstreamUrl, name: 'bench-pool', dataParallelSize: 8, ranks: [0, 2], models: ['bench'] },
        { url: upstreamUrl, name: 'other-pool', dataParallelSize: 8, ranks: [4, 6], models: ['other'] },
      ];
    }
    // Exact prefix routing: the mock's tokenizer files and a KV-event publisher per rank in this
    // process, so that every request is tokenized and looked up (exact-contender.ts).
    // Diagnostic: the decision header on every answer (`; index=exact` tells whether +exact scored it).
    else if (flag === 'decision') extra.exposeDecision = true;
    // Peers (bench/overhead/peers.ts): UDP to the addresses in DP_ROUTER_BENCH_PEERS, or Redis at its URL.
    else if (flag === 'peers' || flag === 'peersredis') extra.peers = peersOption(flag === 'peersredis');
    else if (flag === 'exact') extra.prefixAware = exactRouting(upstreams as Array<Record<string, unknown>>);
    else throw new Error(`unknown router flag '+${flag}'`);
  }
  app.use(dpRouter({ upstreams: upstreams as never, policy, ...extra }));
} else {
  process.stderr.write(`unknown contender kind '${kind}'\n`);
  process.exit(2);
}

if (kind !== 'bare-http') {
  const server = app.listen(0, '127.0.0.1', () => {
    process.stdout.write(`READY ${(server.address() as AddressInfo).port}\n`);
  });
  server.keepAliveTimeout = 60_000;
  server.headersTimeout = 65_000;
}
process.on('SIGTERM', () => process.exit(0));
// The parent may go away first (Ctrl-C, a failed start): a closed pipe is no reason to crash.
process.stdout.on('error', () => undefined);

/**
 * `+peers` / `+peersredis`: `DP_ROUTER_BENCH_PEERS` is `{ listen, addresses }` (UDP) or `{ redis }`
 * (a URL; this process connects with ioredis), the secret the same for every contender.
 */
function peersOption(redis: boolean): Record<string, unknown> {
  const given = JSON.parse(process.env.DP_ROUTER_BENCH_PEERS ?? '{}') as { listen?: string; addresses?: string[]; redis?: string };
  const secret = 'bench peers share this secret';
  // `--announce-ms` of peers.ts: the option's default when not given.
  const timing = process.env.DP_ROUTER_BENCH_ANNOUNCE_MS === undefined ? {} : { announceMs: Number(process.env.DP_ROUTER_BENCH_ANNOUNCE_MS) };
  if (!redis) return { listen: given.listen, addresses: given.addresses, secret, ...timing };
  const Redis = require('ioredis') as typeof import('ioredis').default;
  return { redis: new Redis(given.redis!), secret, ...timing };
}

/**
 * `GET /bench-probe` (with `DP_ROUTER_BENCH_PROBE`): the event-loop delay since the last call
 * (p50, p99, max in ms, sampled every 5 ms), this process's CPU so far (`process.cpuUsage`) and
 * its memory (`process.memoryUsage`; with `?gc`, after a full collection when started with `--expose-gc`).
 */
function probe(): express.RequestHandler {
  const { monitorEventLoopDelay } = require('node:perf_hooks') as typeof import('node:perf_hooks');
  const delay = monitorEventLoopDelay({ resolution: 5 });
  delay.enable();
  return (req, res) => {
    const cpu = process.cpuUsage();
    if (req.query.gc !== undefined) (globalThis as { gc?: () => void }).gc?.();
    const memory = process.memoryUsage();
    res.json({ p50: delay.percentile(50) / 1e6, p99: delay.percentile(99) / 1e6, max: delay.max / 1e6, cpuUs: cpu.user + cpu.system, rss: memory.rss, heapUsed: memory.heapUsed, external: memory.external });
    delay.reset();
  };
}

/** The floor of any Node proxy: node:http in and out, a keep-alive agent, nothing else. */
function startBareProxy(target: string): void {
  const { hostname, port } = new URL(target);
  const agent = new Agent({ keepAlive: true });
  const bare = createServer((req, res) => {
    const upstream = httpRequest({ agent, host: hostname, port, method: req.method, path: req.url, headers: req.headers }, (upstreamRes) => {
      res.writeHead(upstreamRes.statusCode ?? 502, upstreamRes.headers);
      upstreamRes.pipe(res);
    });
    upstream.on('error', () => {
      res.statusCode = 502;
      res.end();
    });
    req.pipe(upstream);
  });
  bare.keepAliveTimeout = 60_000;
  bare.headersTimeout = 65_000;
  bare.listen(0, '127.0.0.1', () => process.stdout.write(`READY ${(bare.address() as AddressInfo).port}\n`));
}

/**
 * The SDK with every span sampled and kept in memory only as long as it is open (no
 * exporter: exporting is the SDK's cost, not the router's), and one server span per request,
 * made the active one as @opentelemetry/instrumentation-http does (`recording`), or a
 * non-recording span of the same context in its place (the same context switching).
 */
function spanPerRequest(recording: boolean): express.RequestHandler {
  // Loaded only for these contenders, so that the others run without the SDK in memory.
  const api = require('@opentelemetry/api') as typeof import('@opentelemetry/api');
  const { NodeTracerProvider } = require('@opentelemetry/sdk-trace-node') as typeof import('@opentelemetry/sdk-trace-node');
  new NodeTracerProvider().register();
  const tracer = api.trace.getTracer('bench');
  return (req, res, next) => {
    const span = tracer.startSpan(`${req.method} ${req.path}`, { kind: api.SpanKind.SERVER });
    res.once('finish', () => span.end());
    const current = recording ? span : api.trace.wrapSpanContext(span.spanContext());
    api.context.with(api.trace.setSpan(api.context.active(), current), next);
  };
}

/**
 * `+exact`: each upstream gets `kvEvents` naming a ZeroMQ PUB per served rank (no replay
 * endpoint, so a rank is fresh once connected), and the router gets the mock vLLM's tokenizer
 * files. The publishers run in a child process of their own, as an engine's do (under valgrind
 * one in the contender's own process answered ZMTP heartbeats too late: its subscriptions
 * dropped, and the contender routed approximately): ipc sockets in the temporary directory,
 * each publishing one stored block a second, since a rank that published nothing for 10 s after
 * a request with new blocks is taken as stale. The child ends with this process (its stdin
 * closes). The agreement check's `/tokenize` reaches the benchmark's upstream, whose answer
 * carries no tokens: it counts as no check, as an unreachable `/tokenize` does.
 */
function exactRouting(upstreams: Array<Record<string, unknown>>): { tokenizer: string } {
  const root = repositoryRoot();
  const sockets: Array<{ path: string; rank: number }> = [];
  for (const [at, upstream] of upstreams.entries()) {
    const ranks = upstream.ranks as number[];
    const paths = ranks.map((rank) => join(tmpdir(), `dp-router-bench-${process.pid}-${at}-${rank}.ipc`));
    ranks.forEach((rank, i) => sockets.push({ path: paths[i], rank }));
    upstream.kvEvents = { endpoint: paths.map((path) => `ipc://${path}`) };
  }
  const child = spawn(process.execPath, ['-e', publisherSource(), JSON.stringify(sockets)], { cwd: root, stdio: ['pipe', 'ignore', 'inherit'] });
  child.on('exit', (code) => {
    if (code !== 0 && code !== null) process.exit(1);
  });
  process.on('exit', () => child.kill());
  return { tokenizer: join(root, 'example-server', 'mock-vllm', 'tokenizer') };
}

/** The engines' side of `+exact` (a function: hoisted, as the flags are read before the module's constants): binds a PUB per socket and publishes a stored block a second on each. */
function publisherSource(): string {
  return `
const zmq = require('zeromq');
const { Packr } = require('msgpackr');
const { rmSync } = require('node:fs');
const packr = new Packr({ useRecords: false, variableMapSize: true });
const sockets = JSON.parse(process.argv[1]);
const publishers = sockets.map(({ path, rank }) => ({ rank, path, pub: new zmq.Publisher({ linger: 0 }), seq: 0, block: 0 }));
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
process.on('SIGTERM', () => process.exit(0));
process.on('exit', () => publishers.forEach(({ path }) => rmSync(path, { force: true })));
Promise.all(publishers.map(({ pub, path }) => pub.bind('ipc://' + path))).then(() => {
  setInterval(() => {
    for (const one of publishers) {
      const frame = Buffer.alloc(8);
      frame.writeBigInt64BE(BigInt(one.seq++));
      const hash = 1000000 * (one.rank + 1) + (one.block++ % 1000);
      const payload = packr.pack([Date.now() / 1000, [['BlockStored', [hash], null, Array.from({ length: 16 }, (_, i) => i + 1), 16, null, 'GPU']], one.rank]);
      try { one.pub.send(['', frame, payload]).catch(() => undefined); } catch {}
    }
  }, 1000);
}, (error) => { process.stderr.write('+exact publishers: ' + String(error) + '\\n'); process.exit(1); });
`;
}

/** The checkout this contender runs from (it runs from bench/overhead/ or from bench/results/.contender/). */
function repositoryRoot(): string {
  for (let dir = __dirname; dir !== dirname(dir); dir = dirname(dir)) {
    if (existsSync(join(dir, 'example-server', 'mock-vllm', 'tokenizer', 'tokenizer.json'))) return dir;
  }
  throw new Error('+exact: example-server/mock-vllm/tokenizer not found above the contender');
}
