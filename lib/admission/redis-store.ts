import { fail, shown } from '../option-checks';
import { WINDOW_MS, type TokenStore, type WindowCounts } from './token-window';

/** The client calls this store uses: ioredis's `call`, or node-redis's `sendCommand`. */
interface IoRedisLike {
  call(command: string, ...args: (string | number)[]): Promise<unknown>;
}
interface NodeRedisLike {
  sendCommand(args: string[]): Promise<unknown>;
}

/** Options of {@link redisTokenStore}. */
export interface RedisTokenStoreOptions {
  /** Prepended to every key (`<prefix><tenant>:<window>`). Default: `'dp_router:tokens:'`. */
  prefix?: string;
}

/**
 * Adds to a window's count and sets its expiry in one atomic step: two windows (the sliding
 * minute still reads the previous one) and a margin for clock skew between replicas.
 */
const ADD = `local n = redis.call('INCRBY', KEYS[1], ARGV[1])
if n == tonumber(ARGV[1]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return n`;
const EXPIRE_MS = String(2 * WINDOW_MS + 5_000);

/**
 * A token store in Redis, so that gateway replicas share one budget per tenant. `client` is
 * your own connected `ioredis` or `redis` (node-redis 4 or later) client; this package loads
 * neither. Each request reads two keys (`MGET`) and its answer adds with one Lua script.
 *
 * @example
 * import Redis from 'ioredis';
 * dpRouter({ upstreams, admission: { tenant: { header: 'x-tenant-id', trust: true }, tokens: { perMinute: 200_000, store: redisTokenStore(new Redis(url)) } } });
 */
export function redisTokenStore(client: unknown, options: RedisTokenStoreOptions = {}): TokenStore {
  const send = commandOf(client);
  const prefix = options.prefix ?? 'dp_router:tokens:';
  if (typeof prefix !== 'string') fail('redisTokenStore.prefix', `must be a string, got ${shown(prefix)}`, "Use e.g. `{ prefix: 'dp_router:tokens:' }`.");
  const key = (tenant: string, window: number) => `${prefix}${tenant}:${window}`;
  return {
    kind: 'redis',
    async read(tenant, window): Promise<WindowCounts> {
      const values = (await send(['MGET', key(tenant, window), key(tenant, window - 1)])) as (string | null)[];
      return { current: Number(values[0] ?? 0), previous: Number(values[1] ?? 0) };
    },
    async add(tenant, window, tokens) {
      await send(['EVAL', ADD, '1', key(tenant, window), String(tokens), EXPIRE_MS]);
    },
  };
}

function commandOf(client: unknown): (args: string[]) => Promise<unknown> {
  const ioredis = client as Partial<IoRedisLike> | null;
  if (typeof ioredis?.call === 'function') return ([command, ...args]) => ioredis.call!(command, ...args);
  const nodeRedis = client as Partial<NodeRedisLike> | null;
  if (typeof nodeRedis?.sendCommand === 'function') return (args) => nodeRedis.sendCommand!(args);
  return fail('redisTokenStore(client)', `must be an ioredis or node-redis client, got ${shown(client)}`, 'Pass e.g. `new Redis(url)` (ioredis) or `await createClient({ url }).connect()` (redis).');
}
