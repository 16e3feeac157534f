import { Resolver } from 'node:dns';
import { fail, integerOption, isPlainObject, MAX_TIMER_MS, pathOf, rejectUnknownKeys, shown, type KeysEnum } from '../option-checks';

/**
 * An upstream found by DNS (a Kubernetes headless Service): every A and AAAA address `name`
 * resolves to becomes one upstream with the entry's other fields, re-resolved every `intervalMs`.
 */
export interface DnsOptions {
  /** The DNS name to resolve, e.g. `'vllm.default.svc.cluster.local'`. Required. */
  name: string;
  /** The port every resolved address serves the OpenAI API on. Required. */
  port: number;
  /** Time between resolutions. Default: `10_000` ms. */
  intervalMs?: number;
  /**
   * The DNS servers to ask, as `['10.96.0.10']` or `['127.0.0.1:5353']`. Default: the
   * system's resolvers (`/etc/resolv.conf`; `/etc/hosts` is not read).
   */
  servers?: readonly string[];
}

/** `upstreams[].dns`: a DNS name's addresses as upstreams, at most `maxAddresses` of them. */
export interface UpstreamDnsOptions extends DnsOptions {
  /**
   * The most addresses of one answer that become upstreams (the first in sorted order, the same
   * on every gateway replica); the rest are left out, with a warning. Each address makes
   * `dataParallelSize` endpoints and their metric series. Default: `64`.
   */
  maxAddresses?: number;
}

/** `upstreams[].dns` (or `peers.dns`), resolved. */
export interface DnsConfig {
  readonly name: string;
  readonly port: number;
  readonly intervalMs: number;
  /** `undefined`: the system's resolvers. */
  readonly servers: readonly string[] | undefined;
  /** How long one query may take before it counts as failed. */
  readonly timeoutMs: number;
  /** The entry's `name`, which prefixes each resolved upstream's name; `undefined`: the address alone. */
  readonly prefix: string | undefined;
  /** How many of one answer's addresses are used (`maxAddresses`). */
  readonly maxAddresses: number;
}

const INTERVAL_MS = 10_000;
const MIN_INTERVAL_MS = 10;
/** One query's bound: a resolver that has not answered by then is down for this round. */
const MAX_QUERY_MS = 2_000;
/** Addresses of one upstream DNS answer used by default: one answer of thousands of records must not make thousands of upstreams. */
const MAX_ADDRESSES = 64;
const DNS_KEYS: KeysEnum<DnsOptions> = { name: true, port: true, intervalMs: true, servers: true };
const UPSTREAM_DNS_KEYS: KeysEnum<UpstreamDnsOptions> = { ...DNS_KEYS, maxAddresses: true };
/** RFC 1123 host names (labels of letters, digits, `-` and `_`, dot-separated, an optional final dot). */
const HOST_NAME = /^(?=.{1,253}\.?$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?$/;

/** `upstreams[i].dns`, with its `maxAddresses`. Throws {@link OptionError}. */
export function parseUpstreamDns(path: string, value: unknown, prefix: unknown): DnsConfig {
  const config = parseDns(path, value, prefix, UPSTREAM_DNS_KEYS);
  return { ...config, maxAddresses: integerOption(pathOf(path, 'maxAddresses'), (value as UpstreamDnsOptions).maxAddresses, MAX_ADDRESSES, 1, 65_536) };
}

/** A `dns` option ({@link DnsOptions}: `peers.dns`). Throws {@link OptionError}. */
export function parseDns(path: string, value: unknown, prefix: unknown, keys: KeysEnum<DnsOptions> = DNS_KEYS): DnsConfig {
  if (!isPlainObject(value)) fail(path, `must be an object, got ${shown(value)}`, `Use e.g. \`${path}: { name: 'vllm.default.svc.cluster.local', port: 8000 }\`.`);
  rejectUnknownKeys(path, value, keys);
  const name = value.name;
  if (typeof name !== 'string' || !HOST_NAME.test(name)) {
    fail(pathOf(path, 'name'), `must be a DNS name, got ${shown(name)}`, `Use e.g. \`${pathOf(path, 'name')}: 'vllm.default.svc.cluster.local'\`.`);
  }
  if (value.port === undefined) fail(pathOf(path, 'port'), 'is required', `Use e.g. \`${pathOf(path, 'port')}: 8000\`: the port vLLM listens on.`);
  const port = integerOption(pathOf(path, 'port'), value.port, 8000, 1, 65_535);
  const intervalMs = integerOption(pathOf(path, 'intervalMs'), value.intervalMs, INTERVAL_MS, MIN_INTERVAL_MS, MAX_TIMER_MS);
  return { name, port, intervalMs, servers: parseServers(pathOf(path, 'servers'), value.servers), timeoutMs: Math.min(MAX_QUERY_MS, intervalMs), prefix: typeof prefix === 'string' ? prefix : undefined, maxAddresses: MAX_ADDRESSES };
}

function parseServers(path: string, value: unknown): readonly string[] | undefined {
  if (value === undefined) return undefined;
  const fix = `Use e.g. \`${path}: ['127.0.0.1:5353']\`, or leave it out for the system's resolvers.`;
  if (!Array.isArray(value) || value.length === 0 || !value.every((server) => typeof server === 'string')) {
    fail(path, `must be a non-empty array of DNS server addresses, got ${shown(value)}`, fix);
  }
  // node:dns checks the addresses itself (IPv4, IPv6, either with a port): ask it once here.
  try {
    new Resolver().setServers(value as string[]);
  } catch {
    fail(path, `holds an address that is not an IP address with an optional port (${value.map((server) => shown(server)).join(', ')})`, fix);
  }
  return [...(value as string[])];
}
