import type { IncomingHttpHeaders, IncomingMessage } from 'node:http';
import type { BodyLease } from './body-budget';
import { isJsonMediaType } from './media-type';

/** Why a body could not be read. */
export type BodyFailure = 'too_large' | 'over_budget' | 'aborted';

/** `read`: with `keepRead`, the bytes taken from the stream before it stopped (the stream is left paused, the rest unread). */
export type BodyResult = { ok: true; bytes: Buffer } | { ok: false; failure: BodyFailure; read?: Buffer };

/**
 * Reads a request body into one buffer, stopping at `limit` bytes. A declared
 * `content-length` over the limit fails before a byte is read. With a lease, the bytes are
 * taken from the router's body budget first: a declared length at once, a chunked body chunk
 * by chunk; what the budget cannot give fails as `over_budget`. With `keepRead`, a chunked body
 * that stops there returns what was taken from the stream, to be sent ahead of the rest.
 */
export function readBody(req: IncomingMessage, limit: number, lease?: BodyLease, keepRead = false): Promise<BodyResult> {
  const declared = Number(req.headers['content-length']);
  if (declared > limit) return Promise.resolve({ ok: false, failure: 'too_large' });
  const reserved = lease !== undefined && declared > 0;
  if (reserved && !lease.grow(declared)) return Promise.resolve({ ok: false, failure: 'over_budget' });
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let size = 0;
    // Methods, not arrow functions bound to names: a build that keeps function names (tsx,
    // esbuild's keepNames) would call Object.defineProperty for each, on every body read.
    const on = {
      finish(result: BodyResult): void {
        req.off('data', on.data);
        req.off('end', on.end);
        req.off('close', on.close);
        req.off('error', on.close);
        resolve(result);
      },
      data(chunk: Buffer): void {
        size += chunk.length;
        let failure: BodyFailure | undefined;
        if (size > limit) failure = 'too_large';
        else if (lease !== undefined && !reserved && !lease.grow(chunk.length)) failure = 'over_budget';
        if (failure !== undefined) {
          req.pause();
          // The chunk that did not fit is part of what was taken from the stream.
          on.finish(keepRead ? { ok: false, failure, read: Buffer.concat([...chunks, chunk]) } : { ok: false, failure });
          return;
        }
        chunks.push(chunk);
      },
      end(): void {
        on.finish({ ok: true, bytes: chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, size) });
      },
      close(): void {
        on.finish({ ok: false, failure: 'aborted' });
      },
    };
    req.on('data', on.data);
    req.on('end', on.end);
    req.on('close', on.close);
    req.on('error', on.close);
  });
}

/**
 * The whole body, when the HTTP parser has already put all of it in the stream's buffer (it
 * arrived with the headers: one tick after the request's first handler, the parser has pushed
 * the body, though it marks the message complete only later): taken at once, with no listeners,
 * closures or promise, its bytes taken from the lease first. `undefined` when it has not all
 * arrived (or is chunked and not complete), is empty, is over `limit`, or the lease cannot hold
 * it: {@link readBody} then reads it and answers each of those.
 */
export function arrivedBody(req: IncomingMessage, limit: number, lease: BodyLease | undefined): Buffer | undefined {
  // Each property of `req` read costs a lookup V8 cannot cache: three here.
  const size = req.readableLength;
  if (size === 0 || size > limit) return undefined;
  if (!req.complete && Number(req.headers['content-length']) !== size) return undefined;
  if (lease !== undefined && !lease.grow(size)) return undefined;
  // All that is buffered, in one Buffer. The stream ends when the parser completes the message
  // (a proxy piping it then ends its upstream request).
  return req.read(size) as Buffer;
}

/**
 * Whether all of a body declared by `Content-Length` (at most `limit` bytes) is in the stream's
 * buffer already, for a request whose stream nothing has read: the parser has completed the
 * message. `headers`: `req.headers`.
 */
export function wholeInBuffer(req: IncomingMessage, headers: IncomingHttpHeaders, limit: number): boolean {
  const declared = headers['content-length'];
  // `complete`, not `readableLength`: the lifecycle read it a moment ago, so V8 finds it in its
  // stub cache; `readableLength` is a getter four prototypes up, a miss every time.
  return declared !== undefined && Number(declared) <= limit && req.complete;
}

/** Whether a request (its `req.headers`) carries a body at all (so reading it cannot block on a GET). */
export function hasBody(headers: IncomingHttpHeaders): boolean {
  const length = headers['content-length'];
  return headers['transfer-encoding'] !== undefined || (length !== undefined && length !== '0');
}

/** Whether the body is JSON by its declared media type (see {@link isJsonMediaType}); `headers`: `req.headers`. */
export function isJson(headers: IncomingHttpHeaders): boolean {
  return isJsonMediaType(headers['content-type']);
}
