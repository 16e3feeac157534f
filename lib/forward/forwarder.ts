import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import type { Gate } from '../request/gate';
import type { RouteSeam } from '../request/route-hooks';
import { hasBody } from '../http/body';
import type { AfterBody, BodyReader, Next } from '../request/body-reader';
import { sendError } from '../errors';
import { isWebSocketUpgrade, upstreamRequestStripper } from '../http/hop-by-hop';
import { setForwardedHeaders } from './forwarded-headers';
import type { Terminal } from '../request/lifecycle';
import type { UpstreamConfig } from '../upstreams/upstream-options';
import type { RetryConfig } from './retry-options';
import { DECISION_HEADER, type RouteState, type RoutedRequest } from '../request/route-state';
import { bareContext, safePick } from '../policies/safe-pick';
import type { EndpointTable, RouteEndpoint } from '../upstreams/endpoints';
import type { PickContext, UpstreamErrorKind } from '../types';
import type { RoutePolicy } from '../policies/route-policy';
import { answeredFirst, type FirstTokenListener } from '../observe/first-event';
import { clientGone, createUpstreamProxy, type ProxyConfig, type TryFailure, type TryOutcomes, type UpstreamProxy } from './proxy';
import { leastLoadedOfRank, type ModelStage } from '../request/model-stage';
import type { VllmBalancing } from '../request/vllm-balancing';

/** What the forwarder works with, built before it. */
/** The options the forwarder reads (the router's `Configuration` is one). */
export interface ForwarderConfig extends ProxyConfig {
  readonly header: string;
  readonly xfwd: false | 'replace' | 'append';
}

export interface ForwarderParts {
  readonly config: ForwarderConfig;
  readonly policy: RoutePolicy;
  readonly table: EndpointTable;
  readonly bodies: BodyReader;
  /** A retry stays in the request's model pool. */
  readonly models: ModelStage;
  readonly admission: Gate | undefined;
  /** A request vLLM balances is retried on another upstream's balanced endpoint. */
  readonly balancing: VllmBalancing;
  /** What the features do at each point of the way (request/route-hooks.ts). */
  readonly hooks: RouteSeam<RouteState>;
}

/**
 * dpRouter's terminal: prepares the request for its upstream, holds its body for a retry, sends
 * it through the upstream's proxy (created on first use, one per upstream, kept until
 * `close()` so that requests in flight through a replaced one finish) and takes the proxy's
 * reports of each try: an answer, or a failure that is retried on another server or answered.
 */
export class Forwarder implements Terminal, TryOutcomes, FirstTokenListener<RouteState> {
  private readonly config: ForwarderConfig;
  private readonly retries: RetryConfig;
  private readonly table: EndpointTable;
  private readonly bodies: BodyReader;
  private readonly policy: RoutePolicy;
  private readonly models: ModelStage;
  private readonly admission: Gate | undefined;
  private readonly balancing: VllmBalancing;
  private readonly hooks: RouteSeam<RouteState>;
  /** The router's own rank header, set already, survives a client's `Connection` nomination; the upstream agent keeps connections alive. */
  private readonly stripHopByHop: (headers: IncomingHttpHeaders) => void;
  /** `xfwd`: the X-Forwarded-* headers are set here, once per request, not by http-proxy on each try. */
  private readonly xfwd: ForwarderConfig['xfwd'];
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
    this.bodies = parts.bodies;
    this.policy = parts.policy;
    this.models = parts.models;
    this.admission = parts.admission;
    this.balancing = parts.balancing;
    this.hooks = parts.hooks;
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
    const sending = this.hooks.sending;
    for (let i = 0; i < sending.length; i++) sending[i].sending!(route, endpoint, res);
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
    const { hooks } = this;
    // One scan of the stream for everyone who reads its first token, gone at that token.
    if (hooks.firstToken.length > 0 && hooks.watchesFirstToken(route)) answeredFirst(endpoint, answer, route.started, this, route);
    const answered = hooks.answered;
    for (let i = 0; i < answered.length; i++) answered[i].answered!(route, endpoint, req, res, answer);
  }

  /** A 2xx answer's first token (`streamed`: an event stream's first real event), told to every feature that reads it. */
  firstToken(endpoint: RouteEndpoint, seconds: number, streamed: boolean, route: RouteState): void {
    const first = this.hooks.firstToken;
    for (let i = 0; i < first.length; i++) first[i].firstToken!(route, endpoint, seconds, streamed);
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
    // A first-byte timeout may be the request's own doing (a long generation); the rest never reached an answer.
    this.tell(route, endpoint, req, ERROR_KIND[failure], failure === 'first_byte_timeout' ? 'request' : 'connection');
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
        ? this.hintAgain(route, failed.rank, skip)
        : this.pickAgain(req, route, skip);
    if (next === undefined) return false;
    route.moveTo(req, res, next);
    // http-proxy-middleware calls `next` only on its own errors; the first try's `next` belongs
    // to Express and has been handed on, so a retry answers them itself.
    this.send(req, res, (error) => answerProxyFailure(res, error), route);
    return true;
  }

  /** A hinted request's retry: the same rank on another server, in its model's pool where requests are routed by model. */
  private hintAgain(route: RouteState, rank: number, skip: (endpoint: RouteEndpoint) => boolean): RouteEndpoint | undefined {
    return route.model === undefined ? this.table.leastLoadedOfRank(rank, skip) : leastLoadedOfRank(this.models.retryCandidates(route.model), rank, skip);
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
    this.tell(route, endpoint, req, 'reset', 'request');
    return true;
  }

  /** A try's failure, told to every feature that counts it (route-hooks.ts `failed`). */
  private tell(route: RouteState, endpoint: RouteEndpoint, req: RoutedRequest, kind: Exclude<UpstreamErrorKind, 'status_5xx'>, origin: 'request' | 'connection'): void {
    const failed = this.hooks.failed;
    for (let i = 0; i < failed.length; i++) failed[i].failed!(route, endpoint, req, kind, origin);
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
