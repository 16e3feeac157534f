import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import type { Admission } from '../admission/admission';
import { hasBody } from '../request/body';
import type { AfterBody, BodyReader, Next } from '../request/body-reader';
import { sendError } from '../errors';
import { isWebSocketUpgrade, upstreamRequestStripper } from '../request/hop-by-hop';
import { setForwardedHeaders } from './forwarded-headers';
import type { Terminal } from '../request/lifecycle';
import { NO_METRICS, type RouterMetrics } from '../observe/metrics';
import type { Configuration, UpstreamConfig } from '../options';
import type { RetryConfig } from './retry-options';
import { DECISION_HEADER, type RouteState, type RoutedRequest } from '../request/route-state';
import { bareContext, safePick } from '../policies/safe-pick';
import type { EndpointTable, RouteEndpoint } from '../upstreams/endpoints';
import type { OutlierDetector } from '../upstreams/outlier-detector';
import type { PickContext, Policy, UpstreamErrorKind } from '../types';
import { answeredFirst, type FirstTokenListener } from '../observe/first-event';
import { clientGone, createUpstreamProxy, type TryFailure, type TryOutcomes, type UpstreamProxy } from './proxy';
import type { ModelRouting } from '../pools/model-routing';
import type { VllmBalancing } from '../request/vllm-balancing';
import type { RankHeaderGuard } from '../upstreams/rank-header-guard';
import { watchRankRejection } from '../upstreams/rank-rejection';
import type { Receipts } from '../receipts/receipts';

/** What the forwarder works with, built before it. */
export interface ForwarderParts {
  readonly config: Configuration;
  readonly policy: Policy;
  readonly table: EndpointTable;
  readonly metrics: RouterMetrics;
  readonly bodies: BodyReader;
  readonly detector: OutlierDetector | undefined;
  /** A retry stays in the request's model pool. */
  readonly models: ModelRouting;
  readonly admission: Admission | undefined;
  /** A request vLLM balances is retried on another upstream's balanced endpoint. */
  readonly balancing: VllmBalancing;
  /** Told of vLLM's refusals of a rank header. */
  readonly rankHeaders: RankHeaderGuard;
  /** Route receipts; `undefined` when off. */
  readonly receipts: Receipts | undefined;
}

/**
 * dpRouter's terminal: prepares the request for its upstream, holds its body for a retry, sends
 * it through the upstream's proxy (created on first use, one per upstream, kept until
 * `close()` so that requests in flight through a replaced one finish) and takes the proxy's
 * reports of each try: an answer, or a failure that is retried on another server or answered.
 */
export class Forwarder implements Terminal, TryOutcomes, FirstTokenListener<RouteState> {
  private readonly config: Configuration;
  private readonly retries: RetryConfig;
  private readonly table: EndpointTable;
  private readonly metrics: RouterMetrics;
  private readonly bodies: BodyReader;
  private readonly detector: OutlierDetector | undefined;
  private readonly policy: Policy;
  private readonly models: ModelRouting;
  private readonly admission: Admission | undefined;
  private readonly balancing: VllmBalancing;
  private readonly rankHeaders: RankHeaderGuard;
  private readonly receipts: Receipts | undefined;
  /** Whether the policy learns from each endpoint's first tokens (`learnsFirstTokens`). */
  private readonly countsFirstTokens: boolean;
  /** Whether anything but the peers reads first tokens (the metrics, the policy): otherwise only a request with prefill announced is watched. */
  private readonly watchesFirstTokens: boolean;
  /** The router's own rank header, set already, survives a client's `Connection` nomination; the upstream agent keeps connections alive. */
  private readonly stripHopByHop: (headers: IncomingHttpHeaders) => void;
  /** `xfwd`: the X-Forwarded-* headers are set here, once per request, not by http-proxy on each try. */
  private readonly xfwd: Configuration['xfwd'];
  /** After the body is held for a retry (or goes on unheld): the first try. Made once, so that a read allocates no closure. */
  private readonly replayable: AfterBody;
  /** By upstream name and URL: a proxy (and its keep-alive agent) per upstream server entry. */
  private readonly proxies = new Map<string, UpstreamProxy>();
  /** Endpoints kept across a reconfiguration hold the configuration they were built with. */
  private readonly proxyOfConfig = new WeakMap<UpstreamConfig, UpstreamProxy>();

  constructor(parts: ForwarderParts) {
    this.config = parts.config;
    this.retries = parts.config.retries;
    this.table = parts.table;
    this.metrics = parts.metrics;
    this.bodies = parts.bodies;
    this.detector = parts.detector;
    this.policy = parts.policy;
    this.models = parts.models;
    this.admission = parts.admission;
    this.balancing = parts.balancing;
    this.rankHeaders = parts.rankHeaders;
    this.receipts = parts.receipts;
    this.countsFirstTokens = parts.policy.learnsFirstTokens === true;
    this.watchesFirstTokens = this.countsFirstTokens || parts.metrics !== NO_METRICS;
    this.stripHopByHop = upstreamRequestStripper(parts.config.header);
    this.xfwd = parts.config.xfwd;
    this.replayable = (req, res, next, route) => this.send(req, res, next, route);
  }

  /** The first try: the request as the client sent it, made fit for its upstream. */
  proceed(req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState): void {
    // Express strips the mount path from req.url; upstream must see the path the client sent.
    // Stored only when it differs: a store to `req` costs far more than a read.
    const originalUrl = req.originalUrl;
    if (originalUrl !== undefined && req.url !== originalUrl) req.url = originalUrl;
    const { headers } = route;
    if (isWebSocketUpgrade(headers)) {
      // Stripped like any hop-by-hop header, the upgrade would reach the engine as a plain
      // request to a WebSocket-only route and come back as a puzzling 404 or 403.
      sendError(res, 501, 'NotImplementedError', 'The gateway does not proxy WebSocket upgrades; connect to the vLLM server directly for WebSocket endpoints.', 'upgrade');
      return;
    }
    this.stripHopByHop(headers);
    if (this.xfwd !== false) setForwardedHeaders(headers, headers.host, req.socket, this.xfwd === 'replace');
    this.holdForRetry(req, res, next, route);
  }

  /** Stops every proxy's agent and idle sweep. */
  close(): void {
    for (const proxy of this.proxies.values()) proxy.close();
  }

  /**
   * What one request may hold for a retry: `retry.maxBodyBytes`, or nothing with a single
   * server, where there is nowhere to retry and holding would only cost memory and latency.
   */
  retryBodyLimit(): number {
    const { retries } = this;
    return retries.attempts > 1 && this.table.serverCount > 1 ? retries.maxBodyBytes : 0;
  }

  /**
   * Holds the body so that a retry can replay it; the limit bounds what one request holds, the
   * body budget what all do. Past the budget the body is streamed and the request not retried.
   */
  private holdForRetry(req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState): void {
    const limit = this.retryBodyLimit();
    if (route.body === undefined && replayableSize(req, route.headers, limit)) {
      this.bodies.read(req, res, route, limit, 'replay', next, this.replayable, true);
      return;
    }
    this.send(req, res, next, route);
  }

  /** Starts one try at the endpoint the request holds. */
  private send(req: RoutedRequest, res: ServerResponse, next: Next, route: RouteState): void {
    const endpoint = route.endpoint!;
    route.sending();
    const { detector } = this;
    if (detector?.dispatched(endpoint, res)) {
      // This request is the half-open endpoint's one trial; if the client leaves before it
      // decides, the endpoint must be free for another trial.
      res.once('close', () => detector.abandoned(endpoint, res));
    }
    this.proxyOf(endpoint).send(req, res, next, route);
  }

  /** The proxy of the upstream `endpoint` is reached through, created on first use. */
  private proxyOf(endpoint: RouteEndpoint): UpstreamProxy {
    const upstream = endpoint.config;
    let proxy = this.proxyOfConfig.get(upstream);
    if (proxy !== undefined) return proxy;
    const key = `${upstream.name}\n${upstream.url}`;
    proxy = this.proxies.get(key);
    if (proxy === undefined) {
      proxy = createUpstreamProxy(upstream, this.config, this);
      this.proxies.set(key, proxy);
    }
    this.proxyOfConfig.set(upstream, proxy);
    return proxy;
  }

  /** The upstream began to answer. */
  answered(route: RouteState, req: RoutedRequest, res: ServerResponse, answer: IncomingMessage): void {
    route.responding();
    const endpoint = route.endpoint!;
    // One scan of the stream for everyone who reads its first token, gone at that token.
    if (this.watchesFirstTokens || route.prefillBlocks > 0) answeredFirst(endpoint, answer, route.started, this, route);
    if (route.ticket !== undefined && this.admission!.counts) this.admission!.count(route.ticket, answer);
    if (endpoint.headerValue !== undefined) watchRankRejection(answer, (refused, numRanks) => this.rankHeaders.refused(endpoint, refused, numRanks, req, route.headers, route.ticket?.tenant));
    else this.rankHeaders.answered(endpoint, route.headers);
    if (route.receipt !== undefined) this.receipts!.answered(route.receipt, endpoint, req, res, answer);
    if (answer.statusCode !== undefined && answer.statusCode >= 500) {
      this.metrics.upstreamError(endpoint, 'status_5xx');
      this.detector?.failed(endpoint, 'request', req, route.ticket?.tenant);
    } else {
      // Any answer below 500, a 4xx included, shows the endpoint alive: a client's bad
      // request is never the endpoint's fault.
      this.detector?.succeeded(endpoint);
    }
  }

  /**
   * A 2xx answer's first token: observed by the metrics, and, for an event stream, added to
   * the endpoint's first-token totals (a policy that `learnsFirstTokens`) and the end of the
   * request's prefill (with `peers`). A non-streamed answer's first byte comes with its last,
   * which says how long the generation took, not how long the prefill waited: not counted.
   */
  firstToken(endpoint: RouteEndpoint, seconds: number, streamed: boolean, route: RouteState): void {
    this.metrics.firstToken(endpoint, seconds);
    if (!streamed) return;
    if (this.countsFirstTokens) {
      endpoint.firstTokens++;
      endpoint.firstTokenSeconds += seconds;
    }
    route.prefilled();
  }

  /** The try failed: counted once against its endpoint, then retried elsewhere or answered. */
  failed(route: RouteState, req: RoutedRequest, res: ServerResponse, failure: TryFailure): void {
    route.clearDeadlines();
    if (route.phase === 'responding') {
      this.cutShort(route, req, res);
      return;
    }
    // A client that left is not the upstream's fault, and there is no one to answer.
    if (!route.settle() || clientGone(res)) return;
    const endpoint = route.endpoint!;
    this.metrics.upstreamError(endpoint, ERROR_KIND[failure]);
    // A first-byte timeout may be the request's own doing (a long generation); the rest never reached an answer.
    this.detector?.failed(endpoint, failure === 'first_byte_timeout' ? 'request' : 'connection', req, route.ticket?.tenant);
    // Not after a first-byte timeout: the engine may still be working on it, and the client
    // has already waited the whole deadline.
    if (failure !== 'first_byte_timeout' && this.retry(req, res, route, endpoint)) return;
    answerFailure(req, res, failure);
  }

  /**
   * The upstream failed after it began to answer (or the first of the two events that report
   * it, for the request and the response, arrived): counted once as a reset. With nothing
   * sent to the client yet it still gets a proper 502; mid-body only cutting the connection
   * tells it the answer is incomplete.
   */
  cutShort(route: RouteState, req: RoutedRequest, res: ServerResponse): void {
    if (!this.settleAsReset(route, req, res)) return;
    if (res.headersSent) {
      res.destroy();
      return;
    }
    for (const name of res.getHeaderNames()) if (name !== DECISION_HEADER) res.removeHeader(name);
    res.statusMessage = '';
    sendError(res, 502, 'BadGatewayError', `The upstream${rankOf(req)} closed the connection before finishing its answer.`);
  }

  /**
   * The upstream answered with something the gateway cannot relay (the proxy dropped that
   * connection): the client gets a 502, and the endpoint is counted `reset`, as for an answer
   * cut short: the upstream broke HTTP, it did not report a failure of its own.
   */
  refused(route: RouteState, req: RoutedRequest, res: ServerResponse, why: string): void {
    route.clearDeadlines();
    route.body = undefined;
    if (this.settleAsReset(route, req, res)) sendError(res, 502, 'BadGatewayError', `The upstream${rankOf(req)} ${why}, which the gateway cannot relay.`);
  }

  /**
   * Sends the request again to another server: a refused or reset connection belongs to the API
   * server, which all the ranks it serves share, so the endpoints of an upstream URL that failed
   * are not tried again for this request. The policy picks among the healthy endpoints left; a
   * hint goes to the least loaded replica of the same rank elsewhere. Returns false when the
   * request must not or cannot be retried, and the caller answers the error.
   */
  private retry(req: RoutedRequest, res: ServerResponse, route: RouteState, failed: RouteEndpoint): boolean {
    if (route.attempt >= this.retries.attempts || res.headersSent) return false;
    // A NIXL decode leg past its KV lease would find the prefill's blocks gone.
    if (route.leaseEnds !== 0 && performance.now() >= route.leaseEnds) return false;
    // Only what can be replayed byte for byte: a buffered body, or none at all.
    if (route.body === undefined && hasBody(route.headers)) return false;
    const tried = (route.tried ??= []);
    tried.push(failed);
    const { admission } = this;
    // Under admission a retry goes only where there is room: capacity holds for retries too.
    const skip = admission === undefined ? (endpoint: RouteEndpoint) => failedBefore(endpoint, tried) : (endpoint: RouteEndpoint) => failedBefore(endpoint, tried) || (!endpoint.balanced && admission.full(endpoint));
    const next = failed.balanced
      ? this.balancing.pick(route, skip)
      : route.source === 'hint'
        ? this.table.leastLoadedOfRank(failed.rank, skip)
        : this.pickAgain(req, route, skip);
    if (next === undefined) return false;
    route.moveTo(req, res, next);
    // http-proxy-middleware calls `next` only on its own errors; the first try's `next` belongs
    // to Express and has been handed on, so a retry answers them itself.
    this.send(req, res, (error) => answerProxyFailure(res, error), route);
    return true;
  }

  private pickAgain(req: RoutedRequest, route: RouteState, skip: (endpoint: RouteEndpoint) => boolean): RouteEndpoint | undefined {
    const picked = route.context;
    const candidates = this.models.retryCandidates(route.model).filter((endpoint) => !skip(endpoint));
    if (candidates.length === 0) return undefined;
    // The policy's fault surfaces on first picks; a retry answers the upstream's error instead.
    return safePick(this.policy, candidates, picked ?? bareContext(req.url ?? '/'));
  }

  /**
   * Settles the try as a reset, counted against its endpoint; false when it was settled
   * already or the client left (a client that left is not the upstream's fault).
   */
  private settleAsReset(route: RouteState, req: RoutedRequest, res: ServerResponse): boolean {
    if (!route.settle() || clientGone(res)) return false;
    const endpoint = route.endpoint!;
    this.metrics.upstreamError(endpoint, 'reset');
    this.detector?.failed(endpoint, 'request', req, route.ticket?.tenant);
    return true;
  }
}

/**
 * Whether the body is worth holding for retries: declared by `Content-Length` (so its size is
 * known, and taken from the budget, before a byte is read), not empty, within the limit, and
 * still unread.
 */
function replayableSize(req: IncomingMessage, headers: IncomingHttpHeaders, limit: number): boolean {
  if (limit === 0 || headers['transfer-encoding'] !== undefined || req.readableEnded) return false;
  const declared = headers['content-length'];
  if (declared === undefined || declared === '0') return false;
  const size = Number(declared);
  return size > 0 && size <= limit;
}

/** Whether the endpoint's upstream server already failed this request. */
function failedBefore(endpoint: RouteEndpoint, tried: readonly RouteEndpoint[]): boolean {
  for (const failed of tried) if (failed.config.url === endpoint.config.url) return true;
  return false;
}

/** A try's failure as the metrics count it. */
const ERROR_KIND: Readonly<Record<TryFailure, Exclude<UpstreamErrorKind, 'status_5xx'>>> = {
  refused: 'connect',
  connect_timeout: 'timeout',
  timeout: 'timeout',
  first_byte_timeout: 'timeout',
  reset: 'reset',
};

/** The gateway's own answer to a try that failed and was not retried: 504 for a timeout, 502 otherwise. */
function answerFailure(req: IncomingMessage, res: ServerResponse, failure: TryFailure): void {
  const rank = rankOf(req);
  if (failure === 'connect_timeout') sendError(res, 504, 'GatewayTimeoutError', `The upstream${rank} did not accept the connection in time.`);
  else if (failure === 'timeout' || failure === 'first_byte_timeout') sendError(res, 504, 'GatewayTimeoutError', `The upstream${rank} did not answer in time.`);
  else if (failure === 'refused') sendError(res, 502, 'BadGatewayError', `The upstream${rank} refused the connection.`);
  else sendError(res, 502, 'BadGatewayError', `The upstream${rank} closed the connection.`);
}

function rankOf(req: IncomingMessage): string {
  const rank = req.dpRank?.rank;
  return rank === undefined ? '' : ` for data-parallel rank ${rank}`;
}

/** http-proxy-middleware failed before proxying a retry: answer here. */
function answerProxyFailure(res: ServerResponse, error?: unknown): void {
  if (error === undefined) return;
  sendError(res, 502, 'BadGatewayError', 'The request could not be proxied to another upstream.');
}
