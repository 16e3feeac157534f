import type { UpstreamConfig } from './upstream-options';
import type { DecisionSource, Endpoint, EndpointSnapshot } from '../types';
import type { PeerLoad } from '../policies/prefix-aware-ttft';
import { RankDecision } from '../request/rank-decision';

/**
 * Where a circuit stands in passive outlier detection: `closed` (in rotation), `ejected`
 * (cooling down, out of rotation), `half-open` (back in rotation until one request is sent to
 * it) and `trial` (that one request is in flight; out of rotation until it decides).
 */
export type EjectionState = 'closed' | 'ejected' | 'half-open' | 'trial';

/**
 * One circuit of passive outlier detection. Each endpoint has its own, for what its answers
 * say about that rank; each upstream server (URL) has one shared by all the ranks behind it,
 * for what failed connections say about the server.
 */
export class Circuit {
  state: EjectionState = 'closed';
  /** Failures since the last success. */
  consecutiveFailures = 0;
  /** Ejections in a row without a successful trial between them; the cool-down grows with it. */
  ejections = 0;
  /** The response of the request that is this circuit's half-open trial. */
  trialOwner: object | undefined = undefined;
  /** Hashes of the distinct clients whose requests make up the current failure run (a few at most). */
  readonly failingClients: number[] = [];
  /** The running cool-down. */
  coolDown: NodeJS.Timeout | undefined = undefined;

  /**
   * Back in rotation with a clean record. A running cool-down is let run out: its timer sees
   * that it is no longer this circuit's and does nothing.
   */
  close(): void {
    this.state = 'closed';
    this.ejections = 0;
    this.consecutiveFailures = 0;
    this.trialOwner = undefined;
    this.failingClients.length = 0;
    this.coolDown = undefined;
  }

  /** Whether the circuit lets requests through: closed, or half-open waiting for its trial. */
  get passes(): boolean {
    return this.state === 'closed' || this.state === 'half-open';
  }
}

/** One upstream server: the URL every rank behind it is reached through. */
export class UpstreamServer extends Circuit {
  constructor(readonly url: string) {
    super();
  }
}

/** An endpoint as the router keeps it: the public view plus what dispatch needs. */
export class RouteEndpoint implements Endpoint, PeerLoad {
  readonly key: string;
  readonly upstream: string;
  readonly rank: number;
  readonly rankLabel: string;
  /** The rank header value for this upstream's `rankHeader` mode, computed once. */
  readonly headerValue: string | undefined;
  /** The `X-DP-Router-Decision` value per source. */
  readonly receipts: Readonly<Record<DecisionSource, string>>;
  /** `req.dpRank` per source, made once: a request's decision depends on nothing else. */
  readonly decisions: Readonly<Record<DecisionSource, RankDecision>>;
  /** Moved only by the request's `RouteState` (assign, moveTo, and its response's close). */
  inflight = 0;
  /**
   * Engine-reported load, added to `inflight` where load feedback is on; written by engine-watch
   * alone. Kept here rather than in engine-watch because every pick reads `load` per candidate.
   */
  externalLoad = 0;
  /**
   * The other gateway replicas' requests here and the prefill they wait for, as the peers last
   * announced them (`peers`, {@link PeerLoad}); written by the peer link alone. `peerInflight` is
   * part of `load`.
   */
  peerInflight = 0;
  peerBlocks = 0;
  /**
   * The prefill this router's requests here still wait for: the blocks the policy found uncached
   * (`uncachedBlocks`) of each request without a first token yet. Kept only with `peers`, which
   * announce it.
   */
  sentBlocks = 0;
  /** Requests waiting in the engine's own queue by its last `/metrics` (load feedback); admission counts such an engine full. */
  engineWaiting = 0;
  /** In rotation: derived by the table from the probe verdict and both circuits ({@link EndpointTable.updateHealth}). */
  healthy = true;
  /**
   * Outlier detection of this rank's own answers (5xx, timeouts); its state moves only in the
   * outlier detector, which reads it on every send and answer.
   */
  readonly circuit = new Circuit();
  /** Whether the upstream passes its active health check (always, when checks are off); written by the health checker alone. */
  probeUp = true;
  /**
   * First events of 2xx event streams from this endpoint, and the sum of their times from
   * dispatch in seconds (`FirstTokenTotals`): counted only for a policy with `learnsFirstTokens`.
   */
  firstTokens = 0;
  firstTokenSeconds = 0;

  /** `server` is shared by every endpoint reached through the same URL (see {@link EndpointTable}). */
  constructor(
    readonly config: UpstreamConfig,
    rank: number,
    readonly server: UpstreamServer = new UpstreamServer(config.url),
  ) {
    this.upstream = config.name;
    this.rank = rank;
    this.rankLabel = String(rank);
    this.key = `${config.name}#${rank}`;
    this.headerValue =
      config.rankHeader === 'global' ? this.rankLabel : config.rankHeader === 'local' ? String(rank - config.startRank) : undefined;
    const receipt = (source: DecisionSource) => `upstream=${this.upstream}; rank=${rank}; source=${source}`;
    this.receipts = { hint: receipt('hint'), assigned: receipt('assigned') };
    const decision = (source: DecisionSource) => new RankDecision(this.upstream, config.url, rank, source, this.headerValue);
    this.decisions = { hint: decision('hint'), assigned: decision('assigned') };
  }

  /** Whether this endpoint can stand for `rank` of `config`: same server, same header values. */
  servesAs(config: UpstreamConfig): boolean {
    const mine = this.config;
    return mine.name === config.name && mine.url === config.url && mine.rankHeader === config.rankHeader && mine.startRank === config.startRank;
  }

  get load(): number {
    return this.inflight + this.externalLoad + this.peerInflight;
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
  private servers = new Map<string, UpstreamServer>();
  private serverUrls = 0;

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

  /** How many distinct upstream servers (URLs) there are: a retry needs another one. */
  get serverCount(): number {
    return this.serverUrls;
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
    // A server that stays keeps its circuit: an ejected one stays out for every entry naming its URL.
    const servers = new Map<string, UpstreamServer>();
    const serverOf = (url: string) => {
      let server = servers.get(url);
      if (server === undefined) {
        server = this.servers.get(url) ?? new UpstreamServer(url);
        servers.set(url, server);
      }
      return server;
    };
    const added: RouteEndpoint[] = [];
    const next = upstreams.flatMap((upstream) =>
      upstream.ranks.map((rank) => {
        const kept = previous.get(`${upstream.name}#${rank}`);
        if (kept?.servesAs(upstream)) {
          previous.delete(kept.key);
          serverOf(upstream.url);
          return kept;
        }
        const endpoint = new RouteEndpoint(upstream, rank, serverOf(upstream.url));
        // A rank added to a server that is out (discovery, setUpstreams) is out with it.
        endpoint.healthy = endpoint.server.passes;
        added.push(endpoint);
        return endpoint;
      }),
    );
    this.configs = upstreams;
    this.serverUrls = new Set(upstreams.map((upstream) => upstream.url)).size;
    this.endpoints = next;
    this.servers = servers;
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

  /**
   * The least loaded healthy replica of one global rank (the first on ties), leaving out those
   * `skip` names; `undefined` when none is left. A hint is served by it, and retried on it.
   */
  leastLoadedOfRank(rank: number, skip?: (endpoint: RouteEndpoint) => boolean): RouteEndpoint | undefined {
    let best: RouteEndpoint | undefined;
    for (const replica of this.healthyOfRank(rank)) {
      if (skip !== undefined && skip(replica)) continue;
      if (best === undefined || replica.load < best.load) best = replica;
    }
    return best;
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
   * upstream passes its health check and neither its own circuit nor its server's is open (a
   * half-open one lets requests through, waiting for its trial). Returns whether anything changed.
   */
  updateHealth(endpoint: RouteEndpoint): boolean {
    return this.setHealthy(endpoint, endpoint.probeUp && endpoint.circuit.passes && endpoint.server.passes);
  }

  /** {@link updateHealth} for every endpoint behind one server. */
  updateServerHealth(server: UpstreamServer): void {
    for (const endpoint of this.endpoints) if (endpoint.server === server) this.updateHealth(endpoint);
  }

  /** The server behind `url` now, if any endpoint is reached through it. */
  server(url: string): UpstreamServer | undefined {
    return this.servers.get(url);
  }

  /** How many endpoints are in rotation. */
  get healthyCount(): number {
    return this.healthyAll.length;
  }

  /** Set by the peer link (`peers`): snapshots then carry the peers' load. */
  withPeers = false;

  snapshot(): EndpointSnapshot[] {
    if (this.withPeers) return this.all.map(({ upstream, rank, inflight, healthy, peerInflight, peerBlocks }) => ({ upstream, rank, inflight, healthy, peerInflight, peerBlocks }));
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
