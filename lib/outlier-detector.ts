import type { EndpointTable, RouteEndpoint } from './endpoints';
import { NO_METRICS, type RouterMetrics } from './metrics';
import type { OutlierDetectionConfig } from './options';

/**
 * Passive outlier detection, Envoy-style: counts consecutive failures per endpoint (connect
 * errors, timeouts, resets, 5xx answers), ejects an endpoint that reaches the threshold for a
 * cool-down, then lets exactly one trial request through (half-open). The trial's success
 * closes the circuit; its failure ejects again for twice as long, up to `maxEjectionMs`.
 *
 * Guard rails: at most `maxEjectionPercent` of the endpoints (rounded down, at least one) are
 * under ejection at once, and the last endpoint in rotation is never ejected, so that a fleet
 * failing as a whole still answers with the upstream's own errors (and recovers without
 * waiting out a cool-down) instead of a blanket 503.
 */
export class OutlierDetector {
  private underEjection = 0;
  private readonly timers = new Set<NodeJS.Timeout>();
  private closed = false;

  constructor(
    private readonly table: EndpointTable,
    private readonly config: OutlierDetectionConfig,
    private readonly metrics: Pick<RouterMetrics, 'ejected'> = NO_METRICS,
  ) {}

  /** Read from the table as it is now: `setUpstreams()` and discovery change its size. */
  private get maxUnderEjection(): number {
    const { maxEjectionPercent } = this.config;
    return maxEjectionPercent === 0 ? 0 : Math.max(1, Math.floor((this.table.all.length * maxEjectionPercent) / 100));
  }

  /**
   * A request is being sent to `endpoint`. When the endpoint is half-open this request becomes
   * its trial: the endpoint leaves rotation until the trial decides. Returns whether it did.
   */
  dispatched(endpoint: RouteEndpoint, owner: object): boolean {
    if (endpoint.ejection !== 'half-open') return false;
    endpoint.ejection = 'trial';
    endpoint.trialOwner = owner;
    this.table.updateHealth(endpoint);
    return true;
  }

  /** The endpoint answered (any status below 500). */
  succeeded(endpoint: RouteEndpoint): void {
    if (endpoint.consecutiveFailures === 0 && endpoint.ejection === 'closed') return;
    endpoint.consecutiveFailures = 0;
    // A late answer to a request sent before the ejection does not cut the cool-down short.
    if (endpoint.ejection === 'ejected') return;
    if (endpoint.ejection !== 'closed') {
      endpoint.ejection = 'closed';
      endpoint.ejections = 0;
      endpoint.trialOwner = undefined;
      this.underEjection--;
      this.table.updateHealth(endpoint);
    }
  }

  /** The exchange failed in a way that is the endpoint's fault (never a 4xx, never a client leaving). */
  failed(endpoint: RouteEndpoint): void {
    switch (endpoint.ejection) {
      case 'closed':
        if (++endpoint.consecutiveFailures >= this.config.consecutiveFailures) this.tryEject(endpoint);
        return;
      case 'half-open':
      case 'trial':
        // The trial (or a request still in flight from before) failed: back out, for longer.
        this.underEjection--;
        this.eject(endpoint);
        return;
      case 'ejected':
        // Requests sent before the ejection finishing late say nothing new.
        return;
    }
  }

  /** The trial request ended without a verdict (the client left first): let another request try. */
  abandoned(endpoint: RouteEndpoint, owner: object): void {
    if (endpoint.ejection !== 'trial' || endpoint.trialOwner !== owner) return;
    endpoint.ejection = 'half-open';
    endpoint.trialOwner = undefined;
    this.table.updateHealth(endpoint);
  }

  /** Stops the cool-down timers. Ejected endpoints stay as they are. */
  close(): void {
    this.closed = true;
    for (const timer of this.timers) clearTimeout(timer);
    this.timers.clear();
  }

  private tryEject(endpoint: RouteEndpoint): void {
    if (this.underEjection >= this.maxUnderEjection) return;
    if (endpoint.healthy && this.table.healthyCount <= 1) return;
    this.eject(endpoint);
  }

  private eject(endpoint: RouteEndpoint): void {
    if (this.closed) return;
    this.underEjection++;
    endpoint.ejection = 'ejected';
    endpoint.trialOwner = undefined;
    endpoint.consecutiveFailures = 0;
    const coolDown = Math.min(this.config.baseEjectionMs * 2 ** Math.min(endpoint.ejections, 30), this.config.maxEjectionMs);
    endpoint.ejections++;
    this.metrics.ejected(endpoint);
    this.table.updateHealth(endpoint);
    const timer = setTimeout(() => {
      this.timers.delete(timer);
      if (endpoint.ejection !== 'ejected') return;
      endpoint.ejection = 'half-open';
      this.table.updateHealth(endpoint);
    }, coolDown);
    timer.unref();
    this.timers.add(timer);
  }
}
