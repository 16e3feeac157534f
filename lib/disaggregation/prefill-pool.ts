import type { Registry } from 'prom-client';
import { createExactRouting, type ExactRouting } from '../exact-prefix/exact-routing';
import { exactTokenizer } from '../exact-prefix/options';
import { loadTokenizer } from '../exact-prefix/load-tokenizer';
import { createMetrics, NO_METRICS, type RouterMetrics } from '../observe/metrics';
import type { Tracing } from '../observe/tracing';
import type { Configuration } from '../options';
import { buildPolicy } from '../policies/by-name';
import type { Policy } from '../types';
import { createRequestInputs, type RequestInputs } from '../request/request-inputs';
import { EndpointTable, type RouteEndpoint } from '../upstreams/endpoints';
import { startHealthChecks, type HealthChecker } from '../upstreams/health-checker';
import { OutlierDetector } from '../upstreams/outlier-detector';
import type { UpstreamConfig } from '../upstreams/upstream-options';
import { createDisaggregationMetrics, type DisaggregationMetrics } from './metrics';
import { prefillPool } from './options';
import { PrefillClient } from './prefill-client';

/** The header a trusted caller names the prefill rank with (the rank header names the decode rank). */
export const PREFILL_HINT_HEADER = 'x-data-parallel-prefill-rank';

/**
 * The prefill leg's own services, built like the router's for the decode pool: an endpoint
 * table (its in-flight counts and health), the existing metric families joined for its
 * endpoints, outlier detection, health checks, exact prefix routing on its KV events, the hint
 * judged against its ranks, and one HTTP client per upstream server.
 */
export class PrefillPool {
  readonly table: EndpointTable;
  readonly metrics: RouterMetrics;
  readonly legMetrics: DisaggregationMetrics | undefined;
  readonly detector: OutlierDetector | undefined;
  readonly inputs: RequestInputs;
  readonly exact: ExactRouting | undefined;
  /** The policy that picks the prefill rank (`disaggregation.prefillPolicy`). */
  readonly policy: Policy;
  private health: HealthChecker | undefined;
  private readonly clients = new Map<string, PrefillClient>();

  constructor(
    private readonly config: Configuration,
    registry: Registry,
    tracing: Tracing,
  ) {
    const settings = config.disaggregation!;
    const policy = (this.policy = buildPolicy(settings.prefillPolicy, config));
    const upstreams = prefillPool(config.upstreams);
    const table = (this.table = new EndpointTable(upstreams));
    const prefix = config.metrics?.prefix;
    this.metrics = prefix === undefined ? NO_METRICS : createMetrics(registry, prefix, table, []);
    this.legMetrics = prefix === undefined ? undefined : createDisaggregationMetrics(registry, prefix, table.all);
    const ejected = (endpoint: RouteEndpoint) => {
      this.metrics.ejected(endpoint);
      tracing.ejected(endpoint);
      config.logger.ejected(endpoint);
    };
    this.detector = config.outlierDetection ? new OutlierDetector(table, config.outlierDetection, { ejected: (endpoint) => ejected(endpoint as RouteEndpoint) }) : undefined;
    this.health = config.healthCheck ? startHealthChecks(table, config.healthCheck) : undefined;
    // The prefill leg's hint is a header of its own; a body hint field names the decode rank.
    this.inputs = createRequestInputs({ hints: { ...config.hints, header: PREFILL_HINT_HEADER, bodyField: undefined }, affinity: config.affinity }, policy, table);
    const tokenizer = exactTokenizer(settings.prefillPolicy, config.prefixAware);
    this.exact =
      tokenizer === undefined || !upstreams.some((upstream) => upstream.kvEvents !== undefined)
        ? undefined
        : createExactRouting({
            upstreams,
            tokenizer: loadTokenizer('prefixAware.tokenizer', tokenizer),
            metrics: config.metrics,
            warn: (message) => config.logger.warn(message),
          });
  }

  /** The client of the server `endpoint` is reached through, created on first use. */
  clientOf(endpoint: RouteEndpoint): PrefillClient {
    const key = `${endpoint.config.name}\n${endpoint.config.url}`;
    let client = this.clients.get(key);
    if (client === undefined) {
      client = new PrefillClient(endpoint.config, this.config.timeouts.connectMs, this.config.timeouts.firstByteMs);
      this.clients.set(key, client);
    }
    return client;
  }

  /** Replaces the prefill upstreams (`setUpstreams()`): requests in flight finish where they are. */
  reconfigure(upstreams: readonly UpstreamConfig[]): void {
    const change = this.table.reconfigure(upstreams);
    this.metrics.track(change, []);
    this.legMetrics?.track(change);
    this.exact?.reconfigure(this.table.upstreams);
    if (this.config.healthCheck) {
      this.health?.stop();
      this.health = startHealthChecks(this.table, this.config.healthCheck);
    }
  }

  /** Stops its timers and sockets. */
  async close(): Promise<void> {
    this.health?.stop();
    this.detector?.close();
    for (const client of this.clients.values()) client.close();
    this.metrics.close();
    await this.exact?.close();
  }
}
