import { request as httpRequest, type IncomingHttpHeaders } from 'node:http';
import { startMockVllm, type MockVllm, type MockVllmOptions } from '../../example-server/mock-vllm';
import { afterEach } from '@jest/globals';
import type { TestGateway } from '../helpers/app';
import { startEchoUpstream, type EchoUpstream } from '../helpers/echo-upstream';

/** Polls `condition` every 10 ms until it holds; throws after `timeoutMs`. */
export async function waitFor(condition: () => boolean | Promise<boolean>, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await sleep(10);
  }
}

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

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

/** A mock vLLM that can be killed and brought back on the same port. */
export interface RestartableVllm {
  readonly url: string;
  readonly current: MockVllm | undefined;
  kill(): Promise<void>;
  restart(): Promise<void>;
  close(): Promise<void>;
}

export async function startRestartableVllm(options: MockVllmOptions = {}): Promise<RestartableVllm> {
  let mock: MockVllm | undefined = await startMockVllm(options);
  const port = mock.port;
  return {
    url: mock.url,
    get current() {
      return mock;
    },
    async kill() {
      await mock?.close();
      mock = undefined;
    },
    async restart() {
      mock = await startMockVllm({ ...options, port });
    },
    async close() {
      await mock?.close();
      mock = undefined;
    },
  };
}

/** Every endpoint's in-flight count is back to 0. */
export function allIdle(gateway: TestGateway): boolean {
  return gateway.router.endpoints().every((endpoint) => endpoint.inflight === 0);
}

/** Gives a test file an `echo()` that starts an echo upstream, closed again after each test. */
export function echoUpstreams(): () => Promise<EchoUpstream> {
  const started: EchoUpstream[] = [];
  afterEach(async () => {
    await Promise.all(started.splice(0).map((upstream) => upstream.close()));
  });
  return async () => {
    const upstream = await startEchoUpstream();
    started.push(upstream);
    return upstream;
  };
}
