import type { UpstreamConfig } from '../upstreams/upstream-options';
import type { DnsConfig } from '../upstreams/dns-options';

/** The entries given by `url`: the upstreams known before any DNS name is resolved. */
export function fixedUpstreams(sources: readonly UpstreamConfig[]): UpstreamConfig[] {
  return sources.filter((source) => source.dns === undefined);
}

/** Whether any entry is found by DNS. */
export function hasDnsEntries(sources: readonly UpstreamConfig[]): boolean {
  return sources.some((source) => source.dns !== undefined);
}

/** The name of the upstream a DNS entry makes of one address: `<name>/<address>`, or the address. */
export function resolvedName(dns: DnsConfig, address: string): string {
  return dns.prefix === undefined ? address : `${dns.prefix}/${address}`;
}

/**
 * The upstream list the entries stand for now: a `url` entry as it is, a DNS entry as one
 * upstream per address it last resolved to, in the entry's place. An upstream made from the
 * same entry before (in `current`) is reused as it is, so that ranks discovery learned for it
 * stay. A name met twice keeps its first upstream (`skipped` hears of the others).
 */
export function expandSources(
  sources: readonly UpstreamConfig[],
  addressesOf: (dns: DnsConfig) => readonly string[],
  current: readonly UpstreamConfig[],
  skipped: (name: string) => void = () => undefined,
): UpstreamConfig[] {
  const previous = new Map(current.map((upstream) => [upstream.name, upstream]));
  const names = new Set<string>();
  const out: UpstreamConfig[] = [];
  const add = (upstream: UpstreamConfig) => {
    if (names.has(upstream.name)) {
      skipped(upstream.name);
      return;
    }
    names.add(upstream.name);
    out.push(upstream);
  };
  for (const source of sources) {
    const dns = source.dns;
    if (dns === undefined) {
      add(source);
      continue;
    }
    for (const address of addressesOf(dns)) {
      const name = resolvedName(dns, address);
      const url = `http://${address.includes(':') ? `[${address}]` : address}:${dns.port}`;
      const kept = previous.get(name);
      add(kept !== undefined && kept.dns === dns && kept.url === url ? kept : { ...source, name, url });
    }
  }
  return out;
}
