import { Gauge, register, type Registry } from 'prom-client';
import { counterFamily, histogramFamily, type CounterSeries, type FamilyMember, type HistogramSeries } from './collected-metrics';
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

/**
 * The router's counter and histogram families, one row each, in the order they are registered
 * (and exported). A row with `endpoint` is per endpoint: its series are labelled `upstream` and
 * `rank` (then `by`, one series per value, all made at 0 when the endpoint is), made and dropped
 * with the endpoint. Adding a per-endpoint metric is a row here and the `RouterMetrics` method
 * that records it; the others' series are made below.
 */
const FAMILIES = {
  requests: { name: 'requests_total', type: 'counter', help: 'Requests dispatched, by endpoint and where the rank came from.', endpoint: { by: 'source', values: (endpoint: MeteredEndpoint) => (endpoint.balanced ? ASSIGNED : SOURCES) } },
  duration: { name: 'request_duration_seconds', type: 'histogram', help: 'Time from dispatch until the response ended, by endpoint.', buckets: DURATION_BUCKETS, endpoint: {} },
  firstToken: {
    name: 'time_to_first_token_seconds',
    type: 'histogram',
    help: 'Time from dispatch until the first byte of a 2xx answer (of an event stream: its first event), by endpoint that answered.',
    buckets: FIRST_TOKEN_BUCKETS,
    endpoint: {},
  },
  hints: { name: 'rank_hints_total', type: 'counter', help: 'Client rank hints, by outcome.', labels: ['outcome'] },
  errors: { name: 'upstream_errors_total', type: 'counter', help: 'Failed upstream exchanges, by endpoint and kind.', endpoint: { by: 'kind', values: () => UPSTREAM_ERROR_KINDS } },
  retries: { name: 'retries_total', type: 'counter', help: 'Requests sent again to another endpoint, by the endpoint that failed them.', endpoint: {} },
  ejections: { name: 'ejections_total', type: 'counter', help: 'Times the outlier detector took the endpoint out of rotation.', endpoint: {} },
  scrapes: { name: 'upstream_scrape_failures_total', type: 'counter', help: "Failed reads of an upstream's /metrics for discovery or load feedback.", labels: ['upstream'] },
  rejections: {
    name: 'rank_header_rejections_total',
    type: 'counter',
    help: 'Times an upstream contradicted the rank header the router sends it: an out-of-range answer, or /metrics engines that disagree with its configuration.',
    labels: ['upstream', 'evidence'],
  },
} as const satisfies Record<string, FamilyRow>;

/** One family of {@link FAMILIES}. */
interface FamilyRow {
  /** After the prefix. */
  readonly name: string;
  readonly type: 'counter' | 'histogram';
  readonly help: string;
  readonly buckets?: readonly number[];
  /** Labels of a family that is not per endpoint. */
  readonly labels?: readonly string[];
  /** Per endpoint: with `by`, one more label, and the values each endpoint has a series of from the start. */
  readonly endpoint?: { readonly by?: string; readonly values?: (endpoint: MeteredEndpoint) => readonly string[] };
}

const SOURCES: readonly DecisionSource[] = ['hint', 'assigned'];
/** A balanced endpoint has no `hint` series: a hint never goes there. */
const ASSIGNED: readonly DecisionSource[] = ['assigned'];

type Families = typeof FAMILIES;
type SeriesOf<Row> = Row extends { readonly type: 'histogram' } ? HistogramSeries : CounterSeries;
type EndpointKey = { [K in keyof Families]: Families[K] extends { readonly endpoint: object } ? K : never }[keyof Families];
const ENDPOINT_KEYS = (Object.keys(FAMILIES) as Array<keyof Families>).filter((key) => 'endpoint' in FAMILIES[key]) as EndpointKey[];

/** An endpoint's series, by family (by `by`'s value where the family has one): plain fields, read at scrape time (collected-metrics.ts). */
type EndpointInstruments = { readonly labels: { upstream: string; rank: string } } & {
  readonly [K in EndpointKey]: Families[K]['endpoint'] extends { readonly by: string } ? Partial<Record<string, SeriesOf<Families[K]>>> : SeriesOf<Families[K]>;
};

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
  const made = {} as { [K in keyof Families]: FamilyMember<SeriesOf<Families[K]>> };
  for (const key of Object.keys(FAMILIES) as Array<keyof Families>) {
    const row: FamilyRow = FAMILIES[key];
    const labels = row.endpoint === undefined ? [...row.labels!] : row.endpoint.by === undefined ? ['upstream', 'rank'] : ['upstream', 'rank', row.endpoint.by];
    const name = `${prefix}${row.name}`;
    (made as Record<string, FamilyMember<unknown>>)[key] = row.type === 'histogram' ? histogramFamily(registry, name, row.help, labels, [...row.buckets!]).join() : counterFamily(registry, name, row.help, labels).join();
  }
  const { hints, scrapes, rejections } = made;
  const families = Object.values(made) as FamilyMember<unknown>[];

  const instruments = new Map<MeteredEndpoint, EndpointInstruments>();
  /** By upstream, made with its balanced endpoint. */
  const refusals = new Map<string, Record<RankHeaderEvidence, CounterSeries>>();
  const instrument = (endpoint: MeteredEndpoint) => {
    const labels = { upstream: endpoint.upstream, rank: endpoint.rankLabel };
    if (endpoint.balanced) {
      const upstream = endpoint.upstream;
      refusals.set(upstream, { answer: rejections.add({ upstream, evidence: 'answer' }), metrics: rejections.add({ upstream, evidence: 'metrics' }) });
    }
    const own: Record<string, unknown> = { labels };
    for (const key of ENDPOINT_KEYS) {
      const { by, values } = FAMILIES[key].endpoint as FamilyRow['endpoint'] & object;
      const family = made[key] as FamilyMember<unknown>;
      own[key] = by === undefined ? family.add(labels) : Object.fromEntries(values!(endpoint).map((value) => [value, family.add({ ...labels, [by]: value })]));
    }
    instruments.set(endpoint, own as EndpointInstruments);
  };
  const forget = (endpoint: MeteredEndpoint) => {
    const known = instruments.get(endpoint);
    if (!known) return;
    instruments.delete(endpoint);
    for (const key of ENDPOINT_KEYS) {
      const family = made[key] as FamilyMember<unknown>;
      const series = known[key];
      if ((FAMILIES[key] as FamilyRow).endpoint!.by === undefined) family.remove(series);
      else for (const one of Object.values(series as Record<string, unknown>)) family.remove(one);
    }
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
    upstreamError: (endpoint, kind) => instruments.get(endpoint)?.errors[kind]?.inc(),
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
