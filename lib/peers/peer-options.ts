import { isIP } from 'node:net';
import { fail, integerOption, isPlainObject, MAX_TIMER_MS, pathOf, rejectUnknownKeys, shown, type KeysEnum } from '../option-checks';
import { parseDns, type DnsConfig, type DnsOptions } from '../pools/dns-options';

/**
 * Gateway replicas that tell each other what they sent: each announces, per endpoint, its
 * in-flight count and the prefill its requests there still wait for, in UDP datagrams to the
 * others, as its counts change (batched per event-loop turn) and every `heartbeatMs`. Each
 * replica then prices the queue the engines really have, not a third of it
 * (docs/routing-quality.md, "Replicas that tell each other what they sent"). Every replica must
 * list the same upstreams (endpoints are matched by `<upstream name>#<rank>`) and run the same
 * policy settings. With `disaggregation`, what is announced is the decode pool's endpoints.
 */
export interface PeersOptions {
  /** Where this replica listens for its peers: `'host:port'` (an IP address; `'0.0.0.0:7946'` for every IPv4 interface). Required. */
  listen: string;
  /**
   * Every replica's `'host:port'` (IP addresses). The same list may be given to every replica:
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
   * A secret shared by the replicas, at least 16 characters: every datagram carries an
   * HMAC-SHA256 tag made with it, and one without a valid tag is dropped, so that nobody who can
   * reach the port can steer traffic by announcing load. Required.
   */
  secret: string;
  /** Time between full announcements, which also keep a replica counted. Default: `1_000` ms. */
  heartbeatMs?: number;
  /** A peer not heard from for this long counts for nothing (it stopped or restarted). Default: `3_000` ms. */
  ttlMs?: number;
}

/** A UDP address. */
export interface PeerAddress {
  readonly host: string;
  readonly port: number;
}

/** `peers`, resolved. */
export interface PeersConfig {
  readonly listen: PeerAddress;
  readonly addresses: readonly PeerAddress[];
  /** `undefined`: the addresses alone. */
  readonly dns: DnsConfig | undefined;
  readonly secret: Buffer;
  readonly heartbeatMs: number;
  readonly ttlMs: number;
}

const PEERS_KEYS: KeysEnum<PeersOptions> = { listen: true, addresses: true, dns: true, secret: true, heartbeatMs: true, ttlMs: true };
const HEARTBEAT_MS = 1_000;
const TTL_MS = 3_000;
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
  const secret = value.secret;
  if (typeof secret !== 'string' || secret.length < MIN_SECRET_CHARS) {
    fail(pathOf(path, 'secret'), `must be a string of at least ${MIN_SECRET_CHARS} characters, got ${typeof secret === 'string' ? `${secret.length} characters` : shown(secret)}`, 'Give every replica the same random secret, e.g. `openssl rand -hex 32`, from an environment variable.');
  }
  const heartbeatMs = integerOption(pathOf(path, 'heartbeatMs'), value.heartbeatMs, HEARTBEAT_MS, 10, MAX_TIMER_MS);
  const ttlMs = integerOption(pathOf(path, 'ttlMs'), value.ttlMs, Math.max(TTL_MS, 3 * heartbeatMs), 1, MAX_TIMER_MS);
  if (ttlMs <= heartbeatMs) {
    fail(pathOf(path, 'ttlMs'), `must be longer than heartbeatMs (${heartbeatMs}), got ${ttlMs}`, `A peer would expire between two heartbeats: use at least 3 × heartbeatMs (${3 * heartbeatMs}).`);
  }
  return { listen, addresses, dns, secret: Buffer.from(secret, 'utf8'), heartbeatMs, ttlMs };
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
