import { request, type IncomingHttpHeaders } from 'node:http';
import { serve } from './app';

/** What a relay does to one request on its way: its headers and whole body, changed in place or replaced. */
export type Rewrite = (path: string, headers: IncomingHttpHeaders, body: Buffer) => Buffer;

/**
 * An HTTP relay on 127.0.0.1:0 in front of `target`, as a proxy between a gateway and vLLM: each
 * request is read whole, passed through `rewrite`, and sent on; the answer streams back as it
 * comes, chunk by chunk.
 */
export async function startRelay(target: string, rewrite: Rewrite): Promise<{ url: string; close(): Promise<void> }> {
  const { hostname, port } = new URL(target);
  return serve((req, res) => {
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
}

/** A relay that removes one header from every request (a proxy configured to drop unknown headers). */
export function stripping(header: string): Rewrite {
  return (_path, headers, body) => {
    delete headers[header.toLowerCase()];
    return body;
  };
}
