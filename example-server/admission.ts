import type { AdmissionOptions } from '../lib';
import { redisTokenStore } from '../lib';
import { redactUrl } from '../lib/upstreams/upstream-url';
import type { AdmissionFlags } from './cli';

/** The gateway's admission options from its flags, the Redis client it opened (`--redis`), and what closes that. */
export interface GatewayAdmission {
  readonly options: AdmissionOptions | undefined;
  /** The `--redis` client, shared by token budgets and `--peer-redis`. */
  readonly redis: unknown;
  close(): Promise<void>;
}

/**
 * `admission` from the command line: off unless an admission flag is given (`--redis` alone
 * counts, unless `--peer-redis` is what it is for: `peersOnRedis`). `--redis` loads ioredis only
 * then (the package's own dependencies never include a Redis client).
 */
export async function admissionFromFlags(flags: AdmissionFlags, warn: (message: string) => void, peersOnRedis = false): Promise<GatewayAdmission> {
  const { redisUrl, ...own } = flags;
  const on = Object.values(own).some((value) => value !== undefined) || (redisUrl !== undefined && !peersOnRedis);
  let close = async () => undefined as void;
  let store: ReturnType<typeof redisTokenStore> | undefined;
  let redis: unknown;
  if (flags.redisUrl !== undefined) {
    const { default: Redis } = (await import('ioredis')) as typeof import('ioredis');
    // A short retry so that an outage fails the store's calls fast: the router then fails open.
    const client = new Redis(flags.redisUrl, { maxRetriesPerRequest: 1, retryStrategy: (times) => Math.min(times * 200, 2000) });
    let reported = false;
    client.on('error', (error: Error) => {
      if (!reported) warn(`redis ${redactUrl(flags.redisUrl!)}: ${error.message}`);
      reported = true;
    });
    client.on('ready', () => (reported = false));
    store = redisTokenStore(client);
    redis = client;
    close = async () => void client.disconnect();
  }
  if (!on) return { options: undefined, redis, close };
  const options: AdmissionOptions = {
    maxInflightPerRank: flags.maxInflightPerRank,
    queue: { maxLength: flags.queueMax, timeoutMs: flags.queueTimeoutMs },
    ...(flags.tenantHeader !== undefined && { tenant: { header: flags.tenantHeader, ...(flags.trustTenant !== undefined && { trust: flags.trustTenant }) } }),
    ...(flags.tokensPerMinute !== undefined && { tokens: { perMinute: flags.tokensPerMinute, store } }),
  };
  return { options, redis, close };
}
