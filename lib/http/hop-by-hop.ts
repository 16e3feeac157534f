import type { IncomingHttpHeaders } from 'node:http';

/**
 * Removes hop-by-hop headers, and those the `Connection` header nominates, in place. Hop-by-hop
 * headers describe one connection, not the message (RFC 9110 §7.6.1, and RFC 2616's `trailer`,
 * `proxy-authorization`, `proxy-authenticate`): a proxy must not forward them:
 * `connection`, `keep-alive`, `proxy-connection`, `te`, `trailer`, `upgrade`,
 * `proxy-authorization`, `proxy-authenticate`. `transfer-encoding` is not among them: Node's
 * client and server frame bodies from it, and removing it from a request would send a chunked
 * body unframed (see `kept`).
 */
export type HopByHopStripper = (headers: IncomingHttpHeaders) => void;

/**
 * Which `Connection` header a stripper leaves in place instead of deleting it: `delete` leaves
 * the headers object in V8's dictionary mode, which every later access pays for (http-proxy
 * copies each header). `'keep-alive'`: exactly the value Node's keep-alive agent sends when
 * the header is absent, so leaving it changes nothing upstream. `'any'`: the caller sets the
 * header itself right after. What it nominates is removed either way.
 */
export type ConnectionLeft = 'none' | 'keep-alive' | 'any';

/**
 * How a header is removed: `'delete'`, or `'unset'` (set to `undefined`, which keeps the object
 * out of dictionary mode). `'unset'` is for an upstream answer's headers only: http-proxy skips
 * an undefined value when it copies them, where Node's client throws on one in a request.
 */
export type HeaderRemoval = 'delete' | 'unset';

/**
 * Builds the stripper once. Names in `keep` survive a `Connection` nomination: the framing
 * headers (a client naming `transfer-encoding` would otherwise make the upstream read its
 * chunked body as the next request: smuggling), `host`, and whatever the caller sets itself.
 */
export function hopByHopStripper(keep: readonly string[] = [], left: ConnectionLeft = 'none', removal: HeaderRemoval = 'delete'): HopByHopStripper {
  const kept = new Set(['content-length', 'transfer-encoding', 'host', ...keep.map((name) => name.toLowerCase())]);
  const drop = removal === 'unset' ? unset : remove;
  return function stripHopByHop(headers) {
    const connection = headers.connection;
    if (connection !== undefined) {
      // `keep-alive` and `close` alone are the usual values: nothing else is nominated.
      if (connection !== 'keep-alive' && connection !== 'close') {
        for (const name of nominated(connection)) if (!kept.has(name) && headers[name] !== undefined) drop(headers, name);
      }
      if (left === 'none' || (left === 'keep-alive' && connection !== 'keep-alive')) drop(headers, 'connection');
    }
    // `delete` always takes V8's slow path, so only where there is something to remove. Named
    // reads (not a loop over the names) stay monomorphic on the usual header shapes.
    if (headers['keep-alive'] !== undefined) drop(headers, 'keep-alive');
    if (headers['proxy-connection'] !== undefined) drop(headers, 'proxy-connection');
    if (headers.te !== undefined) drop(headers, 'te');
    if (headers.trailer !== undefined) drop(headers, 'trailer');
    if (headers.upgrade !== undefined) drop(headers, 'upgrade');
    if (headers['proxy-authorization'] !== undefined) drop(headers, 'proxy-authorization');
    if (headers['proxy-authenticate'] !== undefined) drop(headers, 'proxy-authenticate');
  };
}

/**
 * The one filter every request leg goes through on its way to an upstream (the forwarder's
 * request, and the prefill leg with `disaggregation`): hop-by-hop headers and what `Connection`
 * nominates go, the router's own rank header (`rankHeader`, set already) stays, and a
 * `Connection: keep-alive` is left for the agent, which sends that anyway.
 */
export function upstreamRequestStripper(rankHeader: string): HopByHopStripper {
  return hopByHopStripper([rankHeader], 'keep-alive');
}

/** Whether a request asks to upgrade to WebSocket, which the gateway does not proxy (answered 501 before anything is stripped). */
export function isWebSocketUpgrade(headers: IncomingHttpHeaders): boolean {
  return headers.upgrade !== undefined && WEBSOCKET.test(headers.upgrade);
}

const WEBSOCKET = /(?:^|[\s,])websocket(?:$|[\s,/])/i;

function remove(headers: IncomingHttpHeaders, name: string): void {
  delete headers[name];
}

function unset(headers: IncomingHttpHeaders, name: string): void {
  headers[name] = undefined;
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
