import { Counter, Histogram, type Registry } from 'prom-client';
import type { MeteredEndpoint } from '../observe/metrics';

/** What became of a disaggregated request. */
export type DisaggregatedOutcome = 'disaggregated' | 'decode_only' | 'failed';
/** Which leg a client left during. */
export type Leg = 'prefill' | 'decode';

export const OUTCOMES: readonly DisaggregatedOutcome[] = ['disaggregated', 'decode_only', 'failed'];
const LEGS: readonly Leg[] = ['prefill', 'decode'];
/** A prefill: a warm cache hit (ms) to a long prompt queued behind others. */
const PREFILL_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60];

/** The instruments only disaggregation has (each leg is also counted in the router's own families). */
export interface DisaggregationMetrics {
  outcome(outcome: DisaggregatedOutcome): void;
  /** The prefill leg at `endpoint`: dispatch → its answer read (or its failure). */
  prefilled(endpoint: MeteredEndpoint, seconds: number): void;
  /** The client left during `leg`. */
  cancelled(leg: Leg): void;
  /** A prefill kept blocks for a decode that never came: they stay pinned until vLLM's abort timeout. */
  stranded(endpoint: MeteredEndpoint): void;
  /** Zero-filled series for endpoints added to the prefill pool; none left for removed ones. */
  track(change: { added: readonly MeteredEndpoint[]; removed: readonly MeteredEndpoint[] }): void;
}

/** Creates (or joins) the families on the registry and zero-fills every series the configuration implies. */
export function createDisaggregationMetrics(registry: Registry, prefix: string, prefillEndpoints: readonly MeteredEndpoint[]): DisaggregationMetrics {
  const outcomes = counter(registry, `${prefix}disaggregated_requests_total`, 'Disaggregated requests, by outcome: both legs sent, decode alone after a failed prefill, or answered by the gateway.', ['outcome']);
  const cancellations = counter(registry, `${prefix}disaggregated_cancellations_total`, 'Disaggregated requests whose client left, by the leg in flight then.', ['leg']);
  const stranded = counter(
    registry,
    `${prefix}prefill_stranded_total`,
    "Prefills that kept KV blocks for a decode leg that was never sent (vLLM frees them only at its abort timeout), by prefill endpoint.",
    ['upstream', 'rank'],
  );
  const existing = registry.getSingleMetric(`${prefix}prefill_duration_seconds`);
  const duration =
    existing instanceof Histogram
      ? existing
      : new Histogram({
          name: `${prefix}prefill_duration_seconds`,
          help: 'Prefill legs of disaggregated requests: dispatch until the answer was read, by prefill endpoint.',
          labelNames: ['upstream', 'rank'],
          buckets: PREFILL_BUCKETS,
          registers: [registry],
        });
  for (const outcome of OUTCOMES) outcomes.inc({ outcome }, 0);
  for (const leg of LEGS) cancellations.inc({ leg }, 0);
  const labelsOf = (endpoint: MeteredEndpoint) => ({ upstream: endpoint.upstream, rank: endpoint.rankLabel });
  const add = (endpoint: MeteredEndpoint) => {
    duration.zero(labelsOf(endpoint));
    stranded.inc(labelsOf(endpoint), 0);
  };
  prefillEndpoints.forEach(add);
  return {
    outcome: (outcome) => outcomes.inc({ outcome }),
    prefilled: (endpoint, seconds) => duration.observe(labelsOf(endpoint), seconds),
    cancelled: (leg) => cancellations.inc({ leg }),
    stranded: (endpoint) => stranded.inc(labelsOf(endpoint)),
    track: ({ added, removed }) => {
      for (const endpoint of removed) {
        duration.remove(labelsOf(endpoint));
        stranded.remove(labelsOf(endpoint));
      }
      added.forEach(add);
    },
  };
}

function counter(registry: Registry, name: string, help: string, labelNames: string[]): Counter {
  const existing = registry.getSingleMetric(name);
  if (existing instanceof Counter) return existing;
  return new Counter({ name, help, labelNames, registers: [registry] });
}
