import { Resolver } from 'node:dns';
import { Counter, type Registry } from 'prom-client';
import type { MetricsConfig } from '../observe/metrics';
import type { UpstreamConfig } from '../upstreams/upstream-options';
import type { DnsConfig } from '../upstreams/dns-options';
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
  /** What it last resolved to (sorted, at most `dns.maxAddresses`); none before the first answer. */
  addresses: readonly string[];
  failing: boolean;
  /** The record type whose failure was told, while the other answers. */
  partial: RecordType | undefined;
  /** Whether an answer over `dns.maxAddresses` was told, until one fits again. */
  capped: boolean;
  poll: { stop(): void } | undefined;
}

/** Codes of an authoritative "no such records": the name has no endpoints. */
const NO_RECORDS = new Set(['ENOTFOUND', 'ENODATA']);

/**
 * Resolves every DNS entry's name (A and AAAA) at start and every `intervalMs` after the last
 * answer, and applies the upstreams its addresses make whenever they change, at most
 * `maxAddresses` of them (told once while an answer has more). NXDOMAIN or no records: no
 * endpoints of that entry. A timeout or a refusal keeps the last known set (of that record type
 * alone when the other answers), and is logged once per outage. Timers are unref'd.
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
    const { name, maxAddresses } = watch.dns;
    if (result.outcome === 'failed') {
      if (!watch.failing) {
        watch.failing = true;
        parts.warn(`express-dp-router: resolving '${name}' failed (${result.code}); keeping its last ${watch.addresses.length} address(es) until it answers again.`);
      }
    } else {
      const all = result.outcome === 'ok' ? result.addresses : [];
      if (watch.failing) {
        watch.failing = false;
        parts.warn(`express-dp-router: '${name}' resolves again.`);
      }
      const partial = result.partial;
      if (partial?.type !== watch.partial) {
        if (partial !== undefined) {
          parts.warn(
            `express-dp-router: resolving '${name}' for ${partial.type} records failed (${partial.code}); using the other record type's answer and the last ${partial.type} addresses (${partial.kept}) until ${partial.type} answers again.`,
          );
        } else parts.warn(`express-dp-router: '${name}' answers for ${watch.partial} records again.`);
        watch.partial = partial?.type;
      }
      if (all.length > maxAddresses && !watch.capped) {
        parts.warn(
          `express-dp-router: '${name}' resolves to ${all.length} addresses; routing to the first ${maxAddresses} (upstreams[].dns.maxAddresses) and leaving the rest out.`,
        );
      }
      watch.capped = all.length > maxAddresses;
      const addresses = all.length > maxAddresses ? all.slice(0, maxAddresses) : all;
      if (!sameList(addresses, watch.addresses)) {
        parts.warn(
          `express-dp-router: '${name}' resolves to ${addresses.length === 0 ? 'no address' : addresses.join(', ')} (was: ${watch.addresses.length === 0 ? 'none' : watch.addresses.join(', ')}); routing to those now.`,
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
      const watch: Watch = { key, dns, addresses: [], failing: false, partial: undefined, capped: false, poll: undefined };
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
 * result until `stop()`. A record type that fails while the other answers counts with its last
 * known addresses ({@link combineAnswers}). The timer is unref'd.
 */
export function pollName(dns: DnsConfig, answered: (result: Resolution) => void): { stop(): void } {
  const resolver = new Resolver({ timeout: dns.timeoutMs, tries: 1 });
  if (dns.servers !== undefined) resolver.setServers([...dns.servers]);
  let timer: NodeJS.Timeout | undefined;
  let stopped = false;
  let known: KnownAddresses = { A: [], AAAA: [] };
  const resolve = () => {
    resolveAddresses(resolver, dns.name).then((answers) => {
      if (stopped) return;
      const combined = combineAnswers(answers, known);
      known = combined.known;
      answered(combined.result);
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

/** The address record types asked. */
export type RecordType = 'A' | 'AAAA';

/** A record type that failed while the other answered: its last known addresses (`kept` of them) stood in. */
export interface PartialFailure {
  readonly type: RecordType;
  readonly code: string;
  readonly kept: number;
}

export type Resolution =
  | { outcome: 'ok'; addresses: string[]; partial?: PartialFailure }
  | { outcome: 'empty'; partial?: PartialFailure }
  | { outcome: 'failed'; code: string };

/** One record type's answer: its addresses (none for NXDOMAIN or no records), or the code it failed with. */
export type RecordAnswer = { addresses: string[] } | { code: string };

/** The last addresses each record type answered with. */
export type KnownAddresses = Readonly<Record<RecordType, readonly string[]>>;

/** The name's A and AAAA answers, each on its own: a server may refuse one type and answer the other. */
export async function resolveAddresses(resolver: Resolver, name: string): Promise<Record<RecordType, RecordAnswer>> {
  const [v4, v6] = await Promise.allSettled([promised<string[]>((done) => resolver.resolve4(name, done)), promised<string[]>((done) => resolver.resolve6(name, done))]);
  const answer = (settled: PromiseSettledResult<string[]>): RecordAnswer => {
    if (settled.status === 'fulfilled') return { addresses: settled.value };
    const code = String((settled.reason as NodeJS.ErrnoException).code ?? settled.reason);
    return NO_RECORDS.has(code) ? { addresses: [] } : { code };
  };
  return { A: answer(v4), AAAA: answer(v6) };
}

/**
 * One resolution from the two record types' answers: `failed` only when both failed for want of
 * an answer; when one failed, its last known addresses stand in (a refusal or a timeout keeps
 * the last known set, per record type), so one refused type never throws a good answer away.
 */
export function combineAnswers(answers: Record<RecordType, RecordAnswer>, known: KnownAddresses): { result: Resolution; known: KnownAddresses } {
  const { A, AAAA } = answers;
  if ('code' in A && 'code' in AAAA) return { result: { outcome: 'failed', code: A.code }, known };
  const next = { A: 'code' in A ? known.A : A.addresses, AAAA: 'code' in AAAA ? known.AAAA : AAAA.addresses };
  let partial: PartialFailure | undefined;
  for (const type of ['A', 'AAAA'] as const) {
    const answer = answers[type];
    if ('code' in answer) partial = { type, code: answer.code, kept: next[type].length };
  }
  const addresses = [...new Set([...next.A, ...next.AAAA])].sort();
  const result: Resolution = addresses.length === 0 ? { outcome: 'empty', ...(partial && { partial }) } : { outcome: 'ok', addresses, ...(partial && { partial }) };
  return { result, known: next };
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
