import type { IncomingMessage } from 'node:http';

/** Why a body could not be read. */
export type BodyFailure = 'too_large' | 'aborted';

export type BodyResult = { ok: true; bytes: Buffer } | { ok: false; failure: BodyFailure };

/**
 * Reads a request body into one buffer, stopping at `limit` bytes. A declared
 * `content-length` over the limit fails before a byte is read.
 */
export function readBody(req: IncomingMessage, limit: number): Promise<BodyResult> {
  const declared = Number(req.headers['content-length']);
  if (declared > limit) return Promise.resolve({ ok: false, failure: 'too_large' });
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
      if (size > limit) {
        req.pause();
        finish({ ok: false, failure: 'too_large' });
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

/** Whether the body is JSON by its declared type; a missing type is read as JSON, as vLLM does. */
export function isJson(req: IncomingMessage): boolean {
  const type = req.headers['content-type'];
  return type === undefined || type.includes('json');
}
