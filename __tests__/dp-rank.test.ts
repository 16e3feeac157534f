import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import express from 'express';
import type { IncomingMessage as LegacyIncomingMessage } from 'http';
import { createProxyMiddleware, fixRequestBody } from 'http-proxy-middleware';
import { request as httpRequest, type ClientRequest, type IncomingMessage, type ServerResponse } from 'node:http';
import { Registry } from 'prom-client';
import request from 'supertest';
import { dpRank, dpRouter, type DpRank, type DpRankDecision, type Options } from '../lib';
import { expressMajor, metricValue, serve, startGateway, type TestGateway } from './helpers/app';
import { startEchoUpstream, type EchoUpstream } from './helpers/echo-upstream';
import { rawRequest } from './helpers/raw-http';
import { seedScenario } from './helpers/fixtures';
import { waitFor } from './helpers/wait';

/** Set per jest project in package.json (`globals`), so a mapping that silently fails is caught. */
declare const EXPECTED_EXPRESS_MAJOR: number;

type Forwarder = 'http-proxy-middleware' | 'node:http';

/** A gateway built as a user with their own proxy builds it: dpRank, then their forwarder. */
interface DpRankGateway {
  url: string;
  rank: DpRank;
  registry: Registry;
  /** `req.dpRank` as the middleware after dpRank saw it, one per forwarded request. */
  decisions: DpRankDecision[];
  /** `req.body` as the forwarder saw it. */
  bodies: unknown[];
  close(): Promise<void>;
}

/** http-proxy-middleware picking its target per request from the decision. */
function proxyForwarder(): express.RequestHandler {
  return createProxyMiddleware<IncomingMessage, ServerResponse>({
    router: (req) => req.dpRank!.url,
    on: { proxyReq: fixRequestBody },
  });
}

/** A hand-written forwarder on node:http: copies method, path and headers, pipes both ways. */
function httpForwarder(req: express.Request, res: express.Response, next: express.NextFunction): void {
  const decision = req.dpRank!;
  const headers = { ...req.headers };
  const body = req.body === undefined ? undefined : Buffer.from(JSON.stringify(req.body));
  if (body !== undefined) {
    headers['content-length'] = String(body.length);
    delete headers['transfer-encoding'];
  }
  const upstreamRequest: ClientRequest = httpRequest(`${decision.url}${req.originalUrl}`, { method: req.method, headers }, (upstreamResponse) => {
    res.writeHead(upstreamResponse.statusCode ?? 502, upstreamResponse.headers);
    upstreamResponse.pipe(res);
  });
  upstreamRequest.on('error', (error) => (res.headersSent ? res.destroy() : next(error)));
  // The client left: stop the upstream work too.
  res.on('close', () => upstreamRequest.destroy());
  if (body !== undefined) upstreamRequest.end(body);
  else req.pipe(upstreamRequest);
}

async function startDpRankGateway(options: Options, forwarder: Forwarder): Promise<DpRankGateway> {
  const registry = new Registry();
  const rank = dpRank({ metrics: { registry }, ...options });
  const decisions: DpRankDecision[] = [];
  const bodies: unknown[] = [];
  const app = express();
  app.get('/metrics', rank.metrics);
  app.use(rank);
  app.use((req, _res, next) => {
    decisions.push(req.dpRank!);
    bodies.push(req.body);
    next();
  });
  app.use(forwarder === 'http-proxy-middleware' ? proxyForwarder() : httpForwarder);
  const served = await serve(app);
  return {
    url: served.url,
    rank,
    registry,
    decisions,
    bodies,
    close: async () => {
      await served.close();
      await rank.close();
    },
  };
}

/** Compile-time checks (`npm run typecheck`): `req.dpRank` is typed on every request type users meet. */
function typeChecks(req: express.Request, raw: IncomingMessage, legacy: LegacyIncomingMessage): void {
  const decision: DpRankDecision | undefined = req.dpRank;
  const rank: number | undefined = raw.dpRank?.rank;
  const source: 'hint' | 'assigned' | undefined = legacy.dpRank?.source;
  const headerValue: string | undefined = req.dpRank?.headerValue;
  // @ts-expect-error the decision is read-only
  req.dpRank!.rank = 3;
  // @ts-expect-error the rank is a number
  req.dpRank?.rank.toUpperCase();
  void [decision, rank, source, headerValue];
}
void typeChecks;

let upstream: EchoUpstream;
let gateway: DpRankGateway | undefined;
let routerGateway: TestGateway | undefined;

beforeEach(async () => {
  upstream = await startEchoUpstream();
});
afterEach(async () => {
  await gateway?.close();
  await routerGateway?.close();
  gateway = undefined;
  routerGateway = undefined;
  await upstream.close();
});

const seed = (extra: Partial<Options> = {}): Options => seedScenario(upstream.url, extra);

const inflight = (rank: DpRank) => rank.endpoints().reduce((sum, endpoint) => sum + endpoint.inflight, 0);

/** Sends a request with node:http and resolves once it is dispatched; the caller ends or aborts it. */
function openRequest(url: string): ClientRequest {
  const client = httpRequest(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' } });
  client.on('error', () => undefined);
  client.end(JSON.stringify({ model: 'm', prompt: 'hold' }));
  return client;
}

it(`runs on the Express major its jest project asks for (${expressMajor})`, () => {
  expect(expressMajor).toBe(EXPECTED_EXPRESS_MAJOR);
});

describe.each<Forwarder>(['http-proxy-middleware', 'node:http'])('dpRank with %s as the proxy', (forwarder) => {
  it('forwards one clean rank header and sets req.dpRank', async () => {
    gateway = await startDpRankGateway(seed({ policy: 'round-robin' }), forwarder);
    const body = JSON.stringify({ model: 'm', prompt: 'hi' });
    for (let index = 0; index < 8; index++) {
      const answer = await rawRequest(
        gateway.url,
        'POST /v1/completions HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\nContent-Type: application/json\r\n' +
          `X-Data-Parallel-Rank: 6\r\nx-data-parallel-rank: +3\r\nContent-Length: ${body.length}\r\n\r\n${body}`,
      );
      expect(answer).toMatch(/^HTTP\/1\.1 200 /);
    }
    expect(upstream.seen.map((seen) => seen.rankHeaders)).toEqual([['0'], ['2'], ['4'], ['6'], ['0'], ['2'], ['4'], ['6']]);
    expect(upstream.seen.every((seen) => seen.url === '/v1/completions' && JSON.parse(seen.body.toString()).prompt === 'hi')).toBe(true);
    expect(gateway.decisions[1]).toEqual({ upstream: 'node-a', url: upstream.url, rank: 2, source: 'assigned', headerValue: '2' });
    expect(Object.isFrozen(gateway.decisions[1])).toBe(true);
    expect(await metricValue(gateway.registry, 'dp_router_rank_hints_total', { outcome: 'untrusted' })).toBe(8);
  });

  it('honours a trusted hint and says so in req.dpRank', async () => {
    gateway = await startDpRankGateway(seed({ hints: { trust: (req) => req.headers.authorization === 'Bearer ops' } }), forwarder);
    const trusted = await request(gateway.url).post('/v1/chat/completions').set('authorization', 'Bearer ops').set('x-data-parallel-rank', '4').send({});
    expect(trusted.status).toBe(200);
    expect(upstream.seen[0].rankHeaders).toEqual(['4']);
    expect(gateway.decisions[0]).toMatchObject({ rank: 4, source: 'hint', headerValue: '4' });

    const untrusted = await request(gateway.url).post('/v1/chat/completions').set('x-data-parallel-rank', '4').send({});
    expect(untrusted.status).toBe(200);
    expect(upstream.seen[1].rankHeaders).toHaveLength(1);
    expect(gateway.decisions[1].source).toBe('assigned');
  });

  it("sends the local rank for rankHeader: 'local' and no header for 'none'", async () => {
    gateway = await startDpRankGateway(
      {
        upstreams: [
          { url: upstream.url, name: 'hybrid', startRank: 4, dataParallelSize: 4, rankHeader: 'local' },
          { url: upstream.url, name: 'external', startRank: 8, rankHeader: 'none' },
        ],
        hints: { trust: true },
      },
      forwarder,
    );
    await request(gateway.url).post('/v1/completions').set('x-data-parallel-rank', '6').send({}).expect(200);
    await request(gateway.url).post('/v1/completions').set('x-data-parallel-rank', '8').send({}).expect(200);
    expect(upstream.seen.map((seen) => seen.rankHeaders)).toEqual([['2'], []]);
    expect(gateway.decisions[0]).toEqual({ upstream: 'hybrid', url: upstream.url, rank: 6, source: 'hint', headerValue: '2' });
    expect(gateway.decisions[1]).toEqual({ upstream: 'external', url: upstream.url, rank: 8, source: 'hint', headerValue: undefined });
  });

  it('reads a body-field hint (SGLang) and leaves the body parsed for the proxy to forward', async () => {
    gateway = await startDpRankGateway(seed({ hints: { trust: true, bodyField: 'routed_dp_rank' } }), forwarder);
    const payload = { model: 'm', prompt: 'héllo', routed_dp_rank: 6 };
    const response = await request(gateway.url).post('/v1/completions').send(payload);
    expect(response.status).toBe(200);
    expect(upstream.seen[0].rankHeaders).toEqual(['6']);
    expect(JSON.parse(upstream.seen[0].body.toString('utf8'))).toEqual(payload);
    expect(gateway.bodies[0]).toEqual(payload);
    expect(gateway.decisions[0]).toMatchObject({ rank: 6, source: 'hint' });
  });

  it('hands on the router\'s rank in an untrusted body hint field, never the client\'s', async () => {
    gateway = await startDpRankGateway(seed({ hints: { bodyField: 'routed_dp_rank' } }), forwarder);
    const response = await request(gateway.url).post('/v1/completions').send({ prompt: 'x', routed_dp_rank: 99 });
    expect(response.status).toBe(200);
    const rank = gateway.decisions[0].rank;
    expect(gateway.bodies[0]).toEqual({ prompt: 'x', routed_dp_rank: rank });
    expect(JSON.parse(upstream.seen[0].body.toString('utf8'))).toEqual({ prompt: 'x', routed_dp_rank: rank });
    expect(await metricValue(gateway.registry, 'dp_router_rank_hints_total', { outcome: 'untrusted' })).toBe(1);
  });

  it('answers a rejected hint itself: the proxy never runs', async () => {
    gateway = await startDpRankGateway(seed({ hints: { trust: true, onInvalid: 'reject' } }), forwarder);
    const response = await request(gateway.url).post('/v1/completions').set('x-data-parallel-rank', '3').send({});
    expect(response.status).toBe(400);
    expect(response.body.error).toMatchObject({ type: 'BadRequestError', param: 'x-data-parallel-rank', code: 400 });
    expect(upstream.seen).toHaveLength(0);
    expect(gateway.decisions).toHaveLength(0);
  });

  it('holds the in-flight slot while the response runs and releases it when it ends', async () => {
    gateway = await startDpRankGateway(seed(), forwarder);
    let release: (() => void) | undefined;
    upstream.respond = (_req, res) => {
      release = () => res.end('{"done":true}');
      res.writeHead(200, { 'content-type': 'application/json' });
    };
    const client = openRequest(gateway.url);
    const answered = new Promise<string>((resolve) => {
      client.on('response', (response) => {
        let text = '';
        response.setEncoding('utf8');
        response.on('data', (chunk: string) => (text += chunk));
        response.on('end', () => resolve(text));
      });
    });
    await waitFor(() => release !== undefined, 5_000, 'timed out waiting for the upstream to get the request');
    expect(inflight(gateway.rank)).toBe(1);
    expect(await metricValue(gateway.registry, 'dp_router_inflight_requests')).toBe(1);

    release!();
    expect(await answered).toBe('{"done":true}');
    await waitFor(() => inflight(gateway!.rank) === 0, 5_000, 'timed out waiting for the slot to be released');
    expect(await metricValue(gateway.registry, 'dp_router_inflight_requests')).toBe(0);
    expect(await metricValue(gateway.registry, 'dp_router_requests_total')).toBe(1);
  });

  it('releases the in-flight slot when the client aborts', async () => {
    gateway = await startDpRankGateway(seed(), forwarder);
    let upstreamClosed = false;
    upstream.respond = (_req, res) => {
      res.on('close', () => (upstreamClosed = true));
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: {"partial":true}\n\n');
    };
    const client = openRequest(gateway.url);
    await waitFor(() => upstream.seen.length === 1, 5_000, 'timed out waiting for the upstream to get the request');
    expect(inflight(gateway.rank)).toBe(1);

    client.destroy();
    await waitFor(() => inflight(gateway!.rank) === 0, 5_000, 'timed out waiting for the slot to be released');
    expect(await metricValue(gateway.registry, 'dp_router_inflight_requests')).toBe(0);
    await waitFor(() => upstreamClosed, 5_000, 'timed out waiting for the proxy to drop the upstream request');
  });
});

describe('exposeDecision', () => {
  it('is off by default: no decision header', async () => {
    gateway = await startDpRankGateway(seed(), 'http-proxy-middleware');
    const response = await request(gateway.url).post('/v1/completions').send({});
    expect(response.status).toBe(200);
    expect(response.headers['x-dp-router-decision']).toBeUndefined();
  });

  it.each<Forwarder>(['http-proxy-middleware', 'node:http'])('dpRank with %s answers X-DP-Router-Decision', async (forwarder) => {
    gateway = await startDpRankGateway(seed({ exposeDecision: true, hints: { trust: true } }), forwarder);
    const hinted = await request(gateway.url).post('/v1/completions').set('x-data-parallel-rank', '4').send({});
    expect(hinted.headers['x-dp-router-decision']).toBe('upstream=node-a; rank=4; source=hint');
    const assigned = await request(gateway.url).post('/v1/completions').send({});
    expect(assigned.headers['x-dp-router-decision']).toBe(`upstream=node-a; rank=${gateway.decisions[1].rank}; source=assigned`);
  });

  it('dpRouter answers X-DP-Router-Decision, and not on a rejected hint', async () => {
    routerGateway = await startGateway(seed({ exposeDecision: true, hints: { trust: true, onInvalid: 'reject' } }), '/v1');
    const hinted = await request(routerGateway.url).post('/v1/completions').set('x-data-parallel-rank', '6').send({});
    expect(hinted.status).toBe(200);
    expect(hinted.headers['x-dp-router-decision']).toBe('upstream=node-a; rank=6; source=hint');
    expect(upstream.seen[0].rankHeaders).toEqual(['6']);

    const rejected = await request(routerGateway.url).post('/v1/completions').set('x-data-parallel-rank', '5').send({});
    expect(rejected.status).toBe(400);
    expect(rejected.headers['x-dp-router-decision']).toBeUndefined();
  });

  it('dpRouter stays silent by default', async () => {
    routerGateway = await startGateway(seed());
    const response = await request(routerGateway.url).post('/v1/completions').send({});
    expect(response.status).toBe(200);
    expect(response.headers['x-dp-router-decision']).toBeUndefined();
  });
});

describe('two routers on one request', () => {
  /** dpRank in front of dpRouter, e.g. an outer app that only observes decisions. */
  async function startStacked() {
    const outer = dpRank({ metrics: false, ...seed() });
    const inner = dpRouter({ metrics: false, ...seed({ upstreams: [{ url: upstream.url, name: 'node-b', dataParallelSize: 4 }] }) });
    const app = express();
    app.use(outer, inner);
    const served = await serve(app);
    return {
      url: served.url,
      outer,
      inner,
      close: async () => {
        await served.close();
        await Promise.all([outer.close(), inner.close()]);
      },
    };
  }

  it.each(['ends', 'is aborted'])('each holds its own slot and releases it when the response %s', async (ending) => {
    const stacked = await startStacked();
    try {
      let release: (() => void) | undefined;
      upstream.respond = (_req, res) => {
        release = () => res.end('{"done":true}');
        res.writeHead(200, { 'content-type': 'application/json' });
      };
      const client = openRequest(stacked.url);
      await waitFor(() => release !== undefined, 5_000, 'timed out waiting for the upstream to get the request');
      expect([inflight(stacked.outer), inflight(stacked.inner as unknown as DpRank)]).toEqual([1, 1]);
      // The inner router's header is the one forwarded.
      expect(upstream.seen[0].rankHeaders).toHaveLength(1);

      if (ending === 'ends') release!();
      else client.destroy();
      await waitFor(() => inflight(stacked.outer) === 0 && inflight(stacked.inner as unknown as DpRank) === 0, 5_000, 'timed out waiting for both slots to be released');
      expect(stacked.outer.endpoints().map((endpoint) => endpoint.inflight)).toEqual([0, 0, 0, 0]);
      expect(stacked.inner.endpoints().map((endpoint) => endpoint.inflight)).toEqual([0, 0, 0, 0]);
    } finally {
      await stacked.close();
    }
  });
});
