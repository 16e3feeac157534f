import { fail, shown } from '../option-checks';

/**
 * What the peers use of a Redis client, `ioredis` or node-redis (4 or later) alike: `publish`
 * on the user's client, and a `duplicate()` to subscribe on (this package loads neither).
 */
export interface RedisPeerClient {
  publish(channel: string, message: Buffer): Promise<unknown>;
  /** A subscribed connection of its own, delivering each message on `channel` whole, as bytes. */
  subscriber(channel: string, received: (message: Buffer) => void, failed: (error: Error) => void): RedisSubscriber;
}

/** The connection the router made to subscribe: it closes that one only. */
export interface RedisSubscriber {
  /** Resolves once subscribed (or rejects with why not). */
  readonly ready: Promise<void>;
  close(): Promise<void>;
}

interface Duplicable {
  duplicate(): unknown;
  publish(channel: string, message: Buffer): Promise<unknown>;
}

/** ioredis: a duplicate connects by itself and emits every message as `messageBuffer`. */
interface IoRedisConnection {
  call(...args: unknown[]): unknown;
  subscribe(channel: string): Promise<unknown>;
  on(event: 'messageBuffer', listener: (channel: Buffer, message: Buffer) => void): unknown;
  on(event: 'error', listener: (error: Error) => void): unknown;
  disconnect(): void;
}

/** node-redis 4 and 5: a duplicate must be connected; `subscribe`'s third argument asks for bytes. */
interface NodeRedisConnection {
  connect(): Promise<unknown>;
  subscribe(channel: string, listener: (message: Buffer) => void, bufferMode: true): Promise<unknown>;
  on(event: 'error', listener: (error: Error) => void): unknown;
  disconnect?(): Promise<unknown>;
  destroy?(): unknown;
  quit?(): Promise<unknown>;
}

/** `peers.redis`: the user's client, checked once for what the peers call on it. */
export function redisPeerClient(path: string, client: unknown): RedisPeerClient {
  const candidate = client as Partial<Duplicable> | null;
  if (typeof candidate?.duplicate !== 'function' || typeof candidate.publish !== 'function') {
    return fail(path, `must be an ioredis or node-redis client, got ${shown(client)}`, 'Pass your connected client, e.g. `new Redis(url)` (ioredis) or `await createClient({ url }).connect()` (redis).');
  }
  const user = candidate as Duplicable;
  const ioredis = typeof (client as Partial<IoRedisConnection>).call === 'function';
  return {
    publish: (channel, message) => user.publish(channel, message),
    subscriber: (channel, received, failed) => (ioredis ? ioRedisSubscriber(user.duplicate() as IoRedisConnection, channel, received, failed) : nodeRedisSubscriber(user.duplicate() as NodeRedisConnection, channel, received, failed)),
  };
}

function ioRedisSubscriber(connection: IoRedisConnection, channel: string, received: (message: Buffer) => void, failed: (error: Error) => void): RedisSubscriber {
  const name = Buffer.from(channel);
  connection.on('error', failed);
  connection.on('messageBuffer', (from, message) => {
    if (name.equals(from)) received(message);
  });
  return {
    // ioredis subscribes again by itself after a reconnection (`autoResubscribe`).
    ready: connection.subscribe(channel).then(() => undefined),
    close: async () => connection.disconnect(),
  };
}

function nodeRedisSubscriber(connection: NodeRedisConnection, channel: string, received: (message: Buffer) => void, failed: (error: Error) => void): RedisSubscriber {
  connection.on('error', failed);
  const ready = (async () => {
    await connection.connect();
    await connection.subscribe(channel, received, true);
  })();
  return {
    ready,
    close: async () => {
      await ready.catch(() => undefined);
      if (typeof connection.destroy === 'function') connection.destroy();
      else await connection.disconnect?.();
    },
  };
}
