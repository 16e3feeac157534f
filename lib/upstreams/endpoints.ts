import { reachedAlike, type UpstreamConfig } from './upstream-options';
import type { DecisionSource, Endpoint, EndpointSnapshot } from '../types';
import type { PeerLoad } from '../policies/prefix-aware-ttft';
import { RankDecision } from './rank-decision';

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

/** The rank of an endpoint where vLLM picks the engine ({@link RouteEndpoint.balanced}): no rank at all. */
export const NO_RANK = -1;
/** The `rank` label of such an endpoint's series. */
export const VLLM_RANK_LABEL = 'vllm';

/**
 * An endpoint as the router keeps it: the public view plus what dispatch needs. One per
 * (upstream, rank), and one more per upstream for the requests vLLM balances itself (`balanced`:
 * paths it does not route by the rank header, or an upstream whose header is not honoured),
 * which claims no rank: no header, `rank` {@link NO_RANK}, label `rank="vllm"`.
 */
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

  /** Whether vLLM picks the engine of this endpoint's requests (see the class). */
  readonly balanced: boolean;

  /**
   * `server` is shared by every endpoint reached through the same URL (see {@link EndpointTable});
   * `rank` {@link NO_RANK} makes the upstream's balanced endpoint.
   */
  constructor(
    readonly config: UpstreamConfig,
    rank: number,
    readonly server: UpstreamServer = new UpstreamServer(config.url),
  ) {
    const balanced = (this.balanced = rank === NO_RANK);
    this.upstream = config.name;
    this.rank = rank;
    this.rankLabel = balanced ? VLLM_RANK_LABEL : String(rank);
    this.key = `${config.name}#${this.rankLabel}`;
    this.headerValue =
      balanced || config.rankHeader === 'none' ? undefined : config.rankHeader === 'global' ? this.rankLabel : String(rank - config.startRank);
    const receipt = (source: DecisionSource) => `upstream=${this.upstream}; rank=${this.rankLabel}; source=${source}`;
    this.receipts = { hint: receipt('hint'), assigned: receipt('assigned') };
    const decision = (source: DecisionSource) => new RankDecision(this.upstream, config.url, balanced ? undefined : rank, source, this.headerValue);
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
  /** One balanced endpoint per upstream, in configuration order, and the rank endpoints behind each. */
  private balancedAll: readonly RouteEndpoint[] = [];
  private ranksBehind = new Map<RouteEndpoint, readonly RouteEndpoint[]>();
  private healthyBalancedAll: readonly RouteEndpoint[] = [];
  private unhonouredAll: readonly RouteEndpoint[] = [];
  private meteredAll: readonly RouteEndpoint[] = [];
  /** Upstreams whose rank header is not honoured: vLLM balances their requests ({@link letVllmBalance}). */
  private readonly unhonoured = new Set<string>();
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

  /** What the metrics count: every endpoint, then every balanced endpoint. */
  get metered(): readonly RouteEndpoint[] {
    return this.meteredAll;
  }

  /** The healthy balanced endpoints: where a request on a path vLLM balances itself may go. */
  healthyBalanced(): readonly RouteEndpoint[] {
    return this.healthyBalancedAll;
  }

  /** The healthy balanced endpoints of upstreams whose rank header is not honoured: they serve every request. */
  unhonouredBalanced(): readonly RouteEndpoint[] {
    return this.unhonouredAll;
  }

  /** The rank endpoints of a balanced endpoint's upstream. */
  ranksOf(balanced: RouteEndpoint): readonly RouteEndpoint[] {
    return this.ranksBehind.get(balanced) ?? [];
  }

  /**
   * Stops (`true`) or resumes claiming ranks on an upstream: while vLLM balances it, its rank
   * endpoints leave the candidate lists and its balanced endpoint takes its requests. A
   * reconfiguration that changes the upstream resumes. Returns whether anything changed.
   */
  letVllmBalance(name: string, on: boolean): boolean {
    if (on === this.unhonoured.has(name) || (on && !this.configs.some((config) => config.name === name))) return false;
    if (on) this.unhonoured.add(name);
    else this.unhonoured.delete(name);
    this.refresh();
    return true;
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
    const previous = new Map(this.meteredAll.map((endpoint) => [endpoint.key, endpoint]));
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
    // A balanced endpoint stays as rank endpoints do; an upstream reached otherwise now is honoured again.
    const ranksBehind = new Map<RouteEndpoint, readonly RouteEndpoint[]>();
    const before = new Map(this.configs.map((config) => [config.name, config]));
    for (const name of this.unhonoured) {
      const now = upstreams.find((upstream) => upstream.name === name);
      if (now === undefined || !reachedAlike(before.get(name)!, now)) this.unhonoured.delete(name);
    }
    const balanced = upstreams.map((upstream) => {
      let endpoint = previous.get(`${upstream.name}#${VLLM_RANK_LABEL}`);
      if (endpoint?.servesAs(upstream)) previous.delete(endpoint.key);
      else {
        endpoint = new RouteEndpoint(upstream, NO_RANK, serverOf(upstream.url));
        endpoint.healthy = endpoint.server.passes;
        added.push(endpoint);
      }
      ranksBehind.set(endpoint, next.filter((rank) => rank.upstream === upstream.name));
      return endpoint;
    });
    this.balancedAll = balanced;
    this.ranksBehind = ranksBehind;
    this.meteredAll = [...next, ...balanced];
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

  /** {@link updateHealth} for every endpoint behind one server, balanced ones included. */
  updateServerHealth(server: UpstreamServer): void {
    for (const endpoint of this.meteredAll) if (endpoint.server === server) this.updateHealth(endpoint);
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
    const { unhonoured } = this;
    // The ranks of an upstream vLLM balances are no candidates: its balanced endpoint is.
    const candidate = (endpoint: RouteEndpoint) => endpoint.healthy && !unhonoured.has(endpoint.upstream);
    this.healthyAll = this.endpoints.filter(candidate);
    this.healthyByRank = new Map();
    for (const [rank, replicas] of this.byRank) {
      this.healthyByRank.set(rank, replicas.filter(candidate));
    }
    this.healthyBalancedAll = this.balancedAll.filter((endpoint) => endpoint.healthy);
    this.unhonouredAll = this.healthyBalancedAll.filter((endpoint) => unhonoured.has(endpoint.upstream));
  }
}
