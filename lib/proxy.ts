import { Agent as HttpAgent, type ClientRequest, type IncomingMessage, type ServerResponse } from 'node:http';
import { Agent as HttpsAgent } from 'node:https';
import type { Socket } from 'node:net';
import { createProxyMiddleware, type RequestHandler } from 'http-proxy-middleware';
import type { RouteEndpoint } from './endpoints';
import { sendError } from './errors';
import { hopByHopStripper } from './hop-by-hop';
import { closeIdleSockets } from './idle-sockets';
import type { RouterMetrics, UpstreamErrorKind } from './metrics';
import type { Configuration, UpstreamConfig } from './options';
import type { OutlierDetector } from './outlier-detector';
import { routeOf, type RouteState, type RoutedRequest } from './route-state';
import { lenientParser, unrelayable } from './upstream-response';

/** One upstream's proxy and the connections it keeps. */
export interface UpstreamProxy {
  readonly handle: RequestHandler<IncomingMessage, ServerResponse>;
  close(): void;
}

/** Sent, no response headers yet: a failure here may be retried. */
export const WAITING = 1;
/** The upstream began to answer: never retried. */
export const RESPONDING = 2;
/** The try failed and was counted; later events of it are echoes. */
export const SETTLED = 3;

/** A request the router proxies: its state is in `req.dpRank` (see RankDecision). */
export type ProxiedRequest = RoutedRequest;

/** What the proxy reports outcomes to, and asks for a retry. */
export interface FaultHandling {
  readonly detector: OutlierDetector | undefined;
  /** Sends the request to another endpoint; returns false when it may not or cannot be retried. */
  readonly retry: ((req: ProxiedRequest, res: ServerResponse, failed: RouteEndpoint) => boolean) | undefined;
}

const CONNECT_TIMEOUT = 'DP_ROUTER_CONNECT_TIMEOUT';
const FIRST_BYTE_TIMEOUT = 'DP_ROUTER_FIRST_BYTE_TIMEOUT';
const CONNECT_FAILURES = new Set(['ECONNREFUSED', 'EHOSTUNREACH', 'ENETUNREACH', 'ENOTFOUND', 'EAI_AGAIN', 'EADDRNOTAVAIL']);
/** Kept on a replaced error answer: it says where the request went. */
const DECISION_HEADER = 'x-dp-router-decision';

/**
 * Idle upstream connections are dropped before uvicorn's 5 s keep-alive would close them,
 * so a request is never sent down a socket the server is closing.
 */
const IDLE_SOCKET_MS = 4_000;
/** An upstream answer's hop-by-hop headers describe the upstream connection, not the client's. */
const stripHopByHop = hopByHopStripper();

/** Creates the http-proxy-middleware instance for one upstream, with a keep-alive agent. */
export function createUpstreamProxy(
  upstream: UpstreamConfig,
  config: Configuration,
  metrics: RouterMetrics,
  faults: FaultHandling = { detector: undefined, retry: undefined },
): UpstreamProxy {
  const agentOptions = { keepAlive: true, scheduling: 'lifo' as const };
  // Without an agent http-proxy sends `Connection: close` and opens a socket per request.
  const agent = upstream.url.startsWith('https:') ? new HttpsAgent(agentOptions) : new HttpAgent(agentOptions);
  const stopIdleSweep = closeIdleSockets(agent, IDLE_SOCKET_MS);
  const { connectTimeoutMs, firstByteTimeoutMs } = config;
  const { detector, retry } = faults;
  const checkHeaders = lenientParser();

  /**
   * The upstream failed after it began to answer (or the first of the two events that report
   * it, for the request and the response, arrived): counted once as a reset. With nothing
   * sent to the client yet it still gets a proper 502; mid-body only cutting the connection
   * tells it the answer is incomplete.
   */
  const failMidResponse = (req: ProxiedRequest, res: ServerResponse) => {
    if (!settleAsReset(req, res)) return;
    if (res.headersSent) {
      res.destroy();
      return;
    }
    for (const name of res.getHeaderNames()) if (name !== DECISION_HEADER) res.removeHeader(name);
    res.statusMessage = '';
    sendError(res, 502, 'BadGatewayError', `The upstream${rankOf(req)} closed the connection before finishing its answer.`);
  };

  /**
   * The upstream answered with something the gateway cannot relay as HTTP: the upstream
   * connection is dropped (it cannot be trusted for another request), the client gets a 502,
   * and the endpoint is counted `reset`, as for an answer cut short: the upstream broke HTTP,
   * it did not report a failure of its own (that is `status_5xx`).
   */
  const refuse = (req: ProxiedRequest, res: ServerResponse, upstreamSide: { destroy(): void }, why: string) => {
    upstreamSide.destroy();
    const route = routeOf(req)!;
    route.clearDeadlines();
    route.body = undefined;
    if (settleAsReset(req, res)) sendError(res, 502, 'BadGatewayError', `The upstream${rankOf(req)} ${why}, which the gateway cannot relay.`);
  };

  /**
   * Settles the try as a reset, counted against its endpoint; false when it was settled
   * already or the client left (a client that left is not the upstream's fault).
   */
  function settleAsReset(req: ProxiedRequest, res: ServerResponse): boolean {
    const route = routeOf(req)!;
    if (route.phase === SETTLED) return false;
    route.phase = SETTLED;
    if (clientGone(res)) return false;
    const endpoint = route.endpoint;
    if (endpoint) {
      metrics.upstreamError(endpoint, 'reset');
      detector?.failed(endpoint, 'request', req);
    }
    return true;
  }

  const handlers = {
    proxyReq(proxyReq: ClientRequest, req: ProxiedRequest, res: ServerResponse) {
      if (clientGone(res)) {
        // The client left while the proxy was being prepared: the engine must not start.
        proxyReq.destroy();
        return;
      }
      const route = routeOf(req)!;
      if (route.body !== undefined) proxyReq.write(route.body);
      armDeadlines(route, proxyReq, connectTimeoutMs, firstByteTimeoutMs);
      // Node's client hands a 101 with `Upgrade` only to an 'upgrade' listener and otherwise
      // drops the socket without an event, which would leave the client without an answer.
      proxyReq.on('upgrade', (_answer: IncomingMessage, socket: Socket) => refuse(req, res, socket, 'switched protocols unasked (101)'));
    },
    proxyRes(proxyRes: IncomingMessage, req: ProxiedRequest, res: ServerResponse) {
      // Checked before http-proxy copies status and headers, which Node's server would throw
      // on, outside any handler, taking every other request down with the process.
      const refusal = unrelayable(proxyRes, checkHeaders);
      if (refusal !== undefined) {
        refuse(req, res, proxyRes, refusal);
        return;
      }
      stripHopByHop(proxyRes.headers);
      // http-proxy would otherwise echo the client's `Connection` (stripped on the way up) or
      // default to keep-alive: the client connection's fate is what Node's server decided.
      proxyRes.headers.connection = res.shouldKeepAlive ? 'keep-alive' : 'close';
      const route = routeOf(req)!;
      route.clearDeadlines();
      route.phase = RESPONDING;
      // No retry can replay it from here on: let a long stream not pin the request's bytes.
      route.body = undefined;
      const endpoint = route.endpoint;
      if (endpoint) {
        metrics.responded(endpoint, proxyRes, route.started);
        if (proxyRes.statusCode !== undefined && proxyRes.statusCode >= 500) {
          metrics.upstreamError(endpoint, 'status_5xx');
          detector?.failed(endpoint, 'request', req);
        } else {
          // Any answer below 500, a 4xx included, shows the endpoint alive: a client's bad
          // request is never the endpoint's fault.
          detector?.succeeded(endpoint);
        }
      }
      proxyRes.on('error', () => failMidResponse(req, res));
    },
    error(error: NodeJS.ErrnoException, req: ProxiedRequest, res: ServerResponse | Socket) {
      if (!('writeHead' in res)) {
        res.destroy();
        return;
      }
      const route = routeOf(req)!;
      route.clearDeadlines();
      if (route.phase === RESPONDING) {
        failMidResponse(req, res);
        return;
      }
      if (route.phase === SETTLED) return;
      route.phase = SETTLED;
      // A client that left is not the upstream's fault, and there is no one to answer.
      if (clientGone(res)) return;
      const endpoint = route.endpoint;
      const kind = classify(error);
      if (endpoint) {
        metrics.upstreamError(endpoint, kind);
        // A first-byte timeout may be the request's own doing (a long generation); the rest never reached an answer.
        detector?.failed(endpoint, error.code === FIRST_BYTE_TIMEOUT ? 'request' : 'connection', req);
        if (retry !== undefined && !res.headersSent && mayRetry(error) && retry(req, res, endpoint)) return;
      }
      const rank = rankOf(req);
      if (kind === 'timeout') {
        const what = error.code === CONNECT_TIMEOUT ? 'accept the connection' : 'answer';
        sendError(res, 504, 'GatewayTimeoutError', `The upstream${rank} did not ${what} in time.`);
      } else if (kind === 'connect') {
        sendError(res, 502, 'BadGatewayError', `The upstream${rank} refused the connection.`);
      } else {
        sendError(res, 502, 'BadGatewayError', `The upstream${rank} closed the connection.`);
      }
    },
  };

  const handle = createProxyMiddleware<IncomingMessage, ServerResponse>({
    target: upstream.url,
    agent,
    changeOrigin: true,
    xfwd: config.xfwd !== false,
    // http-proxy-middleware's default plugins cost every request a URL parse (for its logger,
    // silent unless configured) and two listeners with closures (for `debug` output); what
    // they guard, the handlers here do: errors are answered, and a client that leaves stops
    // the upstream (RouteState.responseClosed).
    ejectPlugins: true,
    plugins: [
      (proxyServer) => {
        proxyServer.on('proxyReq', handlers.proxyReq);
        proxyServer.on('proxyRes', handlers.proxyRes);
        proxyServer.on('error', handlers.error);
      },
    ],
  });
  return {
    handle,
    close: () => {
      stopIdleSweep();
      agent.destroy();
    },
  };
}

function rankOf(req: IncomingMessage): string {
  return req.dpRank ? ` for data-parallel rank ${req.dpRank.rank}` : '';
}

/** The client closed its connection before the answer was complete. */
function clientGone(res: ServerResponse): boolean {
  return res.destroyed && !res.writableFinished;
}

function classify(error: NodeJS.ErrnoException): Exclude<UpstreamErrorKind, 'status_5xx'> {
  if (error.code === CONNECT_TIMEOUT || error.code === FIRST_BYTE_TIMEOUT || error.code === 'ETIMEDOUT') return 'timeout';
  if (error.code !== undefined && CONNECT_FAILURES.has(error.code)) return 'connect';
  return 'reset';
}

/**
 * Connection failures may be retried: refused, unreachable, connect timeout, or reset before
 * any answer. A first-byte timeout is not: the engine may still be working on it, and the
 * client has already waited the whole deadline.
 */
function mayRetry(error: NodeJS.ErrnoException): boolean {
  return error.code !== FIRST_BYTE_TIMEOUT;
}

/**
 * Connect and first-byte deadlines for one try. The response, the error handler or the
 * response's closing (`RouteState.responseClosed`) clears them.
 */
function armDeadlines(route: RouteState, proxyReq: ClientRequest, connectMs: number, firstByteMs: number): void {
  route.upstreamRequest = proxyReq;
  const socket = proxyReq.socket;
  if (socket?.connecting) {
    route.connectDeadline = setTimeout(expire, connectMs, proxyReq, CONNECT_TIMEOUT);
    socket.once('connect', () => clearTimeout(route.connectDeadline));
  }
  route.firstByteDeadline = setTimeout(expire, firstByteMs, proxyReq, FIRST_BYTE_TIMEOUT);
}

function expire(proxyReq: ClientRequest, code: string): void {
  proxyReq.destroy(timeoutError(code, code === CONNECT_TIMEOUT ? 'connect' : 'first byte'));
}

function timeoutError(code: string, what: string): NodeJS.ErrnoException {
  return Object.assign(new Error(`upstream ${what} timeout`), { code });
}
