import type { IncomingHttpHeaders } from 'node:http';

/**
 * Headers that describe one connection, not the message (RFC 9110 §7.6.1, and RFC 2616's
 * `trailer`, `proxy-authorization`, `proxy-authenticate`): a proxy must not forward them.
 * `transfer-encoding` is not among them: Node's client and server frame bodies from it, and
 * removing it from a request would send a chunked body unframed (see `protectedNames`).
 */
const HOP_BY_HOP = ['connection', 'keep-alive', 'proxy-connection', 'te', 'trailer', 'upgrade', 'proxy-authorization', 'proxy-authenticate'] as const;

/** Removes hop-by-hop headers, and those the `Connection` header nominates, in place. */
export type HopByHopStripper = (headers: IncomingHttpHeaders) => void;

/**
 * Builds the stripper once. Names in `keep` survive a `Connection` nomination: the framing
 * headers (a client naming `transfer-encoding` would otherwise make the upstream read its
 * chunked body as the next request: smuggling), `host`, and whatever the caller sets itself.
 */
export function hopByHopStripper(keep: readonly string[] = []): HopByHopStripper {
  const kept = new Set(['content-length', 'transfer-encoding', 'host', ...keep.map((name) => name.toLowerCase())]);
  return function stripHopByHop(headers) {
    const connection = headers.connection;
    // `keep-alive` and `close` alone are the usual values: nothing else is nominated.
    if (connection !== undefined && connection !== 'keep-alive' && connection !== 'close') {
      for (const name of nominated(connection)) if (!kept.has(name) && headers[name] !== undefined) delete headers[name];
    }
    // `delete` always takes V8's slow path, so only where there is something to remove.
    for (const name of HOP_BY_HOP) if (headers[name] !== undefined) delete headers[name];
  };
}

/** The header names a `Connection` value lists, lower-cased (Node joins repeated lines with ', '). */
export function nominated(connection: string): string[] {
  const names: string[] = [];
  for (const token of connection.split(',')) {
    const name = token.trim().toLowerCase();
    if (name !== '') names.push(name);
  }
  return names;
}

/**
 * A `Connection` value without `name` among its options, or `undefined` when nothing is left;
 * returned as given when `name` is not nominated, so the common case allocates nothing.
 */
export function withoutNomination(connection: string, name: string): string | undefined {
  const lower = name.toLowerCase();
  if (!connection.toLowerCase().includes(lower)) return connection;
  const left = connection.split(',').filter((token) => token.trim().toLowerCase() !== lower);
  return left.length === 0 ? undefined : left.join(',').trim();
}
