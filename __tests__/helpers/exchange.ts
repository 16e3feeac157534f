import { request as httpRequest, type IncomingHttpHeaders } from 'node:http';

/** One exchange as a client sees it: status (0 when the connection failed), body, and how it ended. */
export interface Exchange {
  status: number;
  headers: IncomingHttpHeaders;
  body: string;
  /** `end` when the body completed, `error` when the connection was cut. */
  ending: 'end' | 'error';
}

/** Sends one request on a fresh connection and collects whatever comes back, never rejecting. */
export function exchange(
  url: string,
  options: {
    method?: string;
    path?: string;
    headers?: Record<string, string | string[]>;
    body?: string | Buffer;
    /** The client's own address, e.g. `127.0.0.2`: a distinct client on loopback. */
    localAddress?: string;
  } = {},
): Promise<Exchange> {
  return new Promise((resolve) => {
    const outgoing = httpRequest(`${url}${options.path ?? '/v1/completions'}`, {
      method: options.method ?? 'POST',
      agent: false,
      localAddress: options.localAddress,
      headers: { 'content-type': 'application/json', ...options.headers },
    });
    outgoing.on('response', (response) => {
      let body = '';
      response.setEncoding('utf8');
      response.on('data', (chunk: string) => (body += chunk));
      response.on('end', () => resolve({ status: response.statusCode ?? 0, headers: response.headers, body, ending: 'end' }));
      response.on('error', () => resolve({ status: response.statusCode ?? 0, headers: response.headers, body, ending: 'error' }));
    });
    outgoing.on('error', () => resolve({ status: 0, headers: {}, body: '', ending: 'error' }));
    outgoing.end(options.body ?? '{"model":"mock-model","prompt":"hi","max_tokens":2}');
  });
}
