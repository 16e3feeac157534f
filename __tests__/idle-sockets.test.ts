import { afterEach, beforeEach, expect, it } from '@jest/globals';
import { Agent, createServer, request, type Server } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { closeIdleSockets } from '../lib/idle-sockets';
import { sleep } from './helpers';

let server: Server;
let url: string;
let connections: Socket[];
let agent: Agent;
let stop: (() => void) | undefined;

beforeEach(async () => {
  connections = [];
  server = createServer((_req, res) => res.end('ok'));
  server.keepAliveTimeout = 60_000;
  server.on('connection', (socket) => connections.push(socket));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  agent = new Agent({ keepAlive: true, scheduling: 'lifo' });
});
afterEach(async () => {
  stop?.();
  stop = undefined;
  agent.destroy();
  server.closeAllConnections();
  await new Promise<void>((resolve) => server.close(() => resolve()));
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
  const closed = new Promise<number>((resolve) => {
    const idleFrom = performance.now();
    socket!.once('close', () => resolve(performance.now() - idleFrom));
  });
  const idleFor = await closed;
  // Never later than the idle limit (plus a little timer lateness), never before idle − 2 sweeps.
  expect(idleFor).toBeGreaterThanOrEqual(450);
  expect(idleFor).toBeLessThan(1_300);
  expect(freeSockets()).toBe(0);
  // The next request opens a new connection.
  await get();
  expect(connections).toHaveLength(2);
});

it('keeps a socket that is reused between sweeps', async () => {
  stop = closeIdleSockets(agent, 1_000);
  const until = performance.now() + 2_500;
  while (performance.now() < until) {
    await get();
    await sleep(50);
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
  await sleep(600);
  expect(freeSockets()).toBe(1);
  expect(connections[0].destroyed).toBe(false);
});
