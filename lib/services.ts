import { Registry } from 'prom-client';
import { createExactRouting, type ExactRouting } from './exact-prefix/exact-routing';
import { loadTokenizer } from './exact-prefix/load-tokenizer';
import { exactTokenizer, requireTokenizerForKvEvents, unusedKvEventsNotice } from './exact-prefix/options';
import { createEvents, type RouterEvents } from './observe/events';
import { createMetrics, NO_METRICS, type RouterMetrics } from './observe/metrics';
import { createTracing, type Tracing } from './observe/tracing';
import { buildPolicy } from './policies/by-name';
import { BodyBudget } from './request/body-budget';
import type { Configuration, UpstreamConfig } from './options';
import { BodyReader } from './request/body-reader';
import { createRequestInputs, type RequestInputs } from './request/request-inputs';
import { startHealthChecks, type HealthChange, type HealthChecker } from './upstreams/health-checker';
import { healthLog } from './upstreams/health-log';
import { watchEngines, watchedUpstreams, type EngineWatch } from './upstreams/engine-watch';
import { EndpointTable, type RouteEndpoint } from './upstreams/endpoints';
import { OutlierDetector } from './upstreams/outlier-detector';
import type { Policy } from './types';
import { startDnsDiscovery, type DnsDiscovery } from './pools/dns-discovery';
import { createModelRouting, type ModelRouting } from './pools/model-routing';
import { fixedUpstreams, hasDnsEntries } from './pools/upstream-sources';
import { decodePool } from './disaggregation/options';
import { Admission } from './admission/admission';
import { createAdmissionMetrics } from './admission/metrics';

/**
 * Everything one router runs on, built from its configuration in one place, in dependency
 * order, and closed in the reverse order: the policy, the endpoint table, the registry and
 * metrics, tracing and the one event composite, the engine watch (discovery, load feedback),
 * exact prefix routing, outlier detection and health checks (dpRouter only), and what the
 * request path reads with (request inputs, the body budget and reader). What is not
 * configured is not built.
 */
export class RouterServices {
  readonly policy: Policy;
  readonly table: EndpointTable;
  readonly registry: Registry;
  readonly metrics: RouterMetrics;
  /** OpenTelemetry reports, live when `@opentelemetry/api` is installed. */
  readonly tracing: Tracing;
  /** Metrics, tracing and logs of each event, told once. */
  readonly events: RouterEvents;
  readonly exact: ExactRouting | undefined;
  readonly detector: OutlierDetector | undefined;
  readonly inputs: RequestInputs;
  readonly bodies: BodyReader;
  /** Pools by model, the LoRA preference and the `GET /v1/models` union. */
  readonly models: ModelRouting;
  /** Admission control (`admission`); `undefined` when off. */
  readonly admission: Admission | undefined;
  private readonly watch: EngineWatch;
  /** Upstreams found by DNS; started with the first DNS entry. */
  private dns: DnsDiscovery | undefined;
  private health: HealthChecker | undefined;
  private readonly healthChanged: HealthChange;
  /** What `close()` stops, in the order it was started. */
  private readonly started: Array<() => void | Promise<void>> = [];
  private closed: Promise<void> | undefined;

  constructor(readonly config: Configuration) {
    const policy = (this.policy = buildPolicy(config.policy, config));
    // The entries given by `url`; with disaggregation, the decode pool (the prefill pool is the terminal's).
    const fixed = fixedUpstreams(config.upstreams);
    const table = (this.table = new EndpointTable(config.disaggregation === undefined ? fixed : decodePool(fixed)));
    this.registry = config.metrics?.registry ?? new Registry();
    const metrics = (this.metrics = config.metrics ? createMetrics(this.registry, config.metrics.prefix, table, this.scraped()) : NO_METRICS);
    this.started.push(() => metrics.close());
    this.tracing = createTracing(policy.name);
    const events = (this.events = createEvents(metrics, this.tracing, config.logger, policy.name));
    // Discovery replaces one upstream's ranks and keeps everything else as it is.
    const watch = (this.watch = watchEngines(table, config.loadFeedback, metrics, (upstream, ranks) => this.discovered(upstream, ranks)));
    this.started.push(() => watch.stop());
    // Exact prefix routing: with a tokenizer, every upstream with `kvEvents` is subscribed to.
    const tokenizer = exactTokenizer(config.policy, config.prefixAware);
    const exact = (this.exact =
      tokenizer === undefined
        ? undefined
        : createExactRouting({
            upstreams: table.upstreams,
            tokenizer: loadTokenizer('prefixAware.tokenizer', tokenizer),
            metrics: config.metrics,
            warn: (message) => config.logger.warn(message),
          }));
    if (exact !== undefined) this.started.push(() => exact.close());
    const unusedKvEvents = unusedKvEventsNotice(table.upstreams, exact !== undefined, policy.name);
    if (unusedKvEvents !== undefined) config.logger.warn(unusedKvEvents);
    const detector = (this.detector = config.outlierDetection ? new OutlierDetector(table, config.outlierDetection, { ejected: (endpoint) => events.ejected(endpoint as RouteEndpoint) }) : undefined);
    if (detector !== undefined) this.started.push(() => detector.close());
    this.healthChanged = healthLog(config);
    this.health = config.healthCheck ? startHealthChecks(table, config.healthCheck, this.healthChanged) : undefined;
    this.started.push(() => this.health?.stop());
    this.inputs = createRequestInputs(config, policy, table);
    this.bodies = new BodyReader(new BodyBudget(config.maxBufferedBytes), config.timeouts.bodyMs);
    const models = (this.models = createModelRouting(table, (message) => config.logger.warn(message)));
    this.started.push(() => models.stop());
    if (hasDnsEntries(config.upstreams)) this.dns = this.startDns(config.upstreams);
    this.started.push(() => this.dns?.stop());
    this.admission = this.startAdmission();
  }

  /** Throws for entries this router cannot take (`kvEvents` under prefix-aware without a tokenizer), before anything changes. */
  checkSources(sources: readonly UpstreamConfig[]): void {
    const { policy, prefixAware } = this.config;
    requireTokenizerForKvEvents(sources, policy === 'prefix-aware', prefixAware.tokenizer);
  }

  /**
   * `setUpstreams()`: the entries, validated. Without DNS entries they are the upstreams;
   * with them, DNS discovery follows the entries and applies what their names resolve to.
   */
  setSources(sources: readonly UpstreamConfig[]): void {
    if (this.dns === undefined && !hasDnsEntries(sources)) this.reconfigure(sources);
    else (this.dns ??= this.startDns([])).set(sources);
  }

  /** Upstreams found by DNS join and leave through {@link reconfigure}, as setUpstreams() does. */
  private startDns(sources: readonly UpstreamConfig[]): DnsDiscovery {
    const { config, table } = this;
    return startDnsDiscovery(sources, { current: () => table.upstreams, apply: (upstreams) => this.reconfigure(upstreams), metrics: config.metrics, warn: (message) => config.logger.warn(message) });
  }

  /** Admission control (`admission`); `undefined` when off. Built after the table it watches. */
  private startAdmission(): Admission | undefined {
    const { config, table } = this;
    const admission =
      config.admission === undefined
        ? undefined
        : new Admission(config.admission, table, { metrics: createAdmissionMetrics(config.metrics, config.admission.classes), warn: (message) => config.logger.warn(message) });
    if (admission !== undefined) this.started.push(() => admission.close());
    return admission;
  }

  /**
   * Replaces the upstreams: requests in flight finish where they are; every service follows
   * (metric series, engine watch, exact streams, health checks).
   */
  reconfigure(upstreams: readonly UpstreamConfig[]): void {
    const { config, table } = this;
    const change = table.reconfigure(upstreams);
    this.metrics.track(change, this.scraped());
    this.watch.sync();
    this.exact?.reconfigure(table.upstreams);
    this.models.reconfigure(table.upstreams, change.removed);
    if (config.healthCheck) {
      this.health?.stop();
      this.health = startHealthChecks(table, config.healthCheck, this.healthChanged);
    }
    // New endpoints have room for requests waiting already.
    for (const endpoint of change.added) this.admission?.freed(endpoint);
  }

  /** Stops every timer and socket, last started first; the same promise on every call. */
  close(): Promise<void> {
    this.closed ??= (async () => {
      for (const stop of [...this.started].reverse()) await stop();
    })();
    return this.closed;
  }

  /** The upstreams the engine watch polls, for the scrape-failure series. */
  private scraped(): string[] {
    return watchedUpstreams(this.table.upstreams, this.config.loadFeedback);
  }

  private discovered(upstream: UpstreamConfig, ranks: readonly number[]): void {
    const startRank = ranks[0];
    const discovered: UpstreamConfig = { ...upstream, startRank, dataParallelSize: ranks[ranks.length - 1] - startRank + 1, ranks };
    this.config.logger.warn(
      `express-dp-router: upstream '${upstream.name}' serves ranks ${ranks.join(', ')} by its /metrics (was: ${upstream.ranks.join(', ')}); routing to those now.`,
    );
    this.reconfigure(this.table.upstreams.map((current) => (current.name === upstream.name ? discovered : current)));
  }
}
