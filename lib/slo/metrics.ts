/**
 * The SLO families (CONTRACT.md, "SLO-aware routing"), counted in plain fields and read at
 * scrape time as the router's other families are (collected-metrics.ts). Labels come from the
 * configuration only.
 */
import type { MetricsConfig } from '../observe/metrics';
import { counterFamily, histogramFamily, type CounterSeries, type HistogramSeries } from '../observe/collected-metrics';

export type SloOutcome = 'met' | 'missed_ttft' | 'missed_tpot' | 'shed';
export const SLO_OUTCOMES: readonly SloOutcome[] = ['met', 'missed_ttft', 'missed_tpot', 'shed'];
export type PredictionKind = 'ttft' | 'tpot';

/** |actual − predicted| from a few ms to tens of seconds. */
const ERROR_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];

/** What an endpoint is labelled by. */
export interface LabelledEndpoint {
  readonly key: string;
  readonly upstream: string;
  readonly rankLabel: string;
}

export interface SloMetrics {
  outcome(endpoint: LabelledEndpoint, outcome: SloOutcome): void;
  predictionError(upstream: string, kind: PredictionKind, seconds: number): void;
  /** Zero series for a configured endpoint. */
  declare(endpoint: LabelledEndpoint): void;
  /** A removed endpoint's series leave (and its upstream's, with its last endpoint). */
  forget(endpoint: LabelledEndpoint): void;
  leave(): void;
}

const NONE: SloMetrics = { outcome: () => undefined, predictionError: () => undefined, declare: () => undefined, forget: () => undefined, leave: () => undefined };

export function createSloMetrics(config: MetricsConfig | undefined): SloMetrics {
  if (config === undefined) return NONE;
  const { registry, prefix } = config;
  const outcomes = counterFamily(registry, `${prefix}slo_requests_total`, 'Requests with latency objectives, by endpoint and whether they were met (measured at the gateway).', ['upstream', 'rank', 'outcome']).join();
  const errors = histogramFamily(registry, `${prefix}latency_prediction_error_seconds`, 'Absolute error of the predicted time to first token and time per output token, by upstream.', ['upstream', 'kind'], ERROR_BUCKETS).join();
  const byEndpoint = new Map<string, CounterSeries[]>();
  const byUpstream = new Map<string, HistogramSeries[]>();
  const seriesOf = (endpoint: LabelledEndpoint) => {
    let series = byEndpoint.get(endpoint.key);
    if (series === undefined) {
      series = SLO_OUTCOMES.map((outcome) => outcomes.add({ upstream: endpoint.upstream, rank: endpoint.rankLabel, outcome }));
      byEndpoint.set(endpoint.key, series);
    }
    return series;
  };
  const errorsOf = (upstream: string) => {
    let series = byUpstream.get(upstream);
    if (series === undefined) {
      series = [errors.add({ upstream, kind: 'ttft' }), errors.add({ upstream, kind: 'tpot' })];
      byUpstream.set(upstream, series);
    }
    return series;
  };
  return {
    outcome: (endpoint, outcome) => seriesOf(endpoint)[SLO_OUTCOMES.indexOf(outcome)].inc(),
    predictionError: (upstream, kind, seconds) => errorsOf(upstream)[kind === 'ttft' ? 0 : 1].observe(seconds),
    declare: (endpoint) => {
      seriesOf(endpoint);
      errorsOf(endpoint.upstream);
    },
    forget: (endpoint) => {
      const series = byEndpoint.get(endpoint.key);
      if (series === undefined) return;
      byEndpoint.delete(endpoint.key);
      for (const one of series) outcomes.remove(one);
      const prefix = `${endpoint.upstream}#`;
      if ([...byEndpoint.keys()].some((key) => key.startsWith(prefix))) return;
      for (const one of byUpstream.get(endpoint.upstream) ?? []) errors.remove(one);
      byUpstream.delete(endpoint.upstream);
    },
    leave: () => {
      outcomes.leave();
      errors.leave();
    },
  };
}
