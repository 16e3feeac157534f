import type { UpstreamConfig } from './options';
import type { DecisionSource, Endpoint, EndpointSnapshot } from './types';

/**
 * Where an endpoint stands in passive outlier detection: `closed` (in rotation), `ejected`
 * (cooling down, out of rotation), `half-open` (back in rotation until one request is sent to
 * it) and `trial` (that one request is in flight; out of rotation until it decides).
 */
export type EjectionState = 'closed' | 'ejected' | 'half-open' | 'trial';

/** An endpoint as the router keeps it: the public view plus what dispatch needs. */
export class RouteEndpoint implements Endpoint {
  readonly key: string;
  readonly upstream: string;
  readonly rank: number;
  readonly rankLabel: string;
  /** The rank header value for this upstream's `rankHeader` mode, computed once. */
  readonly headerValue: string | undefined;
  /** The `X-DP-Router-Decision` value per source. */
  readonly receipts: Readonly<Record<DecisionSource, string>>;
  inflight = 0;
  /** Engine-reported load, added to `inflight` where load feedback is on. */
  externalLoad = 0;
  healthy = true;
  /** Passive outlier detection state; see {@link EjectionState}. */
  ejection: EjectionState = 'closed';
  /** Failures since the last success. */
  consecutiveFailures = 0;
  /** Ejections in a row without a successful trial between them; the cool-down grows with it. */
  ejections = 0;
  /** The response of the request that is this endpoint's half-open trial. */
  trialOwner: object | undefined = undefined;
  /** Whether the upstream passes its active health check (always, when checks are off). */
  probeUp = true;

  constructor(readonly config: UpstreamConfig, rank: number) {
    this.upstream = config.name;
    this.rank = rank;
    this.rankLabel = String(rank);
    this.key = `${config.name}#${rank}`;
    this.headerValue =
      config.rankHeader === 'global' ? this.rankLabel : config.rankHeader === 'local' ? String(rank - config.startRank) : undefined;
    const receipt = (source: DecisionSource) => `upstream=${this.upstream}; rank=${rank}; source=${source}`;
    this.receipts = { hint: receipt('hint'), assigned: receipt('assigned') };
  }

  /** Whether this endpoint can stand for `rank` of `config`: same server, same header values. */
  servesAs(config: UpstreamConfig): boolean {
    const mine = this.config;
    return mine.name === config.name && mine.url === config.url && mine.rankHeader === config.rankHeader && mine.startRank === config.startRank;
  }

  get load(): number {
    return this.inflight + this.externalLoad;
  }
}

/**
 * Every endpoint of a router, with the candidate lists policies pick from. The lists are
 * rebuilt when health changes, never per request.
 */
export class EndpointTable {
  private endpoints: readonly RouteEndpoint[] = [];
  private configs: readonly UpstreamConfig[] = [];
  private byRank = new Map<number, RouteEndpoint[]>();
  private healthyAll: readonly RouteEndpoint[] = [];
  private healthyByRank = new Map<number, readonly RouteEndpoint[]>();
  private routable = '';

  constructor(upstreams: readonly UpstreamConfig[]) {
    this.reconfigure(upstreams);
  }

  /** Every endpoint, in configuration order. */
  get all(): readonly RouteEndpoint[] {
    return this.endpoints;
  }

  /** The upstreams as configured now. */
  get upstreams(): readonly UpstreamConfig[] {
    return this.configs;
  }

  /** The routable global ranks, for messages: `0, 2, 4, 6`. */
  get routableRanks(): string {
    return this.routable;
  }

  /**
   * Replaces the upstreams. An endpoint that stays (same upstream name, URL, start rank and
   * header mode, same rank) is kept with its in-flight count and health; requests in flight
   * on a removed endpoint finish on it.
   */
  reconfigure(upstreams: readonly UpstreamConfig[]): { added: RouteEndpoint[]; removed: RouteEndpoint[] } {
    const previous = new Map(this.endpoints.map((endpoint) => [endpoint.key, endpoint]));
    const added: RouteEndpoint[] = [];
    const next = upstreams.flatMap((upstream) =>
      upstream.ranks.map((rank) => {
        const kept = previous.get(`${upstream.name}#${rank}`);
        if (kept?.servesAs(upstream)) {
          previous.delete(kept.key);
          return kept;
        }
        const endpoint = new RouteEndpoint(upstream, rank);
        added.push(endpoint);
        return endpoint;
      }),
    );
    this.configs = upstreams;
    this.endpoints = next;
    this.byRank = new Map();
    for (const endpoint of next) {
      const replicas = this.byRank.get(endpoint.rank);
      if (replicas) replicas.push(endpoint);
      else this.byRank.set(endpoint.rank, [endpoint]);
    }
    this.routable = [...this.byRank.keys()].sort((a, b) => a - b).join(', ');
    this.refresh();
    return { added, removed: [...previous.values()] };
  }

  /** Whether any upstream routes to this global rank (healthy or not). */
  isRoutable(rank: number): boolean {
    return this.byRank.has(rank);
  }

  /** Healthy endpoints, for assignment. */
  healthy(): readonly RouteEndpoint[] {
    return this.healthyAll;
  }

  /** Healthy endpoints serving one global rank (replicas on several upstreams). */
  healthyOfRank(rank: number): readonly RouteEndpoint[] {
    return this.healthyByRank.get(rank) ?? [];
  }

  /** Takes an endpoint in or out of rotation. Returns whether anything changed. */
  setHealthy(endpoint: RouteEndpoint, healthy: boolean): boolean {
    if (endpoint.healthy === healthy) return false;
    endpoint.healthy = healthy;
    this.refresh();
    return true;
  }

  /**
   * Puts an endpoint in or out of rotation from its health state: it is in rotation when its
   * upstream passes its health check and it is not ejected (a half-open endpoint is in,
   * waiting for its trial). Returns whether anything changed.
   */
  updateHealth(endpoint: RouteEndpoint): boolean {
    const inRotation = endpoint.probeUp && (endpoint.ejection === 'closed' || endpoint.ejection === 'half-open');
    return this.setHealthy(endpoint, inRotation);
  }

  /** How many endpoints are in rotation. */
  get healthyCount(): number {
    return this.healthyAll.length;
  }

  snapshot(): EndpointSnapshot[] {
    return this.all.map(({ upstream, rank, inflight, healthy }) => ({ upstream, rank, inflight, healthy }));
  }

  private refresh(): void {
    this.healthyAll = this.endpoints.filter((endpoint) => endpoint.healthy);
    this.healthyByRank = new Map();
    for (const [rank, replicas] of this.byRank) {
      this.healthyByRank.set(rank, replicas.filter((endpoint) => endpoint.healthy));
    }
  }
}
