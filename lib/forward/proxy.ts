import { Agent as HttpAgent, type ClientRequest, type IncomingMessage, type ServerResponse } from 'node:http';
import { Agent as HttpsAgent } from 'node:https';
import type { Socket } from 'node:net';
import { createProxyMiddleware } from 'http-proxy-middleware';
import { hopByHopStripper } from '../http/hop-by-hop';
import { closeIdleSockets } from './idle-sockets';
import { DeadlineList } from '../http/deadline-list';
import type { UpstreamConfig } from '../upstreams/upstream-options';
import type { TimeoutConfig } from '../http/timeout-options';
import type { RetryConfig } from './retry-options';
import { CONNECT_TIMEOUT, FIRST_BYTE_TIMEOUT, type RouteState, type RoutedRequest, type TryKeeper } from '../request/route-state';
import { lenientParser, unrelayable } from './upstream-response';
import { carrierOf } from '../http/response-carrier';

/** One upstream's proxy and the connections it keeps. */
export interface UpstreamProxy {
  /** Sends one try of the request, whose state `route` is: the proxy's reports of it carry `route` back. */
  send(req: RoutedRequest, res: ServerResponse, next: (error?: unknown) => void, route: RouteState): void;
  /** Tries whose response has not closed yet (each is kept until then). */
  readonly keeping: number;
  close(): void;
}

/** How a try failed before any answer, as the connection showed it. */
export type TryFailure = 'refused' | 'connect_timeout' | 'timeout' | 'first_byte_timeout' | 'reset';

/**
 * What the proxy reports of each try, with the state it was handed. It only relays; what
 * follows (counting, outlier detection, a retry, the error answer) is the forwarder's to decide.
 */
export interface TryOutcomes {
  /** The upstream began an answer the gateway can relay; it is relayed once this returns. */
  answered(route: RouteState, req: RoutedRequest, res: ServerResponse, answer: IncomingMessage): void;
  /** The try failed (before any answer, or while answering: the phase tells). */
  failed(route: RouteState, req: RoutedRequest, res: ServerResponse, failure: TryFailure): void;
  /** The upstream's answer broke off. */
  cutShort(route: RouteState, req: RoutedRequest, res: ServerResponse): void;
  /** The upstream answered with something the gateway cannot relay (the connection is dropped). */
  refused(route: RouteState, req: RoutedRequest, res: ServerResponse, why: string): void;
}

const CONNECT_FAILURES = new Set(['ECONNREFUSED', 'EHOSTUNREACH', 'ENETUNREACH', 'ENOTFOUND', 'EAI_AGAIN', 'EADDRNOTAVAIL']);

/**
 * Idle upstream connections are dropped before uvicorn's 5 s keep-alive would close them,
 * so a request is never sent down a socket the server is closing.
 */
const IDLE_SOCKET_MS = 4_000;
/**
 * An upstream answer's hop-by-hop headers describe the upstream connection, not the client's;
 * `Connection` is set anew. Unset, not deleted: a Node upstream's `Keep-Alive: timeout=5`, deleted
 * from every answer, left each one's headers in dictionary mode for http-proxy to copy.
 */
const stripHopByHop = hopByHopStripper([], 'any', 'unset');

/** The options a proxy reads (the router's `Configuration` is one). */
export interface ProxyConfig {
  readonly timeouts: TimeoutConfig;
  readonly retries: RetryConfig;
}

/** Creates the http-proxy-middleware instance for one upstream, with a keep-alive agent; each try's outcome goes to `outcomes`. */
export function createUpstreamProxy(upstream: UpstreamConfig, config: ProxyConfig, outcomes: TryOutcomes): UpstreamProxy {
  const agentOptions = { keepAlive: true, scheduling: 'lifo' as const };
  // Without an agent http-proxy sends `Connection: close` and opens a socket per request.
  const agent = upstream.url.startsWith('https:') ? new HttpsAgent(agentOptions) : new HttpAgent(agentOptions);
  const stopIdleSweep = closeIdleSockets(agent, IDLE_SOCKET_MS);
  const { connectMs: connectTimeoutMs, firstByteMs: firstByteTimeoutMs } = config.timeouts;
  const { attempts } = config.retries;
  const checkHeaders = lenientParser();
  const firstBytes = new DeadlineList<RouteState>(firstByteTimeoutMs, (route) => route.firstByteExpired());
  // http-proxy's events carry only `req` and `res`: each try's state rides on its response,
  // under this proxy's own key (a late event of a try a retry moved elsewhere finds nothing),
  // from `send` until the response closes (RouteState.closed) or a retry takes the request to
  // another proxy. Not a WeakMap: V8's young-generation collector keeps a WeakMap's values
  // alive. Not a Map either: as requests come and go its table is rehashed, and a table left
  // in the old generation still points at the requests in flight then, so each scavenge until
  // the next full collection copied and promoted them with all they reach (promoted per
  // request: 14.5 KB with a Map, 9.7 KB on the response; a plain proxy 7.9 KB).
  const tryOf = Symbol('dp-router try');
  let kept = 0;
  const keeper: TryKeeper = {
    forget: (route) => {
      untagUpstream(route);
      const carrier = route.carrier as TryCarrier | undefined;
      if (carrier === undefined || carrier[tryOf] === undefined) return;
      carrier[tryOf] = undefined;
      kept--;
    },
  };

  const refuse = (route: RouteState, req: RoutedRequest, res: ServerResponse, upstreamSide: { destroy(): void }, why: string) => {
    // The upstream connection cannot be trusted for another request.
    upstreamSide.destroy();
    outcomes.refused(route, req, res, why);
  };

  const handlers = {
    proxyReq(proxyReq: ClientRequest, req: RoutedRequest, res: ServerResponse) {
      if (clientGone(res)) {
        // The client left while the proxy was being prepared: the engine must not start.
        proxyReq.destroy();
        return;
      }
      const route = (carrierOf(res) as TryCarrier)[tryOf];
      if (route === undefined) {
        // The response closed before the upstream connection was there.
        proxyReq.destroy();
        return;
      }
      // The answer finds its try on the upstream request (a stable object), not on the response;
      // an earlier try of this request through the same proxy (a retry) leads to it no more.
      untagUpstream(route);
      (proxyReq as TaggedRequest)[TRY] = route;
      if (route.body !== undefined) proxyReq.write(route.body);
      else if (route.bodyHead !== undefined) proxyReq.write(route.bodyHead);
      route.armDeadlines(proxyReq, connectTimeoutMs, firstBytes, attempts);
      // Node's client hands a 101 with `Upgrade` only to an 'upgrade' listener and otherwise
      // drops the socket without an event, which would leave the client without an answer.
      proxyReq.on('upgrade', (_answer: IncomingMessage, socket: Socket) => refuse(route, req, res, socket, 'switched protocols unasked (101)'));
    },
    proxyRes(proxyRes: IncomingMessage, req: RoutedRequest, res: ServerResponse) {
      // Checked before http-proxy copies status and headers, which Node's server would throw
      // on, outside any handler, taking every other request down with the process.
      const route = (proxyRes as AnswerOf).req?.[TRY];
      // The response closed already (its upstream request is being destroyed): nothing to relay.
      if (route === undefined) return;
      const refusal = unrelayable(proxyRes, checkHeaders);
      if (refusal !== undefined) {
        refuse(route, req, res, proxyRes, refusal);
        return;
      }
      stripHopByHop(proxyRes.headers);
      // http-proxy would otherwise echo the client's `Connection` (stripped on the way up) or
      // default to keep-alive: the client connection's fate is what Node's server decided.
      proxyRes.headers.connection = res.shouldKeepAlive ? 'keep-alive' : 'close';
      outcomes.answered(route, req, res, proxyRes);
      proxyRes.on('error', () => outcomes.cutShort(route, req, res));
    },
    error(error: NodeJS.ErrnoException, req: RoutedRequest, res: ServerResponse | Socket) {
      if (!('writeHead' in res)) {
        res.destroy();
        return;
      }
      const route = (carrierOf(res) as TryCarrier)[tryOf];
      // After the response closed, the failure is the echo of its upstream request's end.
      if (route !== undefined) outcomes.failed(route, req, res, classify(error));
    },
  };

  const handle = createProxyMiddleware<IncomingMessage, ServerResponse>({
    target: upstream.url,
    agent,
    changeOrigin: true,
    // X-Forwarded-* are the forwarder's, set once per request (forwarded-headers.ts).
    xfwd: false,
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
    send(req, res, next, route) {
      // The response closed: nothing would forget a try kept now. (Known from the route, which
      // watches the close: a read of `res.destroyed` misses V8's caches. A client that left but
      // whose close is still to come is found when the upstream connection is there.)
      if (route.responseClosed) return;
      // A retry: the proxy of the failed try no longer keeps it. (Not found by reading the key:
      // a miss walks the response's prototype chain, which Express makes anew per app.)
      if (route.sentVia !== keeper) {
        route.sentVia?.forget(route);
        route.sentVia = keeper;
        kept++;
      }
      const carrier = (route.carrier ??= carrierOf(res)) as TryCarrier;
      carrier[tryOf] = route;
      void handle(req, res, next);
    },
    get keeping() {
      return kept;
    },
    close: () => {
      stopIdleSweep();
      firstBytes.close();
      agent.destroy();
    },
  };
}

/** Where a response carries its tries: one key per proxy. */
type TryCarrier = Record<symbol, RouteState | undefined>;

/** An upstream request, with the try it belongs to (until the response closes or a retry moves on). */
type TaggedRequest = ClientRequest & { [TRY]?: RouteState };
/** An upstream answer: Node links it to its request (`res.req`), which @types/node does not declare. */
type AnswerOf = IncomingMessage & { req?: TaggedRequest };
const TRY = Symbol('dp-router try');

/** The route's current upstream request no longer leads to it: a late answer to it finds nothing. */
function untagUpstream(route: RouteState): void {
  const sent = route.upstreamRequest as TaggedRequest | undefined;
  if (sent !== undefined) sent[TRY] = undefined;
}

/** The client closed its connection before the answer was complete. */
export function clientGone(res: ServerResponse): boolean {
  return res.destroyed && !res.writableFinished;
}

function classify(error: NodeJS.ErrnoException): TryFailure {
  if (error.code === CONNECT_TIMEOUT) return 'connect_timeout';
  if (error.code === FIRST_BYTE_TIMEOUT) return 'first_byte_timeout';
  if (error.code === 'ETIMEDOUT') return 'timeout';
  if (error.code !== undefined && CONNECT_FAILURES.has(error.code)) return 'refused';
  return 'reset';
}
