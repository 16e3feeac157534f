import { afterEach, describe, expect, it } from '@jest/globals';
import express from 'express';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { Registry } from 'prom-client';
import request from 'supertest';
import { dpRank, dpRouter, type DpRank, type DpRankDecision } from '../../lib';
import { serve } from '../helpers/app';
import { startEchoUpstream, type EchoUpstream } from '../helpers/echo-upstream';
import { seedScenario } from '../helpers/fixtures';

/** What the middleware after the router saw of `req.dpRank`. */
interface Seen {
  decision: DpRankDecision | undefined;
  own: boolean;
}

let upstream: EchoUpstream | undefined;
const stops: Array<() => Promise<void>> = [];

afterEach(async () => {
  while (stops.length > 0) await stops.pop()!();
  await upstream?.close();
  upstream = undefined;
});

function rankMiddleware(url = 'http://127.0.0.1:9'): DpRank {
  const rank = dpRank({ ...seedScenario(url), metrics: { registry: new Registry() } });
  stops.push(() => rank.close());
  return rank;
}

function seenBy(req: IncomingMessage & { dpRank?: DpRankDecision }): Seen {
  return { decision: req.dpRank, own: Object.prototype.hasOwnProperty.call(req, 'dpRank') };
}

describe('req.dpRank without a property added to the request', () => {
  it('reads the decision under Express, in the app that mounts the router and in its parent after it, with no own property added', async () => {
    const rank = rankMiddleware();
    const seen: Seen[] = [];
    const api = express();
    api.use(rank);
    api.use((req, _res, next) => {
      seen.push(seenBy(req));
      next();
    });
    const app = express();
    app.use('/v1', api);
    app.use((req, res) => {
      seen.push(seenBy(req));
      res.json({ keys: Object.keys(req).includes('dpRank') });
    });
    const first = await request(app).post('/v1/completions').send({ prompt: 'a' });
    const second = await request(app).post('/v1/completions').send({ prompt: 'b' });
    expect([first.status, second.status]).toEqual([200, 200]);
    expect(first.body).toEqual({ keys: false });
    expect(seen.map(({ decision, own }) => `${decision?.upstream}/${decision?.source} own=${own}`)).toEqual(Array(4).fill('node-a/assigned own=false'));
    // The sub-app and its parent read the same decision; each request its own.
    expect(seen[1].decision).toBe(seen[0].decision);
    expect(seen[3].decision).toBe(seen[2].decision);
    expect([0, 2, 4, 6]).toContain(seen[0].decision?.rank);
    expect([0, 2, 4, 6]).toContain(seen[2].decision?.rank);
    expect(Object.isFrozen(seen[0].decision)).toBe(true);
  });

  it('lets a later middleware set req.dpRank to its own value, on that request alone', async () => {
    const rank = rankMiddleware();
    const app = express();
    app.use(rank);
    let count = 0;
    app.use((req, res) => {
      if (count++ === 0) (req as { dpRank?: unknown }).dpRank = 'mine';
      res.json({ dpRank: req.dpRank, own: Object.prototype.hasOwnProperty.call(req, 'dpRank') });
    });
    const changed = await request(app).post('/v1/completions').send({ prompt: 'a' });
    const untouched = await request(app).post('/v1/completions').send({ prompt: 'a' });
    expect(changed.body).toEqual({ dpRank: 'mine', own: true });
    expect(untouched.body).toMatchObject({ dpRank: { upstream: 'node-a', source: 'assigned' }, own: false });
  });

  it('keeps a dpRank the app defines on its request prototype, and sets the decision as the request own property', async () => {
    const rank = rankMiddleware();
    const app = express();
    Object.defineProperty(app.request, 'dpRank', { value: 'app default', writable: true, configurable: true });
    app.use(rank);
    app.use((req, res) => res.json(seenBy(req)));
    const answer = await request(app).post('/v1/completions').send({ prompt: 'a' });
    expect(answer.body).toMatchObject({ decision: { upstream: 'node-a', source: 'assigned' }, own: true });
  });

  it('sets it as the request own property without Express', async () => {
    const rank = rankMiddleware();
    const seen: Seen[] = [];
    const served = await serve((req: IncomingMessage, res: ServerResponse) => {
      rank(req, res, () => {
        seen.push(seenBy(req));
        res.end('ok');
      });
    });
    stops.push(served.close);
    expect((await request(served.url).get('/v1/models')).status).toBe(200);
    expect(seen).toEqual([{ decision: expect.objectContaining({ upstream: 'node-a', source: 'assigned' }), own: true }]);
  });

  it('names, under dpRouter, the rank the upstream was sent', async () => {
    upstream = await startEchoUpstream();
    const router = dpRouter({ ...seedScenario(upstream.url), metrics: { registry: new Registry() } });
    stops.push(() => router.close());
    const app = express();
    const seen: Seen[] = [];
    app.use((req, res, next) => {
      res.on('finish', () => seen.push(seenBy(req)));
      next();
    });
    app.use(router);
    const answer = await request(app).post('/v1/completions').send({ prompt: 'a' });
    expect(answer.status).toBe(200);
    await new Promise((resolve) => setImmediate(resolve));
    expect(seen).toHaveLength(1);
    expect(seen[0].own).toBe(false);
    expect(upstream.seen.map((seenUpstream) => seenUpstream.rankHeaders)).toEqual([[String(seen[0].decision?.rank)]]);
  });
});
