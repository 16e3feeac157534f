/**
 * Who a piece of evidence came from (CONTRACT.md, "Evidence that changes routing for
 * everyone"): the request's tenant as admission resolves it, else its credentials, else its
 * address. Credentials are kept only as a keyed hash (the key is the process's own, random),
 * so no source names a secret, in memory, logs or metrics.
 */
import { createHmac, randomBytes } from 'node:crypto';
import type { IncomingHttpHeaders, IncomingMessage } from 'node:http';
import { isIPv4 } from 'node:net';

const KEY = randomBytes(32);

/** The credential headers a source is told apart by. */
const CREDENTIALS = ['authorization', 'x-api-key'] as const;

/** The request's credentials as the upstream would read them, or `undefined` without any. */
function credentialsOf(headers: IncomingHttpHeaders): string | undefined {
  let seen: string | undefined;
  for (const name of CREDENTIALS) {
    const value = headers[name];
    if (value === undefined) continue;
    seen = `${seen ?? ''}${name}\n${Array.isArray(value) ? value.join('\n') : value}\n`;
  }
  return seen;
}

/**
 * The source of `req`'s evidence: `tenant:<name>` for a tenant admission resolved (not its
 * default one), `key:<hash>` for its credentials, else `ip:<address>` (Express's `req.ip`, which
 * follows `trust proxy`; an IPv6 client by its /64, as the outlier detector counts clients).
 */
export function evidenceSource(req: IncomingMessage, headers: IncomingHttpHeaders, tenant: string | undefined): string {
  if (tenant !== undefined && tenant !== '') return `tenant:${tenant}`;
  const credentials = credentialsOf(headers);
  if (credentials !== undefined) return `key:${createHmac('sha256', KEY).update(credentials).digest('base64url').slice(0, 22)}`;
  return `ip:${clientOf(req)}`;
}

/**
 * Who sent the request: Express's `req.ip` where present (it follows the app's `trust proxy`
 * setting), else the socket's address. An IPv6 client counts by its /64, the block one host
 * or subscriber is usually given, so that one client cannot pose as many.
 */
export function clientOf(req: IncomingMessage | undefined): string {
  const ip = (req as { ip?: unknown } | undefined)?.ip;
  const address = typeof ip === 'string' ? ip : req?.socket?.remoteAddress ?? '';
  if (!address.includes(':')) return address;
  const mapped = address.lastIndexOf(':');
  if (isIPv4(address.slice(mapped + 1))) return address.slice(mapped + 1);
  const [head, tail = ''] = address.split('::');
  const left = head === '' ? [] : head.split(':');
  const right = tail === '' ? [] : tail.split(':');
  const groups = [...left, ...Array<string>(Math.max(0, 8 - left.length - right.length)).fill('0'), ...right];
  return groups.slice(0, 4).map((group) => group.toLowerCase().replace(/^0+(?=.)/, '')).join(':');
}
