import type { IncomingMessage } from 'node:http';
import type { Registry } from 'prom-client';
import type { KvEventsOptions } from './kv-events/options';
import type { PrefixAwareOptions } from './policies/prefix-aware';

/** What the proxied request's rank header carries for an upstream. */
export type RankHeaderMode = 'global' | 'local' | 'none';

/** One vLLM OpenAI-compatible server (one API server of a data-parallel deployment). */
export interface UpstreamOptions {
  /** Base URL, `http:` or `https:`. Required. */
  url: string;
  /** Metric label and decision name. Default: the URL's origin. */
  name?: string;
  /** How many data-parallel ranks this server serves (`--data-parallel-size`). Default: `1`. */
  dataParallelSize?: number;
  /** The first global rank it serves (`--data-parallel-start-rank`). Default: `0`. */
  startRank?: number;
  /** Route only to these global ranks. Default: every rank it serves. */
  ranks?: readonly number[];
  /**
   * The rank header value sent to this upstream: `'global'` (internal load balancing),
   * `'local'` (rank − startRank: hybrid load balancing on vLLM's Python server) or `'none'`
   * (external load balancing: one server per rank, no header). Default: `'global'`.
   */
  rankHeader?: RankHeaderMode;
  /**
   * Learn the global ranks this server serves from the distinct `engine` labels of its
   * `/metrics` (start rank = the smallest), at start and every `intervalMs`; the configured
   * ranks stand until the first answer and whenever the server cannot be read. `true` means
   * `{ intervalMs: 10_000 }`. Default: `false`.
   */
  discover?: boolean | { intervalMs?: number };
  /**
   * Where this server's engines publish KV-cache events (vLLM's `--kv-events-config`): with
   * `prefixAware.tokenizer`, the `prefix-aware` policy routes its ranks on the blocks the
   * engines report holding. See docs/exact-prefix-routing.md. Default: none.
   */
  kvEvents?: KvEventsOptions;
}

/** Built-in assignment policies, by name. */
export type PolicyName =
  | 'least-outstanding'
  | 'round-robin'
  | 'random'
  | 'power-of-two'
  | 'session-affinity'
  | 'prefix-aware';

/** How client rank hints are treated. */
export interface HintOptions {
  /**
   * Whether a caller may name its rank. A function decides per request (e.g. from your own
   * authentication). Untrusted hints are removed and counted `untrusted`. Default: `false`.
   */
  trust?: boolean | ((req: IncomingMessage) => boolean);
  /** What an invalid trusted hint gets: a rank assigned anyway, or a 400. Default: `'reassign'`. */
  onInvalid?: 'reassign' | 'reject';
  /** The incoming hint header. Default: `'x-data-parallel-rank'`. */
  header?: string;
  /** A JSON body field read as a hint (e.g. `'routed_dp_rank'`), or `false`. Default: `false`. */
  bodyField?: string | false;
}

/** Where the `session-affinity` policy finds a request's key. */
export interface AffinityOptions {
  /** Header holding the session key, or `false`. Default: `'x-session-id'`. */
  header?: string | false;
  /** Top-level JSON body field holding the key, or `false`. Default: `'user'`. */
  bodyField?: string | false;
  /**
   * In-flight guard: a request whose session's endpoint is loaded above both
   * `⌈loadFactor × mean⌉` and the least loaded endpoint's load plus `loadSlack` goes, this once,
   * to the next endpoint in the session's hash order. Default: `1.25`.
   */
  loadFactor?: number;
  /**
   * The in-flight guard's absolute slack, in requests: at low load a session stays on its
   * endpoint (and its cache) while that endpoint is at most this many requests ahead of the
   * least loaded one; a hot session still spills. `0` leaves only the ratio. Default: `4`.
   */
  loadSlack?: number;
  /**
   * Session balance: a new session goes to the first endpoint of its hash order holding fewer
   * than `⌈keyLoadFactor × (sessions + 1) / endpoints⌉` sessions. Default: `1`.
   */
  keyLoadFactor?: number;
  /** Sessions remembered (LRU; about 50 bytes each). Default: `65536`. */
  maxSessions?: number;
}

/** Timeouts: the upstream's (exceeding one answers 504) and the client's body (408). */
export interface TimeoutOptions {
  /** Time to establish the upstream connection. Default: `10_000` ms. */
  connectMs?: number;
  /** Time from dispatch until the upstream's response headers. Default: `600_000` ms. */
  firstByteMs?: number;
  /**
   * Time for the request body to arrive in full, from the moment the router sees the request,
   * whether the router reads the body or streams it to the upstream. A body still arriving then
   * gets a 408 `RequestTimeoutError` (the connection is closed and any upstream request
   * destroyed), before Node's own `server.requestTimeout` (300 s) would answer outside vLLM's
   * error shape; keep it below that. Default: `60_000` ms.
   */
  bodyMs?: number;
}

/**
 * Passive outlier detection (Envoy's name), on two kinds of evidence:
 *
 * - **Connection failures** (refused, unreachable, connect timeout, reset before any answer)
 *   are about the server: `consecutiveFailures` of them in a row to one upstream URL take every
 *   rank behind it out of rotation together. No cap: with every server out, the router answers
 *   503 at once.
 * - **Request failures** (a 5xx answer, a first-byte timeout, an answer cut short) may be
 *   provoked by the request itself: `consecutiveFailures` in a row take one endpoint out only
 *   when they came from at least `minimumClients` distinct clients, and at most
 *   `maxEjectionPercent` of the endpoints at once.
 *
 * Out of rotation is a cool-down, then half-open: one trial request decides whether the server
 * or endpoint comes back (a passing active health check also brings a server back). A 4xx
 * answer is the request's fault, never the endpoint's, and counts as a success like any answer
 * below 500.
 */
export interface OutlierDetectionOptions {
  /** Consecutive failures that eject a server (connection failures) or an endpoint (request failures). Default: `5`. */
  consecutiveFailures?: number;
  /** The first cool-down; it doubles for each ejection in a row, up to `maxEjectionMs`. Default: `10_000` ms. */
  baseEjectionMs?: number;
  /** The longest cool-down. Default: `300_000` ms. */
  maxEjectionMs?: number;
  /**
   * For request failures only: at most this share of the router's endpoints is ejected at once
   * (rounded down, at least one endpoint), and never the last endpoint in rotation: a server
   * that still answers gives its own error rather than a blanket 503. Connection failures are
   * not capped. Default: `50`.
   */
  maxEjectionPercent?: number;
  /**
   * For request failures only: the distinct clients whose requests must be among a failure run
   * before it ejects an endpoint, so that one client cannot evict capacity for everyone with
   * requests that make the engine fail. A client is `req.ip` (Express's, which follows your
   * app's `trust proxy` setting: set it behind a load balancer, or every request is the
   * balancer's), else the socket's address; an IPv6 client counts by its /64. `1` counts
   * failures from anyone. Default: `3`.
   */
  minimumClients?: number;
}

/**
 * Active health checks: one `GET` of each upstream URL's `path` per interval, shared by all
 * the ranks it serves. An upstream that fails `unhealthyThreshold` probes in a row (no answer
 * within `timeoutMs`, or a status other than 2xx) has all its endpoints taken out of rotation
 * until `healthyThreshold` probes in a row succeed.
 */
export interface HealthCheckOptions {
  /** The path probed. Default: `'/health'` (vLLM's). */
  path?: string;
  /** Time between the end of one probe and the start of the next. Default: `5_000` ms. */
  intervalMs?: number;
  /** A probe without an answer by then fails. Default: `2_000` ms. */
  timeoutMs?: number;
  /** Failed probes in a row that take an upstream out. Default: `2`. */
  unhealthyThreshold?: number;
  /** Passed probes in a row that bring it back. Default: `1`. */
  healthyThreshold?: number;
}

/**
 * Retries on another upstream when the connection to the chosen one fails before it began to
 * answer (refused, connect timeout, reset): never after a response byte reached the client,
 * never after a first-byte timeout, never for an upstream's own answer (a 5xx is passed
 * through). A hinted request is retried only on replicas of the same rank.
 */
export interface RetryOptions {
  /** Tries per request, the first included; `1` turns retries off. Default: `2`. */
  attempts?: number;
  /**
   * Bodies with a declared `Content-Length` up to this size are held in memory until the
   * upstream answers, so that a retry can replay them byte for byte. Larger bodies, and
   * chunked ones the router did not otherwise read, are streamed and not retried. With a
   * single upstream server nothing is held: there is nowhere to retry. Default: `1_048_576` (1 MiB).
   */
  maxBodyBytes?: number;
}

/**
 * Engine load from vLLM's own `/metrics` (`vllm:num_requests_running` + `vllm:num_requests_waiting`
 * per `engine`), so that several gateway replicas balance on the load all of them put on each
 * engine, not only their own share.
 */
export interface LoadFeedbackOptions {
  /** Time between polls of each upstream. Default: `1_000` ms. */
  intervalMs?: number;
  /** A poll without an answer by then fails; the endpoints fall back to local counts. Default: `1_000` ms. */
  timeoutMs?: number;
  /**
   * How much of the load other gateways put on an engine (engine-reported minus this
   * router's own in-flight) is added to the local count, from 0 to 1. Below 1 because every
   * replica acts on the same stale snapshot: at full weight they all pile onto the engine
   * that looked idlest. Default: `0.5`.
   */
  weight?: number;
}

/** Metrics settings. */
export interface MetricsOptions {
  /** The prom-client registry to register on. Default: prom-client's global `register`. */
  registry?: Registry;
  /** Metric name prefix. Default: `'dp_router_'`. */
  prefix?: string;
}

/** Options of {@link dpRouter} and {@link dpRank}. */
export interface Options {
  /** The vLLM servers and the ranks each serves. Required, at least one. */
  upstreams: readonly UpstreamOptions[];
  /** How a rank is assigned when no valid trusted hint was given. Default: `'least-outstanding'`. */
  policy?: PolicyName | Policy;
  /** Client hint handling. Default: hints untrusted. */
  hints?: HintOptions;
  /** The header set on the proxied request. Default: `'X-data-parallel-rank'`. */
  header?: string;
  /** Metrics settings, or `false` for none. Default: `{ registry: register, prefix: 'dp_router_' }`. */
  metrics?: MetricsOptions | false;
  /** Session keys for the `session-affinity` policy. */
  affinity?: AffinityOptions;
  /** Upstream and request body timeouts. */
  timeouts?: TimeoutOptions;
  /** Largest body read when it must be read (body hints, prefix-aware); more answers 413. Default: 16 MiB. */
  maxBodyBytes?: number;
  /**
   * The most memory all requests in flight may hold in request bodies at once: bodies the
   * router reads (prefix-aware, a body affinity key, body hints), bodies held for retries, and
   * the text routing extracts from them, each held until its response ends. A body that would
   * pass it gets a 503 `ServiceUnavailableError` (413 when it alone exceeds it); a body only
   * wanted for a retry is streamed instead, without retries. Default: 512 MiB, or a quarter of
   * V8's heap limit where that is less — 32 bodies of the default `maxBodyBytes` at once.
   */
  maxBufferedBytes?: number;
  /** Answer with `X-DP-Router-Decision` (reveals server layout). Default: `false`. */
  exposeDecision?: boolean;
  /**
   * Tell the upstream who the client is, in `X-Forwarded-For`, `-Host`, `-Port` and `-Proto`.
   * `true`: the gateway's own view (the peer's address, the `Host` header, the local port and
   * protocol), replacing whatever the client sent in those headers and in `Forwarded`, which
   * anyone could forge. `'append'`: behind a proxy you trust, which sets them itself: the
   * peer's address, port and protocol are appended to the values it sent and its
   * `X-Forwarded-Host` kept (http-proxy-middleware's `xfwd`). Like Express's `trust proxy`,
   * incoming values are trusted only when you say so. Default: `false` (headers left as they
   * came). It costs about 5 % more instructions per request (measured with `'append'`;
   * `npm run bench:instructions`).
   */
  xfwd?: boolean | 'append';
  /** Settings of the `'prefix-aware'` policy (block size, index memory bound, load thresholds, tokenizer). */
  prefixAware?: Omit<PrefixAwareOptions, 'fallback'> & {
    /**
     * The model's tokenizer, for exact prefix routing on upstreams with `kvEvents`: a directory
     * holding `tokenizer.json` and `tokenizer_config.json` (with the chat template the engine
     * uses), or the two files' paths. Loaded at creation. Default: none (approximate only).
     */
    tokenizer?: string | readonly [string, string];
  };
  /** Passive ejection of failing endpoints, or `false`. Default: on, with the defaults of {@link OutlierDetectionOptions}. */
  outlierDetection?: OutlierDetectionOptions | boolean;
  /** Active health checks of each upstream, `true` for the defaults. Default: `false` (off). */
  healthCheck?: HealthCheckOptions | boolean;
  /** Retries of failed connections on another endpoint, or `false`. Default: `{ attempts: 2, maxBodyBytes: 1 MiB }`. */
  retries?: RetryOptions | boolean;
  /** Blend engine-reported load into the load policies see, or `false`. Default: `false` (off). */
  loadFeedback?: LoadFeedbackOptions | boolean;
  /**
   * Where the router logs: a pino logger as it is, `console`, or anything with `warn`.
   * Run-time notices (a body parser mounted before it, ranks discovered) go to `warn`, each
   * kind once per occurrence; an ejected endpoint to `info`; one structured line per routing
   * decision and per retry to `debug`, only when `isLevelEnabled('debug')` says so (pino's
   * level check, so `console` never gets them). `false` silences it.
   * Default: notices as `process.emitWarning`, nothing else.
   */
  logger?: Logger | false;
}

/**
 * Receives the router's logs, in pino's calling convention: `(fields, message)` for structured
 * lines, `(message)` for notices. pino's logger (a child logger too) and `console` fit as they are.
 */
export interface Logger {
  warn(message: string): void;
  info?(fields: object, message: string): void;
  debug?(fields: object, message: string): void;
  error?(fields: object, message: string): void;
  /** pino's level check; without it no per-request line is written. */
  isLevelEnabled?(level: string): boolean;
}

/** One (upstream, global rank) pair that requests can be routed to. */
export interface Endpoint {
  /** Unique within a router: `<upstream>#<rank>`. */
  readonly key: string;
  /** The upstream's name. */
  readonly upstream: string;
  /** The global data-parallel rank. */
  readonly rank: number;
  /** Requests dispatched by this router and not yet finished. */
  readonly inflight: number;
  /** The load policies balance on: `inflight`, plus engine load where load feedback is on. */
  readonly load: number;
  /** Whether the endpoint is in rotation. */
  readonly healthy: boolean;
}

/** What a policy may know of the request, as plain values. */
export interface PickContext {
  /** The request path as the client sent it (mount path included), e.g. `/v1/chat/completions`. */
  readonly path: string;
  /** The session key, for policies with `usesAffinityKey`. */
  readonly affinityKey: string | undefined;
  /** The prompt text, for policies with `usesPrompt`, when the body carries one. */
  readonly prompt: string | undefined;
}

/** An assignment policy. Candidates are never empty and are all healthy. */
export interface Policy {
  readonly name: string;
  pick(candidates: readonly Endpoint[], ctx: PickContext): Endpoint;
  /** Ask the router to read the body and pass `ctx.prompt`. */
  readonly usesPrompt?: boolean;
  /** Ask the router to read the session key into `ctx.affinityKey`. */
  readonly usesAffinityKey?: boolean;
}

/** Where the chosen rank came from. */
export type DecisionSource = 'hint' | 'assigned';

/** The routing decision for one request, set as `req.dpRank`. */
export interface DpRankDecision {
  /** The chosen upstream's name. */
  readonly upstream: string;
  /** The chosen upstream's URL. */
  readonly url: string;
  /** The global rank. */
  readonly rank: number;
  readonly source: DecisionSource;
  /** The rank header value sent upstream, or `undefined` for `rankHeader: 'none'`. */
  readonly headerValue: string | undefined;
}

/** A point-in-time view of one endpoint. */
export interface EndpointSnapshot {
  upstream: string;
  rank: number;
  inflight: number;
  healthy: boolean;
}

// On 'http', which 'node:http' re-exports: augmenting 'node:http' breaks the type check of a
// program that also loads pino's types ("IncomingMessage incorrectly extends Readable").
declare module 'http' {
  interface IncomingMessage {
    /** The routing decision, set by `dpRank()` and `dpRouter()`. */
    dpRank?: DpRankDecision;
  }
}
