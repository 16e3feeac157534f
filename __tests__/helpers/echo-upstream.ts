import { afterEach } from '@jest/globals';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { closedAfterEach } from './lifecycle';
import { closerOf } from './raw-http';

/** What the echo upstream saw of one request. */
export interface SeenRequest {
  method: string;
  url: string;
  /** Every raw line of the rank header, in order. */
  rankHeaders: string[];
  headers: IncomingMessage['headers'];
  body: Buffer;
}

export interface EchoUpstream {
  url: string;
  seen: SeenRequest[];
  /** Replaces the default JSON echo for the next requests. */
  respond: ((req: IncomingMessage, res: ServerResponse, body: Buffer) => void) | undefined;
  close(): Promise<void>;
}

/** A real upstream on 127.0.0.1:0 that records every request and answers with what it saw. */
export async function startEchoUpstream(): Promise<EchoUpstream> {
  const upstream: EchoUpstream = { url: '', seen: [], respond: undefined, close: async () => undefined };
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      const rankHeaders: string[] = [];
      for (let index = 0; index < req.rawHeaders.length; index += 2) {
        if (req.rawHeaders[index].toLowerCase() === 'x-data-parallel-rank') rankHeaders.push(req.rawHeaders[index + 1]);
      }
      upstream.seen.push({ method: req.method ?? '', url: req.url ?? '', rankHeaders, headers: req.headers, body });
      if (upstream.respond) {
        upstream.respond(req, res, body);
        return;
      }
      const payload = JSON.stringify({ url: req.url, rankHeaders, bodyBytes: body.length });
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(payload);
    });
  });
  upstream.close = closerOf(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  upstream.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return upstream;
}

/** Gives a test file an `echo()` that starts an echo upstream, closed again after each test. */
export function echoUpstreams(): () => Promise<EchoUpstream> {
  const started = closedAfterEach();
  return async () => {
    const upstream = await startEchoUpstream();
    started.push(upstream);
    return upstream;
  };
}
