import { afterEach, describe, expect, it } from '@jest/globals';
import type { IncomingMessage } from 'node:http';
import { connect } from 'node:net';
import { arrivedBody } from '../../lib/http/body';
import { BodyBudget } from '../../lib/http/body-budget';
import { exchange, serve } from '../helpers';

const running: Array<{ close(): Promise<void> }> = [];
afterEach(async () => {
  await Promise.all(running.splice(0).map((thing) => thing.close()));
});

/** A real server that takes each request's body with arrivedBody one tick after its handler, as the lifecycle does. */
async function start(limit: number, budget: BodyBudget) {
  const taken: Array<{ bytes: string | undefined; held: number }> = [];
  const server = await serve((req: IncomingMessage, res) => {
    process.nextTick(() => {
      const bytes = arrivedBody(req, limit, budget.lease());
      taken.push({ bytes: bytes?.toString('utf8'), held: budget.used });
      res.end();
    });
  });
  running.push(server);
  return { ...server, taken };
}

describe('arrivedBody', () => {
  it('takes a body sent with its headers whole, its bytes on the lease', async () => {
    const budget = new BodyBudget(1 << 20);
    const gateway = await start(1024, budget);
    const body = JSON.stringify({ prompt: 'x'.repeat(300) });
    expect((await exchange(gateway.url, { body })).status).toBe(200);
    expect(gateway.taken).toEqual([{ bytes: body, held: body.length }]);
  });

  it('leaves to the stream read what is over the limit, over the budget, or still arriving', async () => {
    const budget = new BodyBudget(64);
    const gateway = await start(32, budget);
    await exchange(gateway.url, { body: 'y'.repeat(33) });
    const roomy = await start(1024, budget);
    await exchange(roomy.url, { body: 'z'.repeat(65) });
    // Headers first, the body a moment later: not there one tick after the handler.
    const socket = connect(Number(new URL(roomy.url).port), '127.0.0.1');
    // The server's close at the end of the test may reset it.
    socket.on('error', () => undefined);
    running.push({ close: async () => void socket.destroy() });
    await new Promise<void>((resolve) => socket.once('connect', resolve));
    socket.write('POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n');
    await new Promise<void>((resolve) => socket.once('data', () => resolve()));
    socket.end('{}');
    expect([...gateway.taken, ...roomy.taken]).toEqual([
      { bytes: undefined, held: 0 },
      { bytes: undefined, held: 0 },
      { bytes: undefined, held: 0 },
    ]);
  });
});
