import type { IncomingMessage } from 'node:http';
import type { BodyLease } from './body-budget';
import { isJsonMediaType } from './media-type';

/** Why a body could not be read. */
export type BodyFailure = 'too_large' | 'over_budget' | 'aborted';

export type BodyResult = { ok: true; bytes: Buffer } | { ok: false; failure: BodyFailure };

/**
 * Reads a request body into one buffer, stopping at `limit` bytes. A declared
 * `content-length` over the limit fails before a byte is read. With a lease, the bytes are
 * taken from the router's body budget first: a declared length at once, a chunked body chunk
 * by chunk; what the budget cannot give fails as `over_budget`.
 */
export function readBody(req: IncomingMessage, limit: number, lease?: BodyLease): Promise<BodyResult> {
  const declared = Number(req.headers['content-length']);
  if (declared > limit) return Promise.resolve({ ok: false, failure: 'too_large' });
  const reserved = lease !== undefined && declared > 0;
  if (reserved && !lease.grow(declared)) return Promise.resolve({ ok: false, failure: 'over_budget' });
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const finish = (result: BodyResult) => {
      req.off('data', onData);
      req.off('end', onEnd);
      req.off('close', onClose);
      req.off('error', onClose);
      resolve(result);
    };
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      let failure: BodyFailure | undefined;
      if (size > limit) failure = 'too_large';
      else if (lease !== undefined && !reserved && !lease.grow(chunk.length)) failure = 'over_budget';
      if (failure !== undefined) {
        req.pause();
        finish({ ok: false, failure });
        return;
      }
      chunks.push(chunk);
    };
    const onEnd = () => finish({ ok: true, bytes: chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, size) });
    const onClose = () => finish({ ok: false, failure: 'aborted' });
    req.on('data', onData);
    req.on('end', onEnd);
    req.on('close', onClose);
    req.on('error', onClose);
  });
}

/** Whether a request carries a body at all (so reading it cannot block on a GET). */
export function hasBody(req: IncomingMessage): boolean {
  return req.headers['transfer-encoding'] !== undefined || (req.headers['content-length'] !== undefined && req.headers['content-length'] !== '0');
}

/** Whether the body is JSON by its declared media type (see {@link isJsonMediaType}). */
export function isJson(req: IncomingMessage): boolean {
  return isJsonMediaType(req.headers['content-type']);
}
