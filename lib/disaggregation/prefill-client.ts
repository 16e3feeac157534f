import { Agent as HttpAgent, request as httpRequest, type ClientRequest, type IncomingMessage, type OutgoingHttpHeaders } from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import type { TryFailure } from '../forward/proxy';
import { closeIdleSockets } from '../forward/idle-sockets';
import type { UpstreamConfig } from '../upstreams/upstream-options';

/** What one prefill try came to: an answer read whole, or a failure as the proxy classifies them. */
export type PrefillResult =
  | { readonly ok: true; readonly status: number; readonly body: Buffer }
  | { readonly ok: false; readonly failure: TryFailure | 'too_large' };

/** One prefill try in flight. */
export interface PrefillCall {
  readonly result: Promise<PrefillResult>;
  /** Stops it (the client left): the engine sees the connection close and aborts the request. */
  abort(): void;
}

/** A prefill answer is one token and the transfer parameters (block ids: a few hundred KiB for a long prompt). */
const MAX_ANSWER_BYTES = 8 * 1024 * 1024;
/** As the proxy's agents: idle connections dropped before uvicorn's 5 s keep-alive closes them. */
const IDLE_SOCKET_MS = 4_000;
const CONNECT_FAILURES = new Set(['ECONNREFUSED', 'EHOSTUNREACH', 'ENETUNREACH', 'ENOTFOUND', 'EAI_AGAIN', 'EADDRNOTAVAIL']);

/**
 * The prefill leg's HTTP client for one upstream: a plain node:http request on a keep-alive
 * agent (the answer is small JSON that is read, never relayed, so http-proxy has nothing to do
 * here), bounded by `timeouts.connectMs` and, until the answer is read, `timeouts.firstByteMs`.
 */
export class PrefillClient {
  private readonly agent: HttpAgent;
  private readonly stopSweep: () => void;
  private readonly send: typeof httpRequest;
  private readonly base: URL;

  constructor(
    upstream: UpstreamConfig,
    private readonly connectMs: number,
    private readonly firstByteMs: number,
  ) {
    const https = upstream.url.startsWith('https:');
    const options = { keepAlive: true, scheduling: 'lifo' as const };
    this.agent = https ? new HttpsAgent(options) : new HttpAgent(options);
    this.send = https ? httpsRequest : httpRequest;
    this.stopSweep = closeIdleSockets(this.agent, IDLE_SOCKET_MS);
    this.base = new URL(upstream.url);
  }

  /** POSTs `body` to `path` (the client's path, kept under the upstream's base path). */
  post(path: string, headers: OutgoingHttpHeaders, body: Buffer): PrefillCall {
    const base = this.base;
    let request: ClientRequest | undefined;
    let settle!: (result: PrefillResult) => void;
    const result = new Promise<PrefillResult>((resolve) => (settle = resolve));
    let done = false;
    const finish = (outcome: PrefillResult) => {
      if (done) return;
      done = true;
      clearTimeout(connectTimer);
      clearTimeout(answerTimer);
      settle(outcome);
    };
    const fail = (failure: TryFailure | 'too_large') => {
      finish({ ok: false, failure });
      request?.destroy();
    };
    let connectTimer: NodeJS.Timeout | undefined;
    const answerTimer = setTimeout(fail, this.firstByteMs, 'first_byte_timeout');
    request = this.send({
      protocol: base.protocol,
      hostname: base.hostname.replace(/^\[|\]$/g, ''),
      port: base.port,
      method: 'POST',
      path: base.pathname.replace(/\/$/, '') + path,
      agent: this.agent,
      headers: { ...headers, host: base.host, 'content-length': body.length },
    });
    request.on('socket', (socket) => {
      if (!socket.connecting) return;
      connectTimer = setTimeout(fail, this.connectMs, 'connect_timeout');
      socket.once('connect', () => clearTimeout(connectTimer));
    });
    request.on('error', (error: NodeJS.ErrnoException) => {
      if (error.code === 'ETIMEDOUT') fail('timeout');
      else fail(error.code !== undefined && CONNECT_FAILURES.has(error.code) ? 'refused' : 'reset');
    });
    request.on('response', (answer: IncomingMessage) => readAnswer(answer, finish, fail));
    request.end(body);
    return {
      result,
      abort: () => {
        if (done) return;
        done = true;
        clearTimeout(connectTimer);
        clearTimeout(answerTimer);
        request?.destroy();
        settle({ ok: false, failure: 'reset' });
      },
    };
  }

  /** Drops its connections. */
  close(): void {
    this.stopSweep();
    this.agent.destroy();
  }
}

function readAnswer(answer: IncomingMessage, finish: (result: PrefillResult) => void, fail: (failure: 'reset' | 'too_large') => void): void {
  const chunks: Buffer[] = [];
  let size = 0;
  answer.on('data', (chunk: Buffer) => {
    size += chunk.length;
    if (size > MAX_ANSWER_BYTES) fail('too_large');
    else chunks.push(chunk);
  });
  answer.on('error', () => fail('reset'));
  answer.on('aborted', () => fail('reset'));
  answer.on('end', () => {
    if (!answer.complete) fail('reset');
    else finish({ ok: true, status: answer.statusCode ?? 0, body: Buffer.concat(chunks, size) });
  });
}
