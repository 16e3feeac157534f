import { afterEach, describe, expect, it } from '@jest/globals';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { request as httpRequest } from 'node:http';
import { Registry } from 'prom-client';
import { sendError } from '../../lib/errors';
import { createUpstreamProxy, type TryOutcomes, type UpstreamProxy } from '../../lib/forward/proxy';
import { parseOptions } from '../../lib/options';
import { RouteState, type RouteReports } from '../../lib/request/route-state';
import { RouterServices } from '../../lib/compose/services';
import { exchange, serve, startEchoUpstream, waitFor, type EchoUpstream } from '../helpers';

const running: Array<{ close(): Promise<void> }> = [];
afterEach(async () => {
  await Promise.all(running.splice(0).map((thing) => thing.close()));
});

/**
 * A real server whose handler sends each request through `proxies[0]` (one per upstream, made by
 * createUpstreamProxy), keeping what it sent in `sent`.
 */
async function start(urls: readonly string[]) {
  const registry = new Registry();
  const services = new RouterServices(parseOptions({ upstreams: urls.map((url, index) => ({ url, name: `u${index}` })), metrics: { registry } }, 'dpRouter'));
  const reports: RouteReports = { config: services.config, events: services.events, hooks: services.hooks };
  const proxies: UpstreamProxy[] = [];
  const outcomes: TryOutcomes = {
    answered: (route) => route.responding(),
    failed: (route, _req, res) => {
      if (route.settle()) sendError(res, 502, 'BadGatewayError', 'the upstream failed');
    },
    cutShort: (_route, _req, res) => res.destroy(),
    refused: (_route, _req, res) => res.destroy(),
  };
  for (const [index, upstream] of services.table.upstreams.entries()) proxies[index] = createUpstreamProxy(upstream, services.config, outcomes);
  const sent: Array<[IncomingMessage, ServerResponse, RouteState]> = [];
  const server = await serve((req, res) => {
    const route = new RouteState(reports, req.headers);
    sent.push([req, res, route]);
    route.assign(req, res, services.table.all[0], 'assigned', undefined);
    route.sending();
    proxies[0].send(req, res, () => undefined, route);
  });
  running.push({
    close: async () => {
      await server.close();
      for (const proxy of proxies) proxy.close();
      await services.close();
    },
  });
  return { url: server.url, proxies, table: services.table, sent };
}

async function upstream(): Promise<EchoUpstream> {
  const started = await startEchoUpstream();
  running.push(started);
  return started;
}

describe("the proxy's tries", () => {
  it('are kept only until their response closes', async () => {
    const echo = await upstream();
    const gateway = await start([echo.url]);
    const answers = await Promise.all(Array.from({ length: 20 }, () => exchange(gateway.url, { body: '{"prompt":"hi"}', headers: { 'content-type': 'application/json' } })));
    expect(answers.map((answer) => answer.status)).toEqual(Array(20).fill(200));
    await waitFor(() => gateway.table.all[0].inflight === 0, 2000, () => `in flight ${gateway.table.all[0].inflight}`);
    expect(gateway.proxies[0].keeping).toBe(0);
  });

  it('are forgotten when the client leaves before the upstream answers', async () => {
    const echo = await upstream();
    let stalled: ServerResponse | undefined;
    echo.respond = (_req, res) => {
      stalled = res;
    };
    const gateway = await start([echo.url]);
    const outgoing = httpRequest(`${gateway.url}/v1/completions`, { method: 'POST', agent: false });
    outgoing.on('error', () => undefined);
    outgoing.end('{}');
    await waitFor(() => stalled !== undefined, 2000, () => 'the upstream never got the request');
    expect(gateway.proxies[0].keeping).toBe(1);
    outgoing.destroy();
    await waitFor(() => gateway.table.all[0].inflight === 0, 2000, () => 'the slot was never released');
    expect(gateway.proxies[0].keeping).toBe(0);
    stalled!.end();
  });

  it('move with a retry: the proxy of the first try forgets it, the next proxy keeps it until the response closes', async () => {
    const first = await upstream();
    const second = await upstream();
    let stalled: ServerResponse | undefined;
    first.respond = (_req, res) => {
      stalled = res;
    };
    const gateway = await start([first.url, second.url]);
    // Without a body, so that the second try can send the request again as it is.
    const reply = new Promise<number>((resolve, reject) => {
      httpRequest(`${gateway.url}/v1/models`, { agent: false }, (response) => {
        response.resume();
        response.on('end', () => resolve(response.statusCode ?? 0));
      })
        .on('error', reject)
        .end();
    });
    await waitFor(() => stalled !== undefined, 2000, () => 'the first upstream never got the request');
    const [req, res, route] = gateway.sent[0];
    route.moveTo(req, res, gateway.table.all[1]);
    gateway.proxies[1].send(req, res, () => undefined, route);
    expect(gateway.proxies.map((proxy) => proxy.keeping)).toEqual([0, 1]);
    expect(await reply).toBe(200);
    await waitFor(() => gateway.table.all.every((endpoint) => endpoint.inflight === 0), 2000, () => 'a slot was never released');
    expect(gateway.proxies.map((proxy) => proxy.keeping)).toEqual([0, 0]);
    // The first try's late answer finds no try kept for it, and is not relayed.
    stalled!.end('late');
  });
});
