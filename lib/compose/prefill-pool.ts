import type { Registry } from 'prom-client';
import type { Tracing } from '../observe/tracing';
import type { Configuration } from '../options';
import type { RouteEndpoint } from '../upstreams/endpoints';
import { startDnsDiscovery, type DnsDiscovery } from '../pools/dns-discovery';
import { fixedUpstreams, hasDnsEntries } from '../pools/upstream-sources';
import { poolPolicy, UpstreamPool, type PoolConfig } from './pool';
import { RankHeaderGuard } from '../upstreams/rank-header-guard';
import { prefillPool, type UpstreamConfig } from '../upstreams/upstream-options';
import { createDisaggregationMetrics, type DisaggregationMetrics } from '../disaggregation/metrics';
import { PREFILL_HINT_HEADER } from '../disaggregation/options';
import { PrefillClient } from '../disaggregation/prefill-client';

/** The options the prefill leg's pool reads (the router's `Configuration` is one). */
export type PrefillPoolConfig = PoolConfig & Pick<Configuration, 'disaggregation' | 'upstreams' | 'timeouts'>;

/**
 * The prefill leg's own services: a pool of the prefill upstreams built as the router's own
 * ({@link UpstreamPool}: table, metric series, events, outlier detection, health checks, exact
 * prefix routing, the hint judged against its ranks) with `disaggregation.prefillPolicy`, the
 * leg's metrics, one HTTP client per upstream server, and the rank-header guard (a server whose
 * answer refuses the header gets prefill legs no more while its configuration stands). Prefill
 * entries found by DNS are followed here, by a DNS discovery of its own: the router's feeds the
 * decode pool.
 */
export class PrefillPool extends UpstreamPool {
  readonly legMetrics: DisaggregationMetrics | undefined;
  /** Acts on a prefill server that refuses the rank header it is sent, as the decode pool's guard does. */
  readonly rankHeaders: RankHeaderGuard;
  private readonly clients = new Map<string, PrefillClient>();
  private readonly connectMs: number;
  private readonly firstByteMs: number;
  /** Its entries found by DNS; started with the first. */
  private dns: DnsDiscovery | undefined;

  /** `isAdapter`: whether a model is a LoRA adapter, by the router's model pools (for exact routing). */
  constructor(
    private readonly config: PrefillPoolConfig,
    registry: Registry,
    tracing: Tracing,
    isAdapter?: (model: string) => boolean,
  ) {
    const settings = config.disaggregation!;
    const sources = prefillPool(config.upstreams);
    super({
      config,
      ...poolPolicy(settings.prefillPolicy, config),
      upstreams: fixedUpstreams(sources),
      registry,
      tracing,
      // The prefill leg's hint is a header of its own; a body hint field names the decode rank.
      hints: { ...config.hints, header: PREFILL_HINT_HEADER, bodyField: undefined },
      // An upstream of both roles is the decode pool's to tell of.
      tellsHealthOf: (endpoint) => endpoint.config.role === 'prefill',
      isAdapter,
    });
    this.legMetrics = config.metrics === undefined ? undefined : createDisaggregationMetrics(registry, config.metrics.prefix, this.table.all);
    ({ connectMs: this.connectMs, firstByteMs: this.firstByteMs } = config.timeouts);
    this.rankHeaders = new RankHeaderGuard({ table: this.table, metrics: this.metrics, logger: config.logger, verdicts: this.verdicts, header: config.header });
    if (hasDnsEntries(sources)) this.dns = this.startDns(sources);
  }

  /** `setUpstreams()`: the prefill entries; those found by DNS are resolved (from what their names last resolved to at once). */
  setSources(sources: readonly UpstreamConfig[]): void {
    if (this.dns === undefined && !hasDnsEntries(sources)) this.reconfigure(sources);
    else (this.dns ??= this.startDns([])).set(sources);
  }

  private startDns(sources: readonly UpstreamConfig[]): DnsDiscovery {
    const { config } = this;
    return startDnsDiscovery(sources, { current: () => this.table.upstreams, apply: (upstreams) => this.reconfigure(upstreams), metrics: config.metrics, warn: (message) => config.logger.warn(message) });
  }

  /** The client of the server `endpoint` is reached through, created on first use. */
  clientOf(endpoint: RouteEndpoint): PrefillClient {
    const key = `${endpoint.config.name}\n${endpoint.config.url}`;
    let client = this.clients.get(key);
    if (client === undefined) {
      client = new PrefillClient(endpoint.config, this.connectMs, this.firstByteMs);
      this.clients.set(key, client);
    }
    return client;
  }

  /** Replaces the prefill upstreams (`setUpstreams()`): requests in flight finish where they are. */
  override reconfigure(upstreams: readonly UpstreamConfig[]): ReturnType<UpstreamPool['reconfigure']> {
    const change = super.reconfigure(upstreams);
    this.legMetrics?.track(change);
    return change;
  }

  /** Stops its timers and sockets. */
  override async close(): Promise<void> {
    this.dns?.stop();
    for (const client of this.clients.values()) client.close();
    this.rankHeaders.close();
    await super.close();
  }
}
