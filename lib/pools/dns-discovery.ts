import { Resolver } from 'node:dns';
import { Counter, type Registry } from 'prom-client';
import type { MetricsConfig } from '../observe/metrics';
import type { UpstreamConfig } from '../upstreams/upstream-options';
import type { DnsConfig } from './dns-options';
import { expandSources } from './upstream-sources';

/** What one resolution of a name came to. */
export type DnsOutcome = 'ok' | 'empty' | 'failed';
export const DNS_OUTCOMES: readonly DnsOutcome[] = ['ok', 'empty', 'failed'];

/** The upstreams found by DNS, kept current. */
export interface DnsDiscovery {
  /** Follows `setUpstreams()`: the entries now; their upstreams are applied at once from what each name last resolved to. */
  set(sources: readonly UpstreamConfig[]): void;
  stop(): void;
}

/** What the discovery works with: how it reads and replaces the router's upstreams, and where it reports. */
export interface DnsDiscoveryParts {
  /** The router's upstreams now. */
  current(): readonly UpstreamConfig[];
  /** Replaces the router's upstreams, as `setUpstreams()` does (requests in flight finish). */
  apply(upstreams: readonly UpstreamConfig[]): void;
  metrics: MetricsConfig | undefined;
  warn(message: string): void;
}

/** One DNS name being watched. */
interface Watch {
  readonly key: string;
  readonly dns: DnsConfig;
  /** What it last resolved to (sorted); none before the first answer. */
  addresses: readonly string[];
  failing: boolean;
  poll: { stop(): void } | undefined;
}

/** Codes of an authoritative "no such records": the name has no endpoints. */
const NO_RECORDS = new Set(['ENOTFOUND', 'ENODATA']);

/**
 * Resolves every DNS entry's name (A and AAAA) at start and every `intervalMs` after the last
 * answer, and applies the upstreams its addresses make whenever they change. NXDOMAIN or no
 * records: no endpoints of that entry. A timeout or a refusal keeps the last known set, and is
 * logged once per outage. Timers are unref'd.
 */
export function startDnsDiscovery(sources: readonly UpstreamConfig[], parts: DnsDiscoveryParts): DnsDiscovery {
  const watches = new Map<string, Watch>();
  let entries = sources;
  let counter: Counter | undefined;
  const counted = new Set<string>();
  let stopped = false;

  const addressesOf = (dns: DnsConfig) => watches.get(keyOf(dns))?.addresses ?? [];
  const warnedDuplicates = new Set<string>();
  const compose = () =>
    expandSources(entries, addressesOf, parts.current(), (name) => {
      if (warnedDuplicates.has(name)) return;
      warnedDuplicates.add(name);
      parts.warn(`express-dp-router: two upstreams would be named '${name}'; the second is left out. Give each DNS entry its own \`name\`.`);
    });

  const count = (dns: DnsConfig, outcome: DnsOutcome) => counter?.inc({ name: dns.name, outcome });

  const answered = (watch: Watch, result: Resolution) => {
    count(watch.dns, result.outcome);
    if (result.outcome === 'failed') {
      if (!watch.failing) {
        watch.failing = true;
        parts.warn(
          `express-dp-router: resolving '${watch.dns.name}' failed (${result.code}); keeping its last ${watch.addresses.length} address(es) until it answers again.`,
        );
      }
    } else {
      const addresses = result.outcome === 'ok' ? result.addresses : [];
      if (watch.failing) {
        watch.failing = false;
        parts.warn(`express-dp-router: '${watch.dns.name}' resolves again.`);
      }
      if (!sameList(addresses, watch.addresses)) {
        parts.warn(
          `express-dp-router: '${watch.dns.name}' resolves to ${addresses.length === 0 ? 'no address' : addresses.join(', ')} (was: ${watch.addresses.length === 0 ? 'none' : watch.addresses.join(', ')}); routing to those now.`,
        );
        watch.addresses = addresses;
        parts.apply(compose());
      }
    }
  };

  const sync = () => {
    const wanted = new Map<string, DnsConfig>();
    for (const source of entries) if (source.dns !== undefined) wanted.set(keyOf(source.dns), source.dns);
    for (const [key, watch] of watches) {
      if (wanted.has(key)) continue;
      end(watch);
      watches.delete(key);
    }
    if (wanted.size > 0 && parts.metrics !== undefined) counter ??= dnsCounter(parts.metrics.registry, parts.metrics.prefix);
    const names = new Set([...wanted.values()].map((dns) => dns.name));
    for (const name of counted) {
      if (names.has(name)) continue;
      for (const outcome of DNS_OUTCOMES) counter?.remove({ name, outcome });
      counted.delete(name);
    }
    for (const name of names) {
      if (counted.has(name)) continue;
      counted.add(name);
      for (const outcome of DNS_OUTCOMES) counter?.inc({ name, outcome }, 0);
    }
    for (const [key, dns] of wanted) {
      if (watches.has(key)) continue;
      const watch: Watch = { key, dns, addresses: [], failing: false, poll: undefined };
      watches.set(key, watch);
      watch.poll = pollName(dns, (result) => answered(watch, result));
    }
  };

  const end = (watch: Watch) => watch.poll?.stop();

  sync();
  return {
    set(next) {
      if (stopped) return;
      entries = next;
      sync();
      parts.apply(compose());
    },
    stop() {
      stopped = true;
      for (const watch of watches.values()) end(watch);
      watches.clear();
      for (const name of counted) for (const outcome of DNS_OUTCOMES) counter?.remove({ name, outcome });
      counted.clear();
    },
  };
}

/**
 * Resolves `dns.name` (A and AAAA) at once and every `dns.intervalMs` after the last answer, of
 * `dns.servers` (or the system's), each query bounded by `dns.timeoutMs`; `answered` gets every
 * result until `stop()`. The timer is unref'd.
 */
export function pollName(dns: DnsConfig, answered: (result: Resolution) => void): { stop(): void } {
  const resolver = new Resolver({ timeout: dns.timeoutMs, tries: 1 });
  if (dns.servers !== undefined) resolver.setServers([...dns.servers]);
  let timer: NodeJS.Timeout | undefined;
  let stopped = false;
  const resolve = () => {
    resolveAddresses(resolver, dns.name).then((result) => {
      if (stopped) return;
      answered(result);
      timer = setTimeout(resolve, dns.intervalMs).unref();
    });
  };
  resolve();
  return {
    stop() {
      stopped = true;
      clearTimeout(timer);
      resolver.cancel();
    },
  };
}

/** A watch is one name asked of one set of servers, on one interval. */
function keyOf(dns: DnsConfig): string {
  return `${dns.name}\n${dns.port}\n${dns.servers?.join(',') ?? ''}\n${dns.intervalMs}`;
}

export type Resolution = { outcome: 'ok'; addresses: string[] } | { outcome: 'empty' } | { outcome: 'failed'; code: string };

/** The name's A and AAAA addresses, sorted; `failed` when either query failed for want of an answer. */
export async function resolveAddresses(resolver: Resolver, name: string): Promise<Resolution> {
  const [v4, v6] = await Promise.allSettled([promised<string[]>((done) => resolver.resolve4(name, done)), promised<string[]>((done) => resolver.resolve6(name, done))]);
  const addresses: string[] = [];
  for (const answer of [v4, v6]) {
    if (answer.status === 'fulfilled') {
      addresses.push(...answer.value);
      continue;
    }
    const code = String((answer.reason as NodeJS.ErrnoException).code ?? answer.reason);
    if (!NO_RECORDS.has(code)) return { outcome: 'failed', code };
  }
  if (addresses.length === 0) return { outcome: 'empty' };
  return { outcome: 'ok', addresses: [...new Set(addresses)].sort() };
}

function promised<T>(start: (done: (error: Error | null, value: T) => void) => void): Promise<T> {
  return new Promise((resolve, reject) => start((error, value) => (error ? reject(error) : resolve(value))));
}

function sameList(a: readonly string[], b: readonly string[]): boolean {
  return a.length === b.length && a.every((item, index) => item === b[index]);
}

/** `dns_resolutions_total`, got or created on the registry. */
function dnsCounter(registry: Registry, prefix: string): Counter {
  const name = `${prefix}dns_resolutions_total`;
  const existing = registry.getSingleMetric(name);
  if (existing instanceof Counter) return existing;
  return new Counter({ name, help: 'Resolutions of the DNS names upstreams are found by, by outcome (ok, empty, failed).', labelNames: ['name', 'outcome'], registers: [registry] });
}
