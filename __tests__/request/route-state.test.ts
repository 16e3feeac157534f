import { afterEach, describe, expect, it } from '@jest/globals';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { Registry } from 'prom-client';
import type { RouterEvents } from '../../lib/observe/events';
import { parseOptions } from '../../lib/options';
import { DECISION_HEADER, RouteState, type RouteReports } from '../../lib/request/route-state';
import { RankDecision } from '../../lib/upstreams/rank-decision';
import { RouterServices } from '../../lib/compose/services';
import { BodyBudget } from '../../lib/http/body-budget';
import { exchange, metricValue, serve } from '../helpers';

const running: Array<{ close(): Promise<void> }> = [];
afterEach(async () => {
  await Promise.all(running.splice(0).map((thing) => thing.close()));
});

/** A router's services, and a real server whose handler is `handle` (which must answer). */
async function start(handle: (req: IncomingMessage, res: ServerResponse, reports: RouteReports, services: RouterServices) => void) {
  const registry = new Registry();
  const services = new RouterServices(
    parseOptions({ upstreams: [{ url: 'http://127.0.0.1:1', name: 'a', dataParallelSize: 2 }, { url: 'http://127.0.0.2:1', name: 'b' }], metrics: { registry }, exposeDecision: true }, 'dpRank'),
  );
  const told: string[] = [];
  const events: RouterEvents = {
    decided: (_req, endpoint, source, outcome) => told.push(`decided ${endpoint.key} ${source} ${outcome ?? '-'}`),
    prefixScored: () => told.push('scored'),
    retried: (_req, failed, next) => told.push(`retried ${failed.key} → ${next.key}`),
    ejected: (endpoint) => told.push(`ejected ${endpoint.key}`),
    healthChanged: (endpoints, up) => told.push(`health ${endpoints.length} ${up}`),
  };
  const reports: RouteReports = { config: services.config, events, hooks: services.hooks };
  const server = await serve((req, res) => handle(req, res, reports, services));
  running.push({ close: async () => (await server.close(), await services.close()) });
  return { ...server, services, registry, told };
}

describe('RouteState', () => {
  it('assign takes the slot, counts, sets the rank header, req.dpRank and the decision header; the close releases it', async () => {
    const seen: Array<Record<string, unknown>> = [];
    const gateway = await start((req, res, reports, services) => {
      const route = new RouteState(reports, req.headers);
      const endpoint = services.table.all[1];
      req.headers['x-data-parallel-rank'] = 'client value';
      route.assign(req, res, endpoint, 'assigned', 'untrusted', '; index=exact');
      seen.push({ inflight: endpoint.inflight, header: req.headers['x-data-parallel-rank'], decision: req.dpRank, phase: route.phase });
      res.end('ok');
    });
    const answer = await exchange(gateway.url);
    expect(answer.headers[DECISION_HEADER]).toBe('upstream=a; rank=1; source=assigned; index=exact');
    expect(seen[0]).toMatchObject({ inflight: 1, header: '1', phase: 'deciding' });
    expect(seen[0].decision).toBeInstanceOf(RankDecision);
    expect(Object.isFrozen(seen[0].decision)).toBe(true);
    expect(gateway.told).toEqual(['decided a#1 assigned untrusted']);
    expect(await metricValue(gateway.registry, 'dp_router_requests_total', { upstream: 'a', rank: '1', source: 'assigned' })).toBe(1);
    expect(gateway.services.table.all[1].inflight).toBe(0);
  });

  it('moveTo moves the slot and the rank to the next endpoint, tells the retry once, and the close releases the slot held then', async () => {
    let during: number[] = [];
    const gateway = await start((req, res, reports, services) => {
      const [first, , other] = services.table.all;
      const route = new RouteState(reports, req.headers);
      route.assign(req, res, first, 'assigned', undefined);
      route.moveTo(req, res, other);
      during = services.table.all.map((endpoint) => endpoint.inflight);
      res.end(JSON.stringify({ rank: req.headers['x-data-parallel-rank'], attempt: route.attempt, dpRank: req.dpRank }));
    });
    const answer = await exchange(gateway.url);
    expect(JSON.parse(answer.body)).toMatchObject({ rank: '0', attempt: 2, dpRank: { upstream: 'b', rank: 0 } });
    expect(answer.headers[DECISION_HEADER]).toBe('upstream=b; rank=0; source=assigned');
    expect(during).toEqual([0, 0, 1]);
    expect(gateway.told).toEqual(['decided a#0 assigned -', 'retried a#0 → b#0']);
    // Each endpoint held counts a dispatch; the retry itself is counted by the events' sinks.
    expect(await metricValue(gateway.registry, 'dp_router_requests_total', { upstream: 'b', rank: '0', source: 'assigned' })).toBe(1);
    expect(gateway.services.table.all.map((endpoint) => endpoint.inflight)).toEqual([0, 0, 0]);
  });

  it('lets go, once the upstream answers, of what only a retry reads: the body, its members, the pick context, the pool', async () => {
    const kept: unknown[][] = [];
    const gateway = await start((req, res, reports, services) => {
      const route = new RouteState(reports, req.headers);
      route.assign(req, res, services.table.all[0], 'assigned', undefined);
      route.body = Buffer.from('{"prompt":"a long prompt"}');
      route.view = { members: {} } as never;
      route.context = { path: '/v1/completions', headers: {} } as never;
      route.pool = services.table.all;
      route.hintFields = [];
      route.sending();
      route.responding();
      kept.push([route.body, route.view, route.context, route.pool, route.hintFields, route.endpoint?.key]);
      res.end();
    });
    await exchange(gateway.url);
    // The endpoint stays: its slot is released when the stream ends.
    expect(kept).toEqual([[undefined, undefined, undefined, undefined, undefined, 'a#0']]);
  });

  it('settles a try once: later reports of the same try are echoes', async () => {
    const results: boolean[] = [];
    const gateway = await start((req, res, reports) => {
      const route = new RouteState(reports, req.headers);
      route.sending();
      results.push(route.phase === 'waiting', route.settle(), route.settle());
      res.end();
    });
    await exchange(gateway.url);
    expect(results).toEqual([true, true, false]);
  });

  it('a response answered before any endpoint was held leaks nothing, and its body lease is released on close', async () => {
    const budget = new BodyBudget(1000);
    let held = 0;
    const gateway = await start((req, res, reports) => {
      const route = new RouteState(reports, req.headers);
      const lease = route.leaseFrom(budget, res)!;
      expect(route.leaseFrom(budget, res)).toBe(lease);
      lease.grow(100);
      held = budget.used;
      res.end();
    });
    await exchange(gateway.url);
    expect(held).toBe(100);
    await new Promise<void>((resolve) => {
      const poll = () => (budget.used === 0 ? resolve() : setImmediate(poll));
      poll();
    });
    expect(gateway.services.table.all.every((endpoint) => endpoint.inflight === 0)).toBe(true);
  });
});
