import { Gauge, register, type Registry } from 'prom-client';
import { counterFamily, histogramFamily, type CounterSeries, type HistogramSeries } from './collected-metrics';
import { fail, isPlainObject, pathOf, section, shown, type KeysEnum } from '../option-checks';
import type { DecisionSource, HintOutcome, UpstreamErrorKind } from '../types';

/** Metrics settings. */
export interface MetricsOptions {
  /** The prom-client registry to register on. Default: prom-client's global `register`. */
  registry?: Registry;
  /** Metric name prefix. Default: `'dp_router_'`. */
  prefix?: string;
}

/** `metrics`, resolved. */
export interface MetricsConfig {
  readonly registry: Registry;
  readonly prefix: string;
}

const PREFIX = 'dp_router_';
const METRIC_PREFIX = /^(?:[a-zA-Z_:][a-zA-Z0-9_:]*)?$/;
const METRICS_KEYS: KeysEnum<MetricsOptions> = { registry: true, prefix: true };

/** `metrics`: on by default, on prom-client's global registry; `undefined` when off. */
export function parseMetrics(path: string, value: unknown): MetricsConfig | undefined {
  if (value === false) return undefined;
  const metrics = section(path, value, METRICS_KEYS);
  const registry = metrics.registry ?? register;
  if (!isPlainObject(registry) || typeof (registry as { getSingleMetric?: unknown }).getSingleMetric !== 'function') {
    fail(pathOf(path, 'registry'), `must be a prom-client Registry, got ${shown(metrics.registry)}`, 'Pass `new Registry()` from prom-client, or leave it out for the global registry.');
  }
  const prefix = metrics.prefix ?? PREFIX;
  if (typeof prefix !== 'string' || !METRIC_PREFIX.test(prefix)) {
    fail(pathOf(path, 'prefix'), `must be a valid Prometheus metric name prefix, got ${shown(metrics.prefix)}`, `Use e.g. \`prefix: '${PREFIX}'\`.`);
  }
  return { registry: registry as unknown as Registry, prefix };
}

// The domain types live in types.ts; re-exported for the modules that count them.
export type { HintOutcome, UpstreamErrorKind } from '../types';

export const HINT_OUTCOMES: readonly HintOutcome[] = ['accepted', 'untrusted', 'malformed', 'out_of_range', 'unavailable'];
/**
 * What told the router an upstream does not take its rank header (`rank_header_rejections_total`):
 * an `answer` (vLLM's 400 `data_parallel_rank N is out of range [0, M).`, or that error as a
 * stream's first event), or a read of its `/metrics` whose engines contradict the configuration.
 */
export type RankHeaderEvidence = 'answer' | 'metrics';
export const RANK_HEADER_EVIDENCE: readonly RankHeaderEvidence[] = ['answer', 'metrics'];
export const UPSTREAM_ERROR_KINDS: readonly UpstreamErrorKind[] = ['connect', 'timeout', 'reset', 'status_5xx'];
/** From a cached short completion to a long generation. */
const DURATION_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600];
/** From a warm prefix-cache hit (tens of ms) to a long prompt queued behind others (a minute). */
const FIRST_TOKEN_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60];

/** What the instruments read of an endpoint (the router's `RouteEndpoint`); typed here so that metrics depend on no other part. */
export interface MeteredEndpoint {
  readonly upstream: string;
  /** The rank as a label value, made once (`vllm` where vLLM picks the engine). */
  readonly rankLabel: string;
  readonly inflight: number;
  readonly healthy: boolean;
  /** The upstream's one endpoint without a rank: its series stand for the upstream too. */
  readonly balanced: boolean;
}

/** The router's instruments; a no-op stands in when metrics are off. */
export interface RouterMetrics {
  hint(outcome: HintOutcome): void;
  dispatched(endpoint: MeteredEndpoint, source: DecisionSource): void;
  finished(endpoint: MeteredEndpoint, seconds: number): void;
  upstreamError(endpoint: MeteredEndpoint, kind: UpstreamErrorKind): void;
  /** A 2xx answer's first token came `seconds` after dispatch (the caller finds it: `answeredFirst`). */
  firstToken(endpoint: MeteredEndpoint, seconds: number): void;
  /** A request is sent again elsewhere after `endpoint` failed it. */
  retried(endpoint: MeteredEndpoint): void;
  /** The outlier detector took `endpoint` out of rotation. */
  ejected(endpoint: MeteredEndpoint): void;
  /** A failed read of an upstream's `/metrics` (discovery, load feedback). */
  scrapeFailed(upstream: string): void;
  /** The upstream does not take the rank header the router sends it, by `evidence`. */
  rankHeaderRejected(upstream: string, evidence: RankHeaderEvidence): void;
  /** Follows a reconfiguration: zero-filled series for new endpoints, none left for removed ones. */
  track(change: { added: readonly MeteredEndpoint[]; removed: readonly MeteredEndpoint[] }, scrapedUpstreams: readonly string[]): void;
  /** Stops reporting this router's gauges (the families stay for other routers). */
  close(): void;
}

/** An endpoint's series: plain fields, read at scrape time (collected-metrics.ts). */
interface EndpointInstruments {
  readonly labels: { upstream: string; rank: string };
  /** A balanced endpoint has no `hint` series: a hint never goes there. */
  readonly requests: Partial<Record<DecisionSource, CounterSeries>>;
  readonly duration: HistogramSeries;
  readonly firstToken: HistogramSeries;
  readonly errors: Record<UpstreamErrorKind, CounterSeries>;
  readonly retries: CounterSeries;
  readonly ejections: CounterSeries;
}

type GaugeSource = (gauge: Gauge) => void;
/**
 * Gauges are read from the endpoint table at scrape time rather than moved per request.
 * Routers sharing a registry and prefix share one gauge, so each adds its own source.
 */
const gaugeSources = new WeakMap<object, Set<GaugeSource>>();

/** Creates (or joins) the metric families on the registry and zero-fills every configured series. */
export function createMetrics(
  registry: Registry,
  prefix: string,
  table: { readonly metered: readonly MeteredEndpoint[] },
  scrapedUpstreams: readonly string[],
): RouterMetrics {
  const requests = counterFamily(registry, `${prefix}requests_total`, 'Requests dispatched, by endpoint and where the rank came from.', ['upstream', 'rank', 'source']).join();
  const duration = histogramFamily(registry, `${prefix}request_duration_seconds`, 'Time from dispatch until the response ended, by endpoint.', ['upstream', 'rank'], DURATION_BUCKETS).join();
  const firstToken = histogramFamily(
    registry,
    `${prefix}time_to_first_token_seconds`,
    'Time from dispatch until the first byte of a 2xx answer (of an event stream: its first event), by endpoint that answered.',
    ['upstream', 'rank'],
    FIRST_TOKEN_BUCKETS,
  ).join();
  const hints = counterFamily(registry, `${prefix}rank_hints_total`, 'Client rank hints, by outcome.', ['outcome']).join();
  const errors = counterFamily(registry, `${prefix}upstream_errors_total`, 'Failed upstream exchanges, by endpoint and kind.', ['upstream', 'rank', 'kind']).join();
  const retries = counterFamily(registry, `${prefix}retries_total`, 'Requests sent again to another endpoint, by the endpoint that failed them.', ['upstream', 'rank']).join();
  const ejections = counterFamily(registry, `${prefix}ejections_total`, 'Times the outlier detector took the endpoint out of rotation.', ['upstream', 'rank']).join();
  const scrapes = counterFamily(registry, `${prefix}upstream_scrape_failures_total`, "Failed reads of an upstream's /metrics for discovery or load feedback.", ['upstream']).join();
  const rejections = counterFamily(
    registry,
    `${prefix}rank_header_rejections_total`,
    'Times an upstream contradicted the rank header the router sends it: an out-of-range answer, or /metrics engines that disagree with its configuration.',
    ['upstream', 'evidence'],
  ).join();
  const families = [requests, duration, firstToken, hints, errors, retries, ejections, scrapes, rejections];

  const instruments = new Map<MeteredEndpoint, EndpointInstruments>();
  /** By upstream, made with its balanced endpoint. */
  const refusals = new Map<string, Record<RankHeaderEvidence, CounterSeries>>();
  const instrument = (endpoint: MeteredEndpoint) => {
    const labels = { upstream: endpoint.upstream, rank: endpoint.rankLabel };
    if (endpoint.balanced) {
      const upstream = endpoint.upstream;
      refusals.set(upstream, { answer: rejections.add({ upstream, evidence: 'answer' }), metrics: rejections.add({ upstream, evidence: 'metrics' }) });
    }
    instruments.set(endpoint, {
      labels,
      requests: {
        ...(!endpoint.balanced && { hint: requests.add({ ...labels, source: 'hint' }) }),
        assigned: requests.add({ ...labels, source: 'assigned' }),
      },
      duration: duration.add(labels),
      firstToken: firstToken.add(labels),
      errors: Object.fromEntries(UPSTREAM_ERROR_KINDS.map((kind) => [kind, errors.add({ ...labels, kind })])) as EndpointInstruments['errors'],
      retries: retries.add(labels),
      ejections: ejections.add(labels),
    });
  };
  const forget = (endpoint: MeteredEndpoint) => {
    const known = instruments.get(endpoint);
    if (!known) return;
    instruments.delete(endpoint);
    if (known.requests.hint !== undefined) requests.remove(known.requests.hint);
    requests.remove(known.requests.assigned!);
    duration.remove(known.duration);
    firstToken.remove(known.firstToken);
    for (const kind of UPSTREAM_ERROR_KINDS) errors.remove(known.errors[kind]);
    retries.remove(known.retries);
    ejections.remove(known.ejections);
    const refused = endpoint.balanced ? refusals.get(endpoint.upstream) : undefined;
    if (refused === undefined) return;
    refusals.delete(endpoint.upstream);
    for (const evidence of RANK_HEADER_EVIDENCE) rejections.remove(refused[evidence]);
  };
  const scraped = new Map<string, CounterSeries>();
  const watchScrapes = (upstreams: readonly string[]) => {
    for (const [upstream, series] of scraped) {
      if (upstreams.includes(upstream)) continue;
      scrapes.remove(series);
      scraped.delete(upstream);
    }
    for (const upstream of upstreams) if (!scraped.has(upstream)) scraped.set(upstream, scrapes.add({ upstream }));
  };
  table.metered.forEach(instrument);
  watchScrapes(scrapedUpstreams);
  const outcomes = Object.fromEntries(HINT_OUTCOMES.map((outcome) => [outcome, hints.add({ outcome })])) as Record<HintOutcome, CounterSeries>;

  const reportInflight: GaugeSource = (gauge) => {
    for (const endpoint of table.metered) gauge.inc(instruments.get(endpoint)!.labels, endpoint.inflight);
  };
  const reportHealth: GaugeSource = (gauge) => {
    // Endpoints only: an upstream's balanced one is no endpoint a policy picks, and follows its server.
    for (const endpoint of table.metered) if (!endpoint.balanced) gauge.set(instruments.get(endpoint)!.labels, endpoint.healthy ? 1 : 0);
  };
  const unsubscribe = [
    sharedGauge(registry, `${prefix}inflight_requests`, 'Requests dispatched and not yet finished, by endpoint.', reportInflight),
    sharedGauge(registry, `${prefix}endpoint_healthy`, 'Whether the endpoint is in rotation (1) or ejected (0).', reportHealth),
  ];

  // A request still in flight on an endpoint that a reconfiguration removed finds no
  // instruments: its series are gone, and it is not counted.
  return {
    hint: (outcome) => outcomes[outcome].inc(),
    dispatched: (endpoint, source) => instruments.get(endpoint)?.requests[source]?.inc(),
    finished: (endpoint, seconds) => instruments.get(endpoint)?.duration.observe(seconds),
    upstreamError: (endpoint, kind) => instruments.get(endpoint)?.errors[kind].inc(),
    firstToken: (endpoint, seconds) => instruments.get(endpoint)?.firstToken.observe(seconds),
    retried: (endpoint) => instruments.get(endpoint)?.retries.inc(),
    ejected: (endpoint) => instruments.get(endpoint)?.ejections.inc(),
    scrapeFailed: (upstream) => scraped.get(upstream)?.inc(),
    rankHeaderRejected: (upstream, evidence) => refusals.get(upstream)?.[evidence].inc(),
    track: ({ added, removed }, upstreams) => {
      removed.forEach(forget);
      added.forEach(instrument);
      watchScrapes(upstreams);
    },
    close: () => {
      unsubscribe.forEach((stop) => stop());
      for (const family of families) family.leave();
    },
  };
}

/** Metrics switched off: every call is a no-op. */
export const NO_METRICS: RouterMetrics = {
  hint: () => undefined,
  dispatched: () => undefined,
  finished: () => undefined,
  upstreamError: () => undefined,
  firstToken: () => undefined,
  retried: () => undefined,
  ejected: () => undefined,
  scrapeFailed: () => undefined,
  rankHeaderRejected: () => undefined,
  track: () => undefined,
  close: () => undefined,
};

function sharedGauge(registry: Registry, name: string, help: string, source: GaugeSource): () => void {
  const existing = registry.getSingleMetric(name);
  let sources = existing ? gaugeSources.get(existing) : undefined;
  if (!sources) {
    const ownSources = new Set<GaugeSource>();
    sources = ownSources;
    const gauge = new Gauge({
      name,
      help,
      labelNames: ['upstream', 'rank'],
      registers: [registry],
      collect() {
        this.reset();
        for (const report of ownSources) report(this);
      },
    });
    gaugeSources.set(gauge, ownSources);
  }
  const joined = sources;
  joined.add(source);
  return () => joined.delete(source);
}
