import { isIP } from 'node:net';
import { fail, integerOption, isPlainObject, MAX_TIMER_MS, pathOf, rejectUnknownKeys, shown, type KeysEnum } from '../option-checks';
import { parseDns, type DnsConfig, type DnsOptions } from '../upstreams/dns-options';
import { redisPeerClient, type RedisPeerClient } from './redis-client';

/**
 * Gateway replicas that tell each other what they sent: each announces, per endpoint, its
 * in-flight count and the prefill its requests there still wait for, as its counts change
 * (coalesced, at most one batch every `announceMs`) and every `heartbeatMs`, in UDP datagrams
 * to the others (`listen`) or on a Redis pub/sub channel (`redis`). Each replica then prices
 * the queue the engines really have, not a third of it (docs/routing-quality.md, "Replicas
 * that tell each other what they sent"). Every replica must list the same upstreams (endpoints
 * are matched by `<upstream name>#<rank>`) and run the same policy settings. With
 * `disaggregation`, what is announced is the decode pool's endpoints.
 */
export interface PeersOptions {
  /**
   * UDP: where this replica listens for its peers, `'host:port'` (an IP address; `'0.0.0.0:7946'`
   * for every IPv4 interface). One of `listen` or `redis` is required.
   */
  listen?: string;
  /**
   * Redis: your connected `ioredis` or `redis` (node-redis 4+) client, the one `redisTokenStore`
   * takes. Announcements are published with it on `channel`; the router subscribes on a
   * `duplicate()` of it (a subscribed connection cannot publish), which it closes on `close()`;
   * your client stays yours to close. One of `listen` or `redis` is required.
   */
  redis?: unknown;
  /** The Redis pub/sub channel the replicas share (`redis` only). Default: `'dp-router:peers'`. */
  channel?: string;
  /**
   * UDP: every replica's `'host:port'` (IP addresses). The same list may be given to every replica:
   * a replica knows its own datagrams and ignores them. At least one, or `dns`.
   */
  addresses?: readonly string[];
  /**
   * The replicas found by DNS (a Kubernetes headless Service of the gateway pods): every A and
   * AAAA address of `name`, at `port`, re-resolved every `intervalMs` (10 s); a failed
   * resolution keeps the last addresses. With `addresses`, both are announced to.
   */
  dns?: DnsOptions;
  /**
   * A secret shared by the replicas, at least 16 characters: every announcement carries an
   * HMAC-SHA256 tag made with it, and one without a valid tag is dropped, so that nobody who can
   * reach the port, or publish on a Redis that other applications share, can steer traffic by
   * announcing load. Required for both transports.
   */
  secret: string;
  /** Time between full announcements, which also keep a replica counted. Default: `1_000` ms. */
  heartbeatMs?: number;
  /**
   * A peer not heard from for this long counts for nothing (it stopped or restarted). Also the
   * most an announcement's signed time may differ from the receiver's clock: keep the replicas'
   * clocks in step (NTP). Default: `3_000` ms, and at least 3 × `heartbeatMs`.
   */
  ttlMs?: number;
  /**
   * The most often changed counts are announced: changes are gathered for this long and sent
   * as one batch (one tag), only for endpoints whose in-flight mean over the interval (weighted
   * by time) moved by at least 1 and an eighth of what was last announced, or whose count held a
   * new value through it; the heartbeat sends everything. Default: `50` ms.
   */
  announceMs?: number;
}

/** A UDP address. */
export interface PeerAddress {
  readonly host: string;
  readonly port: number;
}

/** `peers.redis` and `peers.channel`, resolved. */
export interface RedisPeersConfig {
  readonly client: RedisPeerClient;
  readonly channel: string;
}

/** `peers`, resolved. */
export interface PeersConfig {
  /** UDP; `undefined` with `redis`. */
  readonly listen: PeerAddress | undefined;
  readonly addresses: readonly PeerAddress[];
  /** `undefined`: the addresses alone. */
  readonly dns: DnsConfig | undefined;
  readonly secret: Buffer;
  readonly heartbeatMs: number;
  readonly ttlMs: number;
  readonly announceMs: number;
  /** Redis pub/sub; `undefined` over UDP. */
  readonly redis: RedisPeersConfig | undefined;
}

const PEERS_KEYS: KeysEnum<PeersOptions> = { listen: true, redis: true, channel: true, addresses: true, dns: true, secret: true, heartbeatMs: true, ttlMs: true, announceMs: true };
const HEARTBEAT_MS = 1_000;
const TTL_MS = 3_000;
const ANNOUNCE_MS = 50;
const CHANNEL = 'dp-router:peers';
const MIN_SECRET_CHARS = 16;
/**
 * Replicas announced to, from `addresses` and from what `dns` resolves to: more would make each
 * change a burst of datagrams; gossip would be the next step.
 */
export const MAX_PEERS = 64;
const EXAMPLE = "`peers: { listen: '0.0.0.0:7946', addresses: ['10.0.0.5:7946', '10.0.0.6:7946'], secret: process.env.DP_ROUTER_PEER_SECRET }`";

/** `peers`: `undefined` when off (the default). */
export function parsePeers(path: string, value: unknown): PeersConfig | undefined {
  if (value === undefined || value === false) return undefined;
  if (!isPlainObject(value)) fail(path, `must be an object, got ${shown(value)}`, `Use ${EXAMPLE}.`);
  rejectUnknownKeys(path, value, PEERS_KEYS);
  const secret = parseSecret(pathOf(path, 'secret'), value.secret);
  const heartbeatMs = integerOption(pathOf(path, 'heartbeatMs'), value.heartbeatMs, HEARTBEAT_MS, 10, MAX_TIMER_MS);
  const ttlMs = integerOption(pathOf(path, 'ttlMs'), value.ttlMs, Math.max(TTL_MS, 3 * heartbeatMs), 1, MAX_TIMER_MS);
  if (ttlMs <= heartbeatMs) {
    fail(pathOf(path, 'ttlMs'), `must be longer than heartbeatMs (${heartbeatMs}), got ${ttlMs}`, `A peer would expire between two heartbeats: use at least 3 × heartbeatMs (${3 * heartbeatMs}).`);
  }
  const announceMs = integerOption(pathOf(path, 'announceMs'), value.announceMs, Math.min(ANNOUNCE_MS, heartbeatMs), 1, heartbeatMs);
  const timing = { secret, heartbeatMs, ttlMs, announceMs };
  if (value.redis !== undefined) {
    for (const udp of ['listen', 'addresses', 'dns'] as const) {
      if (value[udp] !== undefined) fail(pathOf(path, udp), 'is an option of the UDP transport, and `redis` is given', 'Give either `redis` (and `channel`) or `listen` with `addresses` or `dns`.');
    }
    const client = redisPeerClient(pathOf(path, 'redis'), value.redis);
    const channel = value.channel ?? CHANNEL;
    if (typeof channel !== 'string' || channel === '') fail(pathOf(path, 'channel'), `must be a non-empty string, got ${shown(channel)}`, `Use e.g. \`channel: '${CHANNEL}'\`, the same on every replica.`);
    return { listen: undefined, addresses: [], dns: undefined, redis: { client, channel }, ...timing };
  }
  if (value.channel !== undefined) fail(pathOf(path, 'channel'), 'is the Redis channel, and `redis` is not given', 'Give `redis: client` too, or drop `channel`.');
  if (value.listen === undefined) {
    fail(pathOf(path, 'listen'), 'is required without `redis`', `Use ${EXAMPLE}, or \`peers: { redis: client, secret }\` to share load through your Redis.`);
  }
  const listen = parseAddress(pathOf(path, 'listen'), value.listen);
  const list = value.addresses;
  const dns = value.dns === undefined ? undefined : parseDns(pathOf(path, 'dns'), value.dns, undefined);
  if (list === undefined && dns === undefined) {
    fail(pathOf(path, 'addresses'), 'is required without `dns`', `Use ${EXAMPLE}, or \`dns: { name: 'gateway-peers.default.svc.cluster.local', port: 7946 }\` for a headless Service.`);
  }
  if (list !== undefined && (!Array.isArray(list) || list.length === 0 || list.length > MAX_PEERS)) {
    fail(pathOf(path, 'addresses'), `must be an array of 1 to ${MAX_PEERS} 'host:port' strings, got ${shown(list)}`, `Use ${EXAMPLE}.`);
  }
  const addresses = ((list ?? []) as unknown[]).map((entry, at) => parseAddress(`${pathOf(path, 'addresses')}[${at}]`, entry));
  return { listen, addresses, dns, redis: undefined, ...timing };
}

/**
 * Required over Redis as over UDP: the Redis a fleet already runs for token budgets is shared
 * (other applications, other teams' gateways), and its default user may publish on any
 * channel; an ACL that limits who publishes on the peers' channel is not the default.
 */
function parseSecret(path: string, secret: unknown): Buffer {
  if (typeof secret !== 'string' || secret.length < MIN_SECRET_CHARS) {
    fail(path, `must be a string of at least ${MIN_SECRET_CHARS} characters, got ${typeof secret === 'string' ? `${secret.length} characters` : shown(secret)}`, 'Give every replica the same random secret, e.g. `openssl rand -hex 32`, from an environment variable.');
  }
  return Buffer.from(secret, 'utf8');
}

/** `'host:port'` with an IP address (`[::1]:7946` for IPv6). */
function parseAddress(path: string, value: unknown): PeerAddress {
  const fix = "Use an IP address and a port, e.g. '10.0.0.5:7946' or '[fd00::5]:7946'.";
  if (typeof value !== 'string') return fail(path, `must be a 'host:port' string, got ${shown(value)}`, fix);
  const match = /^(?:\[([^\]]+)\]|([^:[\]]+)):(\d{1,5})$/.exec(value);
  const host = match?.[1] ?? match?.[2];
  const port = match === null ? NaN : Number(match[3]);
  if (host === undefined || isIP(host) === 0 || !(port >= 0 && port <= 65_535)) {
    return fail(path, `must be 'host:port' with an IP address and a port from 0 to 65535, got ${shown(value)}`, fix);
  }
  return { host, port };
}
