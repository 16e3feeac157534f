/**
 * Who a piece of evidence came from (CONTRACT.md, "Evidence that changes routing for
 * everyone"): the request's tenant as admission resolves it, else its credentials, else its
 * address. Credentials are kept only as a keyed hash (the key is the process's own, random),
 * so no source names a secret, in memory, logs or metrics.
 */
import { createHmac, randomBytes } from 'node:crypto';
import type { IncomingHttpHeaders, IncomingMessage } from 'node:http';
import { clientOf } from '../upstreams/outlier-detector';

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
