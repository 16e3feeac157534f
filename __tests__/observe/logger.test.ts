import { afterEach, describe, expect, it } from '@jest/globals';
import express from 'express';
import { Writable } from 'node:stream';
import pino from 'pino';
import { pinoHttp } from 'pino-http';
import { dpRouter, type DpRouter, type Options } from '../../lib';
import { parseLogger } from '../../lib/observe/logger';
import { serve } from '../helpers/app';
import { startEchoUpstream, type EchoUpstream } from '../helpers/echo-upstream';

/** A real pino logger writing JSON lines to a stream the test reads. */
function capturedPino(level: string) {
  const lines: Array<Record<string, unknown>> = [];
  const waiting: Array<{ test: (line: Record<string, unknown>) => boolean; resolve: (line: Record<string, unknown>) => void }> = [];
  const stream = new Writable({
    write(chunk: Buffer, _encoding, done) {
      for (const text of chunk.toString('utf8').split('\n')) {
        if (text === '') continue;
        const line = JSON.parse(text) as Record<string, unknown>;
        lines.push(line);
        for (const waiter of [...waiting]) {
          if (!waiter.test(line)) continue;
          waiting.splice(waiting.indexOf(waiter), 1);
          waiter.resolve(line);
        }
      }
      done();
    },
  });
  const logger = pino({ level }, stream);
  /** The first line (already written or still to come) that passes `test`. */
  const line = (test: (line: Record<string, unknown>) => boolean) =>
    new Promise<Record<string, unknown>>((resolve) => {
      const found = lines.find(test);
      if (found) resolve(found);
      else waiting.push({ test, resolve });
    });
  return { logger, lines, line };
}

const routedLines = (lines: Array<Record<string, unknown>>) => lines.filter((line) => line.msg === 'express-dp-router: routed');

describe('logger', () => {
  let upstream: EchoUpstream | undefined;
  const cleanup: Array<() => Promise<void>> = [];
  afterEach(async () => {
    for (const stop of cleanup.splice(0)) await stop();
    await upstream?.close();
    upstream = undefined;
  });

  async function gatewayWith(options: Partial<Options>, before?: express.RequestHandler) {
    upstream ??= await startEchoUpstream();
    const router: DpRouter = dpRouter({ upstreams: [{ url: upstream.url, name: 'echo', dataParallelSize: 2 }], metrics: false, ...options });
    const app = express();
    if (before) app.use(before);
    app.use(router);
    const server = await serve(app);
    cleanup.push(async () => {
      await server.close();
      await router.close();
    });
    return server.url;
  }

  it('writes one structured debug line per decision to a pino logger at debug level', async () => {
    const { logger, lines } = capturedPino('debug');
    const url = await gatewayWith({ logger, hints: { trust: true }, policy: 'round-robin' });
    await fetch(`${url}/v1/models`, { headers: { 'x-data-parallel-rank': '1' } }).then((response) => response.arrayBuffer());
    await fetch(`${url}/v1/models`, { headers: { 'x-data-parallel-rank': '7' } }).then((response) => response.arrayBuffer());
    const routed = routedLines(lines);
    expect(routed).toHaveLength(2);
    expect(routed[0]).toMatchObject({ level: 20, dpRank: { upstream: 'echo', rank: 1, source: 'hint' }, policy: 'round-robin', hintOutcome: 'accepted' });
    expect(routed[1]).toMatchObject({ level: 20, dpRank: { upstream: 'echo', source: 'assigned' }, hintOutcome: 'out_of_range' });
  });

  it('writes nothing per request at info level, and follows a level changed at run time', async () => {
    const { logger, lines } = capturedPino('info');
    const url = await gatewayWith({ logger });
    await fetch(`${url}/v1/models`).then((response) => response.arrayBuffer());
    expect(lines).toEqual([]);
    logger.level = 'debug';
    await fetch(`${url}/v1/models`).then((response) => response.arrayBuffer());
    expect(routedLines(lines)).toHaveLength(1);
  });

  it('logs a retry at debug and an ejection at info', async () => {
    const { logger, lines } = capturedPino('debug');
    const refused = await startEchoUpstream();
    await refused.close();
    upstream = await startEchoUpstream();
    const router = dpRouter({
      upstreams: [
        { url: refused.url, name: 'refused' },
        { url: upstream.url, name: 'echo' },
      ],
      policy: 'round-robin',
      metrics: false,
      outlierDetection: { consecutiveFailures: 1 },
      logger,
    });
    const server = await serve(express().use(router));
    cleanup.push(async () => {
      await server.close();
      await router.close();
    });
    expect((await fetch(`${server.url}/v1/models`)).status).toBe(200);
    const ejected = lines.find((line) => line.msg === 'express-dp-router: endpoint ejected after consecutive failures');
    expect(ejected).toMatchObject({ level: 30, dpRank: { upstream: 'refused', rank: 0 } });
    const retried = lines.find((line) => line.msg === 'express-dp-router: retrying on another endpoint');
    expect(retried).toMatchObject({ level: 20, dpRank: { upstream: 'echo' }, failed: { upstream: 'refused' } });
  });

  it('gives console-like loggers (no level check) their notices and no per-request lines', async () => {
    const calls: string[] = [];
    const consoleLike = {
      warn: (message: string) => calls.push(`warn ${message}`),
      debug: () => calls.push('debug'),
      info: () => calls.push('info'),
    };
    const url = await gatewayWith({ logger: consoleLike });
    await fetch(`${url}/v1/models`).then((response) => response.arrayBuffer());
    expect(calls).toEqual([]);
    const parsed = express.json();
    const url2 = await gatewayWith({ logger: consoleLike }, parsed);
    await fetch(`${url2}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"prompt":"x"}' }).then((response) => response.arrayBuffer());
    expect(calls).toEqual([expect.stringMatching(/^warn express-dp-router: the request body was already parsed/)]);
  });

  it('puts req.dpRank into every pino-http access line (the README recipe)', async () => {
    const { logger, line } = capturedPino('info');
    const access = pinoHttp({
      logger,
      customProps: (req) => (req.dpRank ? { dpRank: { upstream: req.dpRank.upstream, rank: req.dpRank.rank, source: req.dpRank.source } } : {}),
    });
    const url = await gatewayWith({ logger, hints: { trust: true } }, access as unknown as express.RequestHandler);
    await fetch(`${url}/v1/models`, { headers: { 'x-data-parallel-rank': '1' } }).then((response) => response.arrayBuffer());
    const completed = await line((candidate) => candidate.msg === 'request completed');
    expect(completed).toMatchObject({ dpRank: { upstream: 'echo', rank: 1, source: 'hint' }, res: { statusCode: 200 } });
  });

  it.each([
    ['debug that is not a method', { warn: () => undefined, debug: 'yes' }, /`logger.debug` must be a method/],
    ['isLevelEnabled that is not a method', { warn: () => undefined, isLevelEnabled: true }, /`logger.isLevelEnabled` must be a method/],
    ['no warn', { debug: () => undefined }, /`logger` must have a warn\(message\) method/],
  ])('rejects a logger with %s', (_name, value, message) => {
    expect(() => parseLogger('logger', value)).toThrow(TypeError);
    expect(() => parseLogger('logger', value)).toThrow(message);
  });
});
