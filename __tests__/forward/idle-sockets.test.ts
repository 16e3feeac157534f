import { afterEach, beforeEach, expect, it, jest } from '@jest/globals';
import { Agent, request, type Server } from 'node:http';
import type { Socket } from 'node:net';
import { closeIdleSockets } from '../../lib/forward/idle-sockets';
import { serve } from '../helpers';

let server: Server;
let url: string;
let close: () => Promise<void>;
let connections: Socket[];
let agent: Agent;
let stop: (() => void) | undefined;

beforeEach(async () => {
  connections = [];
  ({ server, url, close } = await serve((_req, res) => res.end('ok')));
  server.keepAliveTimeout = 60_000;
  server.on('connection', (socket) => connections.push(socket));
  // The sweep's clock is fake, stepped by the tests; sockets, I/O and their callbacks stay real.
  jest.useFakeTimers({
    doNotFake: ['Date', 'hrtime', 'nextTick', 'queueMicrotask', 'setImmediate', 'clearImmediate', 'setTimeout', 'clearTimeout'],
  });
  agent = new Agent({ keepAlive: true, scheduling: 'lifo' });
});
afterEach(async () => {
  stop?.();
  stop = undefined;
  jest.useRealTimers();
  agent.destroy();
  await close();
});

const get = () =>
  new Promise<void>((resolve, reject) => {
    request(url, { agent }, (response) => {
      response.resume();
      response.on('end', resolve);
    })
      .on('error', reject)
      .end();
  });

const freeSockets = () => Object.values(agent.freeSockets).flat().length;

it('closes a keep-alive socket once it has been idle, and not before', async () => {
  stop = closeIdleSockets(agent, 1_000);
  await get();
  expect(freeSockets()).toBe(1);
  const [socket] = Object.values(agent.freeSockets).flat();
  const closed = new Promise<void>((resolve) => socket!.once('close', () => resolve()));
  // Never before idle − 2 sweeps (sweeps every 250 ms)...
  jest.advanceTimersByTime(499);
  expect(socket!.destroyed).toBe(false);
  // ...never later than the idle limit.
  jest.advanceTimersByTime(501);
  expect(socket!.destroyed).toBe(true);
  await closed;
  expect(freeSockets()).toBe(0);
  // The next request opens a new connection.
  await get();
  expect(connections).toHaveLength(2);
});

it('keeps a socket that is reused between sweeps', async () => {
  stop = closeIdleSockets(agent, 1_000);
  // A request every 200 ms for 2.4 s, well past the idle limit; a swept socket would make the
  // next request open a new connection.
  await get();
  for (let round = 0; round < 12; round++) {
    jest.advanceTimersByTime(200);
    await get();
  }
  // Every request went down the one connection: it was in the free list at every sweep, but
  // never idle for long.
  expect(connections).toHaveLength(1);
  expect(connections[0].destroyed).toBe(false);
});

it('stops sweeping when told to', async () => {
  stop = closeIdleSockets(agent, 200);
  stop();
  await get();
  const [socket] = Object.values(agent.freeSockets).flat();
  jest.advanceTimersByTime(600);
  expect(socket!.destroyed).toBe(false);
  expect(freeSockets()).toBe(1);
  // The next request reuses the connection.
  await get();
  expect(connections).toHaveLength(1);
  expect(connections[0].destroyed).toBe(false);
});
