import { Registry } from 'prom-client';
import type { RouterEvents } from '../observe/events';
import type { RouterMetrics } from '../observe/metrics';
import { createTracing, type Tracing } from '../observe/tracing';
import { foreignRegistryNotice } from '../observe/registry-origin';
import { BodyBudget } from '../http/body-budget';
import type { Configuration } from '../options';
import { decodePool, type UpstreamConfig } from '../upstreams/upstream-options';
import { BodyReader } from '../request/body-reader';
import type { RequestInputs } from '../request/request-inputs';
import { watchEngines, watchedUpstreams, type EngineWatch } from '../upstreams/engine-watch';
import type { EndpointTable } from '../upstreams/endpoints';
import type { OutlierDetector } from '../upstreams/outlier-detector';
import { checkKvEventSources, poolPolicy, UpstreamPool, warnUnusedKvEvents } from './pool';
import type { RoutePolicy } from '../policies/route-policy';
import { startDnsDiscovery, type DnsDiscovery } from '../pools/dns-discovery';
import { createModelRouting, type ModelRouting } from '../pools/model-routing';
import { fixedUpstreams, hasDnsEntries } from '../pools/upstream-sources';
import { Admission } from '../admission/admission';
import { createAdmissionMetrics } from '../admission/metrics';
import { startPeers, type PeerLink } from '../peers/peer-link';
import { VllmBalancing } from '../request/vllm-balancing';
import { RankHeaderGuard } from '../upstreams/rank-header-guard';
import { createPeerMetrics } from '../peers/metrics';
import type { RouteSeam } from '../request/route-hooks';
import type { RouteState } from '../request/route-state';
import { routeSeam } from './features';
import { SloRouting } from '../slo/slo-routing';
import { createSloMetrics, type SloMetrics } from '../slo/metrics';

/**
 * Everything one router runs on, built from its configuration in one place, in dependency
 * order, and closed in the reverse order: the registry and tracing, the upstreams' pool (its
 * policy, endpoint table, metrics, the one event composite, exact prefix routing, outlier
 * detection and health checks: {@link UpstreamPool}), the engine watch (discovery, load
 * feedback), what the request path reads with (the body budget and reader), model pools, DNS
 * discovery and admission. What is not configured is not built.
 */
export class RouterServices {
  readonly policy: RoutePolicy;
  readonly table: EndpointTable;
  readonly registry: Registry;
  readonly metrics: RouterMetrics;
  /** OpenTelemetry reports, live when `@opentelemetry/api` is installed. */
  readonly tracing: Tracing;
  /** Metrics, tracing and logs of each event, told once. */
  readonly events: RouterEvents;
  readonly exact: UpstreamPool['exact'];
  /** Route receipts (`receipts`); `undefined` when off. */
  readonly receipts: UpstreamPool['receipts'];
  readonly detector: OutlierDetector | undefined;
  readonly inputs: RequestInputs;
  readonly bodies: BodyReader;
  /** Pools by model, the LoRA preference and the `GET /v1/models` union. */
  readonly models: ModelRouting;
  /** Admission control (`admission`); `undefined` when off. */
  readonly admission: Admission | undefined;
  /** SLO-aware routing (`slo`); `undefined` when off. */
  readonly slo: SloRouting | undefined;
  /** Its metric families, kept per endpoint whatever `slo` says. */
  private sloMetrics: SloMetrics | undefined;
  /** The link to the other gateway replicas (`peers`); `undefined` when off. */
  readonly peers: PeerLink | undefined;
  /** Where requests go that vLLM balances itself (paths it does not route by the rank header). */
  readonly balancing: VllmBalancing;
  /** Acts on a server that contradicts how the router reaches its ranks. */
  readonly rankHeaders: RankHeaderGuard;
  /** What each feature does at each point of a request's way (features.ts), built last. */
  readonly hooks: RouteSeam<RouteState>;
  private readonly watch: EngineWatch;
  /** Upstreams found by DNS; started with the first DNS entry. */
  private dns: DnsDiscovery | undefined;
  /** The upstreams' own services (policy, table, metrics, events, exact routing, detection, health checks, inputs). */
  private readonly pool: UpstreamPool;
  /** What `close()` stops, in the order it was started. */
  private readonly started: Array<() => void | Promise<void>> = [];
  private closed: Promise<void> | undefined;

  constructor(readonly config: Configuration) {
    const { policy, tokenizer } = poolPolicy(config.policy, config);
    this.registry = config.metrics?.registry ?? new Registry();
    // A package installed from a folder counts on a prom-client the app does not read (registry-origin.ts).
    const foreign = config.metrics === undefined ? undefined : foreignRegistryNotice(config.metrics.registry);
    if (foreign !== undefined) config.logger.warn(foreign);
    this.tracing = createTracing(policy.name);
    // The entries given by `url`; with disaggregation, the decode pool (the prefill pool is the terminal's).
    const fixed = fixedUpstreams(config.upstreams);
    const pool = (this.pool = new UpstreamPool({
      config,
      policy,
      tokenizer,
      upstreams: config.disaggregation === undefined ? fixed : decodePool(fixed),
      registry: this.registry,
      tracing: this.tracing,
      scraped: (upstreams) => watchedUpstreams(upstreams, config.loadFeedback),
      // Read per request, once the model pools (built below) exist.
      isAdapter: (model) => this.models.pools.isAdapter(model),
      // Whole requests only: a disaggregated request's cached tokens are its transfer's.
      receipts: config.disaggregation === undefined ? config.receipts : undefined,
    }));
    this.started.push(() => pool.close());
    this.policy = policy;
    const table = (this.table = pool.table);
    this.metrics = pool.metrics;
    this.events = pool.events;
    this.exact = pool.exact;
    this.receipts = pool.receipts;
    this.detector = pool.detector;
    this.inputs = pool.inputs;
    warnUnusedKvEvents(pool, config);
    const rankHeaders = (this.rankHeaders = new RankHeaderGuard({ table, metrics: pool.metrics, logger: config.logger, verdicts: pool.verdicts, header: config.header }));
    this.started.push(() => rankHeaders.close());
    // Discovery replaces one upstream's ranks and keeps everything else as it is; then the
    // engines its /metrics name are held against how the router reaches them.
    const watch = (this.watch = watchEngines(table, config.loadFeedback, pool.metrics, {
      discovered: (upstream, engines, ranks) => this.discovered(upstream, engines, ranks),
      engines: (upstream, engines) => rankHeaders.engines(upstream, engines),
    }));
    this.started.push(() => watch.stop());
    this.bodies = new BodyReader(new BodyBudget(config.maxBufferedBytes), config.timeouts.bodyMs);
    const models = (this.models = createModelRouting(table, (message) => config.logger.info({}, message)));
    this.balancing = new VllmBalancing(table, models.pools);
    this.started.push(() => models.stop());
    models.declareSources(decodePool(config.upstreams));
    // The decode pool's entries: the prefill pool follows its own (prefill-pool.ts).
    const sources = config.disaggregation === undefined ? config.upstreams : decodePool(config.upstreams);
    if (hasDnsEntries(sources)) this.dns = this.startDns(sources);
    this.started.push(() => this.dns?.stop());
    this.admission = this.startAdmission();
    this.slo = this.startSlo();
    this.peers = this.startPeers();
    this.hooks = routeSeam(this);
  }

  /** The peer link (`peers`); `undefined` when off. Built after the table whose endpoints it announces and loads. */
  private startPeers(): PeerLink | undefined {
    const { config, table } = this;
    if (config.peers === undefined) return undefined;
    const peers = startPeers(config.peers, table, createPeerMetrics(config.metrics), (message) => config.logger.warn(message));
    this.started.push(() => peers.close());
    return peers;
  }

  /** Throws for entries this router cannot take (`kvEvents` under prefix-aware without a tokenizer), before anything changes. */
  checkSources(sources: readonly UpstreamConfig[]): void {
    checkKvEventSources(this.config, sources);
  }

  /**
   * `setUpstreams()`: the entries, validated. Without DNS entries they are the upstreams;
   * with them, DNS discovery follows the entries and applies what their names resolve to.
   */
  setSources(sources: readonly UpstreamConfig[]): void {
    this.models.declareSources(sources);
    if (this.dns === undefined && !hasDnsEntries(sources)) this.reconfigure(sources);
    else (this.dns ??= this.startDns([])).set(sources);
  }

  /** Upstreams found by DNS join and leave through {@link reconfigure}, as setUpstreams() does. */
  private startDns(sources: readonly UpstreamConfig[]): DnsDiscovery {
    const { config, table } = this;
    return startDnsDiscovery(sources, { current: () => table.upstreams, apply: (upstreams) => this.reconfigure(upstreams), metrics: config.metrics, warn: (message) => config.logger.warn(message) });
  }

  /**
   * SLO-aware routing (`slo`); `undefined` when off. Its families are exported at 0 per endpoint
   * whatever `slo` says, so that dashboards and alerts on attainment see every rank from the start.
   */
  private startSlo(): SloRouting | undefined {
    const { config, table } = this;
    const metrics = (this.sloMetrics = createSloMetrics(config.metrics));
    for (const endpoint of table.healthy()) metrics.declare(endpoint);
    this.started.push(() => metrics.leave());
    return config.slo === undefined ? undefined : new SloRouting(config.slo, metrics);
  }

  /** Admission control (`admission`); `undefined` when off. Built after the table it watches. */
  private startAdmission(): Admission | undefined {
    const { config, table } = this;
    const admission =
      config.admission === undefined
        ? undefined
        : new Admission(config.admission, table, { metrics: createAdmissionMetrics(config.metrics, config.admission.classes), warn: (message) => config.logger.warn(message), error: (message) => config.logger.error({}, message) });
    if (admission !== undefined) this.started.push(() => admission.close());
    return admission;
  }

  /**
   * Replaces the upstreams: requests in flight finish where they are; every service follows
   * (metric series, engine watch, exact streams, health checks).
   */
  reconfigure(upstreams: readonly UpstreamConfig[]): void {
    const change = this.pool.reconfigure(upstreams);
    this.watch.sync();
    this.peers?.sync();
    this.models.reconfigure(this.table.upstreams, change.removed);
    // New endpoints have room for requests waiting already (a balanced one holds no rank's slot).
    for (const endpoint of change.added) if (!endpoint.balanced) this.admission?.freed(endpoint);
    for (const endpoint of change.removed) this.sloMetrics?.forget(endpoint);
    for (const endpoint of change.added) if (!endpoint.balanced) this.sloMetrics?.declare(endpoint);
  }

  /** Stops every timer and socket, last started first; the same promise on every call. */
  close(): Promise<void> {
    this.closed ??= (async () => {
      for (const stop of [...this.started].reverse()) await stop();
    })();
    return this.closed;
  }

  private discovered(upstream: UpstreamConfig, engines: readonly number[], ranks: readonly number[]): void {
    const startRank = engines[0];
    const discovered: UpstreamConfig = { ...upstream, startRank, dataParallelSize: engines[engines.length - 1] - startRank + 1, ranks };
    const routed = ranks.length === engines.length ? 'routing to those now' : `routing to ${ranks.join(', ')} of them now (its \`ranks\`)`;
    this.config.logger.info(
      { dpRouter: { upstream: upstream.name } },
      `express-dp-router: upstream '${upstream.name}' serves ranks ${engines.join(', ')} by its /metrics (was: ${upstream.ranks.join(', ')}); ${routed}.`,
    );
    this.reconfigure(this.table.upstreams.map((current) => (current.name === upstream.name ? discovered : current)));
  }
}
