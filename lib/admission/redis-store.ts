import { createHash } from 'node:crypto';
import { fail, shown } from '../option-checks';
import { NOT_A_COUNT, WINDOW_MS, type TokenStore, type WindowCounts } from './token-window';

/** The client calls this store uses: ioredis's `call`, or node-redis's `sendCommand`. */
interface IoRedisLike {
  call(command: string, ...args: (string | number)[]): Promise<unknown>;
}
interface NodeRedisLike {
  sendCommand(args: string[]): Promise<unknown>;
}

/** Options of {@link redisTokenStore}. */
export interface RedisTokenStoreOptions {
  /**
   * Begins every key's hash tag: a tenant's keys are `{<prefix><tenant>}:<window>`, one slot on
   * Redis Cluster for both windows the reservation script reads. Default: `'dp_router:tokens:'`.
   */
  prefix?: string;
}

/**
 * A count as this store writes it: an integer. Anything else (another writer on a shared Redis)
 * is reported as an error, never read as a number, and the key is given the expiry ours carry
 * when it has none, so that it goes with its window instead of refusing the tenant for ever.
 */
const COUNT = `local function count(key, expireMs)
  local value = redis.call('GET', key)
  if not value then return 0 end
  local n = tonumber(value)
  if n == nil or n ~= n or n == math.huge or n == -math.huge or n ~= math.floor(n) then
    if redis.call('PTTL', key) == -1 then redis.call('PEXPIRE', key, expireMs) end
    return nil
  end
  return n
end
local function expire(key, expireMs)
  if redis.call('PTTL', key) == -1 then redis.call('PEXPIRE', key, expireMs) end
end
`;

/**
 * Checks and reserves in one atomic step: when `previous × weight + current < limit` (negative
 * counts as none), adds the tokens to the current window and answers `{1}`; else `{0, current,
 * previous}`. Keys expire after two windows (the sliding minute still reads the previous one)
 * and a margin for clock skew between replicas.
 * KEYS: current, previous; ARGV: tokens, limit, weight, expiry.
 */
const TAKE = `${COUNT}
local current = count(KEYS[1], ARGV[4])
local previous = count(KEYS[2], ARGV[4])
if current == nil or previous == nil then return redis.error_reply('${NOT_A_COUNT}') end
if math.max(previous, 0) * tonumber(ARGV[3]) + math.max(current, 0) >= tonumber(ARGV[2]) then
  return {0, tostring(current), tostring(previous)}
end
redis.call('INCRBY', KEYS[1], ARGV[1])
expire(KEYS[1], ARGV[4])
return {1}`;

/** Adds to a window's count (negative: a refund), with the same expiry. KEYS: the window; ARGV: tokens, expiry. */
const ADD = `${COUNT}
if count(KEYS[1], ARGV[2]) == nil then return redis.error_reply('${NOT_A_COUNT}') end
local n = redis.call('INCRBY', KEYS[1], ARGV[1])
expire(KEYS[1], ARGV[2])
return n`;
const EXPIRE_MS = String(2 * WINDOW_MS + 5_000);

/**
 * A token store in Redis, so that gateway replicas share one budget per tenant. `client` is
 * your own connected `ioredis` or `redis` (node-redis 4 or later) client; this package loads
 * neither. Each request checks and reserves its estimate with one Lua script, atomic across
 * replicas, and its answer settles the difference with another.
 *
 * @example
 * import Redis from 'ioredis';
 * dpRouter({ upstreams, admission: { tenant: { header: 'x-tenant-id', trust: true }, tokens: { perMinute: 200_000, store: redisTokenStore(new Redis(url)) } } });
 */
export function redisTokenStore(client: unknown, options: RedisTokenStoreOptions = {}): TokenStore {
  const send = commandOf(client);
  const prefix = options.prefix ?? 'dp_router:tokens:';
  // An empty hash tag (`{}`, or `{` then `}` at once) would hash each whole key: two slots again.
  if (typeof prefix !== 'string' || prefix.length === 0 || prefix.startsWith('}')) {
    fail('redisTokenStore.prefix', `must be a non-empty string that does not begin with '}', got ${shown(prefix)}`, "Use e.g. `{ prefix: 'dp_router:tokens:' }`.");
  }
  // Both windows of a tenant share the hash tag (the text between the first `{` and the first
  // `}` after it), so Redis Cluster keeps them in one slot: a script's keys must be (CROSSSLOT).
  const key = (tenant: string, window: number) => `{${prefix}${tenant}}:${window}`;
  const addScript = scriptOf(send, ADD);
  const takeScript = scriptOf(send, TAKE);
  return {
    kind: 'redis',
    async read(tenant, window): Promise<WindowCounts> {
      const values = (await send(['MGET', key(tenant, window), key(tenant, window - 1)])) as (string | null)[];
      // A value that is not a number reads as NaN: the budget takes that as the store failing.
      return { current: Number(values[0] ?? 0), previous: Number(values[1] ?? 0) };
    },
    async add(tenant, window, tokens) {
      await addScript([key(tenant, window)], [String(tokens), EXPIRE_MS]);
    },
    async take(tenant, window, tokens, limit, previousWeight): Promise<WindowCounts | undefined> {
      const answer = (await takeScript([key(tenant, window), key(tenant, window - 1)], [String(tokens), String(limit), String(previousWeight), EXPIRE_MS])) as unknown[];
      if (Number(answer[0]) === 1) return undefined;
      return { current: Number(answer[1]), previous: Number(answer[2]) };
    },
  };
}

/**
 * A script run by its SHA-1 (`EVALSHA`), its text sent (`EVAL`, which also caches it) only when
 * this Redis does not have it yet: on first use, or after a restart.
 */
function scriptOf(send: (args: string[]) => Promise<unknown>, script: string): (keys: string[], args: string[]) => Promise<unknown> {
  const digest = createHash('sha1').update(script).digest('hex');
  return async (keys, args) => {
    try {
      return await send(['EVALSHA', digest, String(keys.length), ...keys, ...args]);
    } catch (error) {
      if (!(error instanceof Error) || !error.message.startsWith('NOSCRIPT')) throw error;
      return send(['EVAL', script, String(keys.length), ...keys, ...args]);
    }
  };
}

function commandOf(client: unknown): (args: string[]) => Promise<unknown> {
  const ioredis = client as Partial<IoRedisLike> | null;
  if (typeof ioredis?.call === 'function') return ([command, ...args]) => ioredis.call!(command, ...args);
  const nodeRedis = client as Partial<NodeRedisLike> | null;
  if (typeof nodeRedis?.sendCommand === 'function') return (args) => nodeRedis.sendCommand!(args);
  return fail('redisTokenStore(client)', `must be an ioredis or node-redis client, got ${shown(client)}`, 'Pass e.g. `new Redis(url)` (ioredis) or `await createClient({ url }).connect()` (redis).');
}
