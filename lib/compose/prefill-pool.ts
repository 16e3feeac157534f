import type { Registry } from 'prom-client';
import type { Tracing } from '../observe/tracing';
import type { Configuration } from '../options';
import type { RouteEndpoint } from '../upstreams/endpoints';
import { poolPolicy, UpstreamPool, type PoolConfig } from './pool';
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
 * leg's metrics, and one HTTP client per upstream server.
 */
export class PrefillPool extends UpstreamPool {
  readonly legMetrics: DisaggregationMetrics | undefined;
  private readonly clients = new Map<string, PrefillClient>();
  private readonly connectMs: number;
  private readonly firstByteMs: number;

  constructor(config: PrefillPoolConfig, registry: Registry, tracing: Tracing) {
    const settings = config.disaggregation!;
    super({
      config,
      ...poolPolicy(settings.prefillPolicy, config),
      upstreams: prefillPool(config.upstreams),
      registry,
      tracing,
      // The prefill leg's hint is a header of its own; a body hint field names the decode rank.
      hints: { ...config.hints, header: PREFILL_HINT_HEADER, bodyField: undefined },
      // An upstream of both roles is the decode pool's to tell of.
      tellsHealthOf: (endpoint) => endpoint.config.role === 'prefill',
    });
    this.legMetrics = config.metrics === undefined ? undefined : createDisaggregationMetrics(registry, config.metrics.prefix, this.table.all);
    ({ connectMs: this.connectMs, firstByteMs: this.firstByteMs } = config.timeouts);
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
    for (const client of this.clients.values()) client.close();
    await super.close();
  }
}
