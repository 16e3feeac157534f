import { createServer, request, type IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';

/** What a relay does to one request on its way: its headers (changed in place) and whole body (returned, changed or not). */
export type Rewrite = (path: string, headers: IncomingHttpHeaders, body: Buffer) => Buffer;

/**
 * An HTTP relay on 127.0.0.1:0 in front of `target`, as a proxy between a gateway and vLLM: each
 * request is read whole, passed through `rewrite`, and sent on; the answer streams back as it
 * comes, chunk by chunk. (The route receipts' tests and `bench:receipts` put one between the
 * gateway and the mock.)
 */
export async function startRelay(target: string, rewrite: Rewrite): Promise<{ url: string; close(): Promise<void> }> {
  const { hostname, port } = new URL(target);
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      const headers = { ...req.headers };
      const body = rewrite(req.url ?? '/', headers, Buffer.concat(chunks));
      if (headers['content-length'] !== undefined) headers['content-length'] = String(body.length);
      const out = request({ host: hostname.replace(/^\[|\]$/g, ''), port, method: req.method, path: req.url, headers }, (answer) => {
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(res);
      });
      out.on('error', () => res.destroy());
      out.end(body);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** A relay that removes one header from every request (a proxy configured to drop unknown headers). */
export function stripping(header: string): Rewrite {
  return (_path, headers, body) => {
    delete headers[header.toLowerCase()];
    return body;
  };
}

/** A relay that, while `on()`, puts `line` before the first message of every chat: the engine's chat template changed, the router's did not. */
export function drifting(on: () => boolean, line = 'Today is Tuesday. '): Rewrite {
  return (path, _headers, body) => {
    if (!on() || !path.startsWith('/v1/chat/completions')) return body;
    const parsed = JSON.parse(body.toString()) as { messages: Array<{ content: string }> };
    parsed.messages[0].content = `${line}${parsed.messages[0].content}`;
    return Buffer.from(JSON.stringify(parsed));
  };
}
