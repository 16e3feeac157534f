import type { IncomingHttpHeaders } from 'node:http';
import type { Socket } from 'node:net';

/** What a client claims about earlier hops; `xfwd: true` replaces it with the gateway's own view. */
const FORWARDED = ['forwarded', 'x-forwarded-for', 'x-forwarded-host', 'x-forwarded-port', 'x-forwarded-proto'] as const;

const PORT = /:(\d+)/;

/**
 * `X-Forwarded-For`, `-Port`, `-Proto` and `-Host`, as http-proxy's `xfwd` sets them (the peer's
 * address, the port named in `Host` or the protocol's default, the protocol; the values a proxy
 * in front sent are appended to, its `X-Forwarded-Host` kept), set once per request in the
 * headers read already: http-proxy's own pass reads six properties of `req` on every try, each
 * a lookup V8 cannot cache under Express 5 (about 50,000 instructions a request), and appends
 * again on a retry. `host`: the request's `Host`. `replace` first drops what the client sent,
 * `Forwarded` included.
 */
export function setForwardedHeaders(headers: IncomingHttpHeaders, host: string | undefined, socket: Socket | null, replace: boolean): void {
  if (replace) for (const name of FORWARDED) if (headers[name] !== undefined) delete headers[name];
  const encrypted = (socket as { encrypted?: boolean } | null)?.encrypted === true;
  const address = socket?.remoteAddress;
  if (address !== undefined) append(headers, 'x-forwarded-for', address);
  append(headers, 'x-forwarded-port', (host === undefined ? undefined : PORT.exec(host)?.[1]) ?? (encrypted ? '443' : '80'));
  append(headers, 'x-forwarded-proto', encrypted ? 'https' : 'http');
  if (headers['x-forwarded-host'] === undefined || headers['x-forwarded-host'] === '') headers['x-forwarded-host'] = host ?? '';
}

function append(headers: IncomingHttpHeaders, name: 'x-forwarded-for' | 'x-forwarded-port' | 'x-forwarded-proto', value: string): void {
  const sent = headers[name];
  headers[name] = sent === undefined || sent === '' ? value : `${sent},${value}`;
}
