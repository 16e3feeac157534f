import { Agent as HttpAgent, type ClientRequest, type IncomingMessage, type ServerResponse } from 'node:http';
import { Agent as HttpsAgent } from 'node:https';
import type { Socket } from 'node:net';
import { createProxyMiddleware, type RequestHandler } from 'http-proxy-middleware';
import { sendError } from './errors';
import type { RouterMetrics, UpstreamErrorKind } from './metrics';
import type { Configuration, UpstreamConfig } from './options';
import { BUFFERED_BODY, CHOSEN_ENDPOINT, type RoutedRequest } from './rank-handler';

/** One upstream's proxy and the connections it keeps. */
export interface UpstreamProxy {
  readonly handle: RequestHandler<IncomingMessage, ServerResponse>;
  close(): void;
}

const CONNECT_TIMEOUT = 'DP_ROUTER_CONNECT_TIMEOUT';
const FIRST_BYTE_TIMEOUT = 'DP_ROUTER_FIRST_BYTE_TIMEOUT';
const CONNECT_FAILURES = new Set(['ECONNREFUSED', 'EHOSTUNREACH', 'ENETUNREACH', 'ENOTFOUND', 'EAI_AGAIN', 'EADDRNOTAVAIL']);

/**
 * Idle upstream connections are dropped before uvicorn's 5 s keep-alive would close them,
 * so a request is never sent down a socket the server is closing.
 */
const IDLE_SOCKET_MS = 4_000;

/** Creates the http-proxy-middleware instance for one upstream, with a keep-alive agent. */
export function createUpstreamProxy(upstream: UpstreamConfig, config: Configuration, metrics: RouterMetrics): UpstreamProxy {
  const agentOptions = { keepAlive: true, scheduling: 'lifo' as const, timeout: IDLE_SOCKET_MS };
  // Without an agent http-proxy sends `Connection: close` and opens a socket per request.
  const agent = upstream.url.startsWith('https:') ? new HttpsAgent(agentOptions) : new HttpAgent(agentOptions);
  const { connectTimeoutMs, firstByteTimeoutMs } = config;

  const handle = createProxyMiddleware<IncomingMessage, ServerResponse>({
    target: upstream.url,
    agent,
    changeOrigin: true,
    xfwd: true,
    on: {
      proxyReq(proxyReq: ClientRequest, req: RoutedRequest, res: ServerResponse) {
        const body = req[BUFFERED_BODY];
        if (body !== undefined) proxyReq.write(body);
        armTimeouts(proxyReq, res, connectTimeoutMs, firstByteTimeoutMs);
      },
      proxyRes(proxyRes: IncomingMessage, req: RoutedRequest, res: ServerResponse) {
        const endpoint = req[CHOSEN_ENDPOINT];
        if (endpoint && proxyRes.statusCode !== undefined && proxyRes.statusCode >= 500) metrics.upstreamError(endpoint, 'status_5xx');
        proxyRes.once('error', () => {
          // The upstream died mid-response: cut the client's connection so it cannot take
          // a truncated stream for a finished one.
          if (endpoint) metrics.upstreamError(endpoint, 'reset');
          res.destroy();
        });
      },
      error(error: NodeJS.ErrnoException, req: RoutedRequest, res: ServerResponse | Socket) {
        if (!('writeHead' in res)) {
          res.destroy();
          return;
        }
        const endpoint = req[CHOSEN_ENDPOINT];
        const kind = classify(error);
        if (endpoint) metrics.upstreamError(endpoint, kind);
        const rank = req.dpRank ? ` for data-parallel rank ${req.dpRank.rank}` : '';
        if (kind === 'timeout') {
          sendError(res, 504, 'GatewayTimeoutError', `The upstream${rank} did not answer in time.`);
        } else if (kind === 'connect') {
          sendError(res, 502, 'BadGatewayError', `The upstream${rank} refused the connection.`);
        } else {
          sendError(res, 502, 'BadGatewayError', `The upstream${rank} closed the connection.`);
        }
      },
    },
  });
  return { handle, close: () => agent.destroy() };
}

function classify(error: NodeJS.ErrnoException): Exclude<UpstreamErrorKind, 'status_5xx'> {
  if (error.code === CONNECT_TIMEOUT || error.code === FIRST_BYTE_TIMEOUT || error.code === 'ETIMEDOUT') return 'timeout';
  if (error.code !== undefined && CONNECT_FAILURES.has(error.code)) return 'connect';
  return 'reset';
}

/**
 * Connect and first-byte deadlines for one exchange, and the abort of the upstream request
 * when the client leaves first (http-proxy only does that while the request body is still
 * arriving; a client that leaves during a long prefill would otherwise keep the engine busy).
 */
function armTimeouts(proxyReq: ClientRequest, res: ServerResponse, connectMs: number, firstByteMs: number): void {
  const socket = proxyReq.socket;
  let connectTimer: NodeJS.Timeout | undefined;
  if (socket?.connecting) {
    connectTimer = setTimeout(() => proxyReq.destroy(timeoutError(CONNECT_TIMEOUT, 'connect')), connectMs);
    socket.once('connect', () => clearTimeout(connectTimer));
  }
  const firstByteTimer = setTimeout(() => proxyReq.destroy(timeoutError(FIRST_BYTE_TIMEOUT, 'first byte')), firstByteMs);
  const settle = () => {
    clearTimeout(connectTimer);
    clearTimeout(firstByteTimer);
  };
  proxyReq.once('response', settle);
  proxyReq.once('close', settle);
  res.once('close', () => {
    if (!res.writableFinished) proxyReq.destroy();
  });
}

function timeoutError(code: string, what: string): NodeJS.ErrnoException {
  return Object.assign(new Error(`upstream ${what} timeout`), { code });
}
