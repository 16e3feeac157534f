import { request as httpRequest, type ClientRequest, type IncomingMessage, type OutgoingHttpHeaders } from 'node:http';
import { request as httpsRequest } from 'node:https';

/**
 * The router's one client for its own small requests to upstreams (not the proxied traffic):
 * the engine watch's `/metrics` and `/v1/models` scrapes, the health probes and the tokenizer
 * agreement's `/tokenize`. An upstream may be hostile or broken, so every exchange has one
 * deadline from sending to the answer's last byte (an answer trickled a byte at a time cannot
 * hold it longer), a bound on the bytes kept, and one error type whatever went wrong.
 */

/** What went wrong: an unwanted status, the deadline, an answer too large or cut short, the connection, or the caller's abort. */
export type SmallHttpFailure = 'status' | 'timeout' | 'too-large' | 'cut-short' | 'network' | 'aborted';

/** Why an exchange gave no answer; `message` names the URL. */
export class SmallHttpError extends Error {
  constructor(
    readonly failure: SmallHttpFailure,
    message: string,
    /** The status, for `'status'`. */
    readonly status?: number,
  ) {
    super(message);
    this.name = 'SmallHttpError';
  }
}

/** One small request. */
export interface SmallRequest {
  /** Default: `'GET'`. */
  readonly method?: 'GET' | 'POST';
  readonly headers?: OutgoingHttpHeaders;
  /** Sent whole, with its `Content-Length`. */
  readonly body?: string;
  /** The whole exchange's deadline, in ms: connecting, sending, and reading the answer to its end. */
  readonly deadlineMs: number;
  /** Largest answer body kept; a longer one fails `'too-large'`. */
  readonly maxBytes: number;
  /** The answer body is read to its end and dropped, whatever its size (the deadline bounds it): a probe wants the status alone. */
  readonly drain?: boolean;
  /**
   * `'fresh'`: a connection of its own, closed after the answer, so that a server that stopped
   * accepting connections fails (a health probe). Default `'pooled'`: Node's global agent.
   */
  readonly connection?: 'fresh' | 'pooled';
  /** The statuses that are an answer; any other fails `'status'` as soon as the head arrives. Default: 200 alone. */
  readonly accept?: (status: number) => boolean;
  /** Aborting it fails the exchange `'aborted'` and closes its connection. */
  readonly signal?: AbortSignal;
}

/** An answer, read to its end. */
export interface SmallResponse {
  readonly status: number;
  /** Empty when drained. */
  readonly body: Buffer;
}

const only200 = (status: number) => status === 200;
const EMPTY = Buffer.alloc(0);

/** Sends one small request; resolves with the whole answer, or rejects with a {@link SmallHttpError}. Never throws. */
export function smallRequest(url: string | URL, options: SmallRequest): Promise<SmallResponse> {
  return new Promise((resolve, reject) => {
    const shown = String(url);
    const { deadlineMs, maxBytes, signal } = options;
    const accept = options.accept ?? only200;
    let outgoing: ClientRequest | undefined;
    let settled = false;
    const finish = (error: SmallHttpError | undefined, answer?: SmallResponse) => {
      if (settled) return;
      settled = true;
      clearTimeout(deadline);
      signal?.removeEventListener('abort', aborted);
      if (error === undefined) {
        resolve(answer!);
        return;
      }
      // Whatever is left of the exchange is of no use, and its socket cannot be trusted.
      outgoing?.destroy();
      reject(error);
    };
    const fail = (failure: SmallHttpFailure, message: string, status?: number) => finish(new SmallHttpError(failure, message, status));
    const aborted = () => fail('aborted', `${shown}: the request was aborted`);
    const deadline = setTimeout(() => fail('timeout', `${shown} did not answer within ${deadlineMs} ms`), deadlineMs);
    deadline.unref();
    if (signal?.aborted) {
      aborted();
      return;
    }
    signal?.addEventListener('abort', aborted, { once: true });

    const fresh = options.connection === 'fresh';
    const headers: OutgoingHttpHeaders = { ...options.headers };
    if (fresh) headers.connection = 'close';
    if (options.body !== undefined) headers['content-length'] = Buffer.byteLength(options.body);
    const send = shown.startsWith('https:') ? httpsRequest : httpRequest;
    try {
      outgoing = send(url, { method: options.method ?? 'GET', headers, ...(fresh && { agent: false }) });
    } catch (error) {
      fail('network', `${shown}: ${(error as Error).message}`);
      return;
    }
    outgoing.on('error', (error) => fail('network', `${shown}: ${error.message}`));
    outgoing.on('response', (response: IncomingMessage) => {
      const status = response.statusCode ?? 0;
      if (!accept(status)) {
        fail('status', `${shown} answered ${status}`, status);
        return;
      }
      read(response, status);
    });
    outgoing.end(options.body);

    const read = (response: IncomingMessage, status: number) => {
      const chunks: Buffer[] = [];
      let size = 0;
      response.on('data', (chunk: Buffer) => {
        if (options.drain) return;
        size += chunk.length;
        if (size > maxBytes) fail('too-large', `${shown} sent more than ${maxBytes} bytes`);
        else chunks.push(chunk);
      });
      response.on('end', () => finish(undefined, { status, body: options.drain ? EMPTY : Buffer.concat(chunks, size) }));
      response.on('error', () => fail('cut-short', `${shown} cut its answer short`));
      // Closed before its end: the server went away mid-answer.
      response.on('close', () => fail('cut-short', `${shown} cut its answer short`));
    };
  });
}
