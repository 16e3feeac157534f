import type { AdmissionOptions } from '../lib';
import { redisTokenStore } from '../lib';
import { redactUrl } from '../lib/upstreams/upstream-url';
import type { AdmissionFlags } from './cli';

/** The gateway's admission options from its flags, the Redis client it opened (`--redis`), and what closes that. */
export interface GatewayAdmission {
  readonly options: AdmissionOptions | undefined;
  /** The `--redis` client, shared by token budgets and `--peer-redis`. */
  readonly redis: unknown;
  /** What `/readyz` says of the token budgets: see {@link TokenStoreReadiness}. */
  readiness(): TokenStoreReadiness;
  close(): Promise<void>;
}

/**
 * The token store as `/readyz` tells it. `refused`: Redis has refused the `--redis` credentials
 * since start and never answered: a configuration to fix, so the replica is not ready (a rollout
 * with a wrong password stops at its first pod). `degraded`: Redis is unreachable (or refuses
 * credentials it took before: a rotated password): the router fails open, serving without
 * budgets, and the replica stays ready, since every replica shares that Redis and taking them
 * all out of service would turn a limiter's outage into the gateway's.
 */
export type TokenStoreReadiness = 'ok' | 'degraded' | 'refused';

/** Redis's answers that refuse who we are: `WRONGPASS`, `NOAUTH`, `NOPERM`. */
const REFUSED_CREDENTIALS = /^(?:WRONGPASS|NOAUTH|NOPERM)\b|invalid password/i;

/**
 * `admission` from the command line: off unless an admission flag is given (`--redis` alone
 * counts, unless `--peer-redis` is what it is for: `peersOnRedis`). `--redis` loads ioredis only
 * then (the package's own dependencies never include a Redis client).
 */
export async function admissionFromFlags(flags: AdmissionFlags, warn: (message: string) => void, peersOnRedis = false, error: (message: string) => void = warn): Promise<GatewayAdmission> {
  const { redisUrl, ...own } = flags;
  const on = Object.values(own).some((value) => value !== undefined) || (redisUrl !== undefined && !peersOnRedis);
  let close = async () => undefined as void;
  let store: ReturnType<typeof redisTokenStore> | undefined;
  let redis: unknown;
  let readiness = (): TokenStoreReadiness => 'ok';
  if (flags.redisUrl !== undefined) {
    const { default: Redis } = (await import('ioredis')) as typeof import('ioredis');
    // A short retry so that an outage fails the store's calls fast: the router then fails open.
    const client = new Redis(flags.redisUrl, { maxRetriesPerRequest: 1, retryStrategy: (times) => Math.min(times * 200, 2000) });
    let reported = false;
    let answered = false;
    let refused = false;
    client.on('error', (problem: Error) => {
      refused = REFUSED_CREDENTIALS.test(problem.message);
      if (!reported) (refused ? error : warn)(`redis ${redactUrl(flags.redisUrl!)}: ${problem.message}${refused ? ' (check the password in the --redis URL)' : ''}`);
      reported = true;
    });
    client.on('ready', () => {
      reported = false;
      answered = true;
      refused = false;
    });
    store = redisTokenStore(client);
    redis = client;
    close = async () => void client.disconnect();
    if (flags.tokensPerMinute !== undefined) readiness = () => (client.status === 'ready' ? 'ok' : refused && !answered ? 'refused' : 'degraded');
  }
  if (!on) return { options: undefined, redis, readiness, close };
  const options: AdmissionOptions = {
    maxInflightPerRank: flags.maxInflightPerRank,
    queue: { maxLength: flags.queueMax, timeoutMs: flags.queueTimeoutMs },
    ...(flags.tenantHeader !== undefined && { tenant: { header: flags.tenantHeader, ...(flags.trustTenant !== undefined && { trust: flags.trustTenant }) } }),
    ...(flags.tokensPerMinute !== undefined && { tokens: { perMinute: flags.tokensPerMinute, store } }),
  };
  return { options, redis, readiness, close };
}
