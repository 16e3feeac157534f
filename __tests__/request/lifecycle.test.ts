import { afterEach, describe, expect, it } from '@jest/globals';
import type { ServerResponse } from 'node:http';
import { Registry } from 'prom-client';
import { ERROR_CODES, PolicyError, type Options, type Policy } from '../../lib';
import { sendError } from '../../lib/errors';
import { parseOptions } from '../../lib/options';
import { RequestLifecycle, type Next, type Terminal } from '../../lib/request/lifecycle';
import type { RouteState, RoutedRequest } from '../../lib/request/route-state';
import { RouterServices } from '../../lib/compose/services';
import type { RouteEndpoint } from '../../lib/upstreams/endpoints';
import { exchange, metricValue, serve } from '../helpers';

/** What the terminal saw of one request. */
interface Arrival {
  endpoint: string;
  rankHeader: string | string[] | undefined;
  dpRank: unknown;
  body: string | undefined;
  viewed: boolean;
}

/** A terminal that records each request and answers 200 with what it saw. */
class RecordingTerminal implements Terminal {
  readonly arrivals: Arrival[] = [];
  closed = 0;

  proceed(req: RoutedRequest, res: ServerResponse, _next: Next, route: RouteState): void {
    const arrival: Arrival = {
      endpoint: route.endpoint!.key,
      rankHeader: req.headers['x-data-parallel-rank'],
      dpRank: req.dpRank,
      body: route.body?.toString('utf8'),
      viewed: route.view !== undefined,
    };
    this.arrivals.push(arrival);
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify(arrival));
  }

  close(): void {
    this.closed++;
  }
}

const running: Array<{ close(): Promise<void> }> = [];
afterEach(async () => {
  await Promise.all(running.splice(0).map((thing) => thing.close()));
});

const upstreams = [
  { url: 'http://127.0.0.1:1', name: 'a', dataParallelSize: 2 },
  { url: 'http://127.0.0.2:1', name: 'b', dataParallelSize: 2 },
];

type LifecycleClass = new (...args: ConstructorParameters<typeof RequestLifecycle>) => RequestLifecycle;

/**
 * A lifecycle (of `Kind`, a subclass for the hooks) with a recording terminal on a real server;
 * `next(error)` answers 500 with the error's code, as an Express error handler would.
 */
async function start(options: Partial<Options> = {}, Kind: LifecycleClass = RequestLifecycle) {
  const registry = new Registry();
  const services = new RouterServices(parseOptions({ upstreams, metrics: { registry }, logger: false, ...options } as Options, 'dpRank'));
  const terminal = new RecordingTerminal();
  const lifecycle = new Kind(services, terminal);
  const decisionWrites: number[] = [];
  const errors: unknown[] = [];
  const server = await serve((req, res) => {
    let writes = 0;
    const setHeader = res.setHeader.bind(res);
    res.setHeader = (name: string, value: number | string | readonly string[]) => {
      if (name.toLowerCase() === 'x-dp-router-decision') writes++;
      return setHeader(name, value);
    };
    res.on('finish', () => decisionWrites.push(writes));
    lifecycle.handle(req, res, (error) => {
      errors.push(error);
      sendError(res, 500, 'BadGatewayError', String((error as { code?: string }).code));
    });
  });
  running.push({ close: async () => (await server.close(), await services.close()) });
  return { ...server, services, terminal, lifecycle, registry, decisionWrites, errors };
}

const inflight = (services: RouterServices) => services.table.all.reduce((sum, endpoint) => sum + endpoint.inflight, 0);

describe('RequestLifecycle', () => {
  it('hands the terminal a request that holds its endpoint, with one clean rank header and req.dpRank set', async () => {
    const gateway = await start({ policy: 'round-robin', hints: { trust: true } });
    const answer = await exchange(gateway.url, { headers: { 'x-data-parallel-rank': ['1', '1'] } });
    expect(answer.status).toBe(200);
    const arrival = JSON.parse(answer.body) as Arrival;
    // Two header lines are malformed: reassigned, and the client's copies are gone.
    expect(arrival.rankHeader).toBe(String((arrival.dpRank as { rank: number }).rank));
    expect(arrival.dpRank).toMatchObject({ source: 'assigned' });
    expect(await metricValue(gateway.registry, 'dp_router_rank_hints_total', { outcome: 'malformed' })).toBe(1);
    expect(inflight(gateway.services)).toBe(0);
  });

  it('writes the decision header once, with what the policy adds (prefix-aware names its index)', async () => {
    const gateway = await start({ policy: 'prefix-aware', exposeDecision: true });
    const answer = await exchange(gateway.url, { body: JSON.stringify({ prompt: 'a prompt long enough to be hashed into blocks '.repeat(8) }) });
    expect(answer.status).toBe(200);
    expect(answer.headers['x-dp-router-decision']).toMatch(/^upstream=[ab]; rank=[0-3]; source=assigned; index=approximate$/);
    expect(gateway.decisionWrites).toEqual([1]);
  });

  it('reads the body only when routing needs it', async () => {
    const reading = await start({ policy: 'prefix-aware' });
    const body = JSON.stringify({ prompt: 'hello' });
    const read = JSON.parse((await exchange(reading.url, { body })).body) as Arrival;
    expect(read).toMatchObject({ body, viewed: true });
    const streaming = await start({ policy: 'round-robin' });
    const streamed = JSON.parse((await exchange(streaming.url, { body })).body) as Arrival;
    expect(streamed).toMatchObject({ viewed: false });
    expect(streamed.body).toBeUndefined();
  });

  it('picks only among what `candidates` returns, and answers 503 when it returns none', async () => {
    let allowed = 'b';
    class OnlyOne extends RequestLifecycle {
      override candidates(req: RoutedRequest, route: RouteState): readonly RouteEndpoint[] {
        return super.candidates(req, route).filter((endpoint) => endpoint.upstream === allowed);
      }
    }
    const gateway = await start({ policy: 'round-robin' }, OnlyOne);
    for (let index = 0; index < 6; index++) expect((await exchange(gateway.url)).status).toBe(200);
    expect(new Set(gateway.terminal.arrivals.map((arrival) => arrival.endpoint))).toEqual(new Set(['b#0', 'b#1']));
    allowed = 'nobody';
    const refused = await exchange(gateway.url);
    expect(refused.status).toBe(503);
    expect(JSON.parse(refused.body).error.type).toBe('ServiceUnavailableError');
    expect(inflight(gateway.services)).toBe(0);
  });

  it('lets admission wait asynchronously or answer before any slot is taken', async () => {
    const waiting: Array<() => void> = [];
    class Gated extends RequestLifecycle {
      override admit(req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState): void {
        if (req.headers['x-refuse'] !== undefined) {
          res.setHeader('retry-after', '1');
          sendError(res, 429, 'BadRequestError', 'Too many requests.');
          return;
        }
        waiting.push(() => super.admit(req, res, next, route));
      }
    }
    const gateway = await start({ policy: 'round-robin' }, Gated);
    const refused = await exchange(gateway.url, { headers: { 'x-refuse': '1' } });
    expect(refused.status).toBe(429);
    expect(gateway.terminal.arrivals).toHaveLength(0);
    const admitted = exchange(gateway.url);
    await new Promise<void>((resolve) => {
      const poll = () => (waiting.length > 0 ? resolve() : setImmediate(poll));
      poll();
    });
    expect(gateway.terminal.arrivals).toHaveLength(0);
    expect(inflight(gateway.services)).toBe(0);
    waiting.shift()!();
    expect((await admitted).status).toBe(200);
    expect(gateway.terminal.arrivals).toHaveLength(1);
  });

  it('answers a rejected hint itself: the terminal never sees it', async () => {
    const gateway = await start({ hints: { trust: true, onInvalid: 'reject' } });
    const answer = await exchange(gateway.url, { headers: { 'x-data-parallel-rank': '9' } });
    expect(answer.status).toBe(400);
    expect(JSON.parse(answer.body).error.param).toBe('x-data-parallel-rank');
    expect(gateway.terminal.arrivals).toHaveLength(0);
  });

  it("passes a policy's broken contract to next(error) as a PolicyError with a stable code", async () => {
    const stranger = { key: 'x#0', upstream: 'x', rank: 0, inflight: 0, load: 0, healthy: true };
    const policy: Policy = { name: 'stray', pick: () => stranger };
    const gateway = await start({ policy });
    const answer = await exchange(gateway.url);
    expect(answer.status).toBe(500);
    expect(JSON.parse(answer.body).error.message).toBe(ERROR_CODES.policy);
    expect(gateway.errors[0]).toBeInstanceOf(PolicyError);
    expect(gateway.errors[0]).toMatchObject({ code: 'ERR_DPR_POLICY', policy: 'stray' });
    expect(inflight(gateway.services)).toBe(0);
  });

  it('never reads its state back from the request: req.dpRank is the plain decision', async () => {
    const gateway = await start();
    const arrival = JSON.parse((await exchange(gateway.url)).body) as Arrival;
    expect(Object.keys(arrival.dpRank as object).sort()).toEqual(['headerValue', 'rank', 'source', 'upstream', 'url']);
  });

  it("makes a pick context only for a policy that reads it: the request's path for one that may, one shared context for `readsContext: false`", async () => {
    const seen: Array<{ policy: string; path: string }> = [];
    const contexts: unknown[] = [];
    const recording = (name: string, readsContext: boolean | undefined): Policy => ({
      name,
      readsContext,
      pick(candidates, ctx) {
        seen.push({ policy: name, path: ctx.path });
        contexts.push(ctx);
        return candidates[0];
      },
    });
    const reading = await start({ policy: recording('custom', undefined) });
    const unread = await start({ policy: recording('unread', false) });
    for (const gateway of [reading, reading, unread, unread]) expect((await exchange(gateway.url, { path: '/v1/chat/completions' })).status).toBe(200);
    expect(seen.map(({ policy, path }) => `${policy} ${path}`)).toEqual(['custom /v1/chat/completions', 'custom /v1/chat/completions', 'unread /', 'unread /']);
    expect(contexts[0]).not.toBe(contexts[1]);
    expect(contexts[2]).toBe(contexts[3]);
    expect(Object.isFrozen(contexts[2])).toBe(true);
  });
});
