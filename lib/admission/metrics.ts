import { Counter, Gauge, Histogram } from 'prom-client';
import { family } from '../observe/metric-family';
import type { MetricsConfig } from '../observe/metrics';

/** What became of a request at admission (`dp_router_admission_total{outcome}`). */
export type AdmissionOutcome = 'admitted' | 'queued' | 'queue_full' | 'timed_out' | 'over_budget' | 'cancelled';

export const ADMISSION_OUTCOMES: readonly AdmissionOutcome[] = ['admitted', 'queued', 'queue_full', 'timed_out', 'over_budget', 'cancelled'];

/** From a slot freed at once to a long wait behind long generations. */
const WAIT_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

/** Admission's instruments; labels are the configured class names and the fixed outcomes, never a tenant. */
export interface AdmissionMetrics {
  outcome(outcome: AdmissionOutcome): void;
  /** One more (`+1`) or one fewer (`-1`) request waiting in class `priority`. */
  depth(priority: string, change: number): void;
  waited(priority: string, seconds: number): void;
  storeFailed(): void;
}

export const NO_ADMISSION_METRICS: AdmissionMetrics = { outcome: () => undefined, depth: () => undefined, waited: () => undefined, storeFailed: () => undefined };

/** The admission families on the router's registry (get-or-create, so routers can share them), every series at 0. */
export function createAdmissionMetrics(config: MetricsConfig | undefined, classes: readonly string[]): AdmissionMetrics {
  if (config === undefined) return NO_ADMISSION_METRICS;
  const { registry, prefix } = config;
  const depth = family(registry, `${prefix}queue_depth`, Gauge, () => new Gauge({ name: `${prefix}queue_depth`, help: 'Requests waiting in the admission queue, by priority class.', labelNames: ['priority'], registers: [registry] }));
  const wait = family(registry, `${prefix}queue_wait_seconds`, Histogram, () =>
    new Histogram({ name: `${prefix}queue_wait_seconds`, help: 'Time queued requests waited for a slot, by priority class.', labelNames: ['priority'], buckets: WAIT_BUCKETS, registers: [registry] }),
  );
  const outcomes = family(registry, `${prefix}admission_total`, Counter, () => new Counter({ name: `${prefix}admission_total`, help: 'Requests by what admission control did with them.', labelNames: ['outcome'], registers: [registry] }));
  const storeErrors = family(registry, `${prefix}token_store_errors_total`, Counter, () => new Counter({ name: `${prefix}token_store_errors_total`, help: 'Token store calls that failed or timed out, and requests not checked while the store is taken as down (the request went on: fail open).', registers: [registry] }));
  for (const name of classes) {
    depth.inc({ priority: name }, 0);
    wait.zero({ priority: name });
  }
  for (const outcome of ADMISSION_OUTCOMES) outcomes.inc({ outcome }, 0);
  storeErrors.inc(0);
  return {
    outcome: (outcome) => outcomes.inc({ outcome }),
    depth: (priority, change) => depth.inc({ priority }, change),
    waited: (priority, seconds) => wait.observe({ priority }, seconds),
    storeFailed: () => storeErrors.inc(),
  };
}
