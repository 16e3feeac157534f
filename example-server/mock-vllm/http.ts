import type { IncomingMessage, OutgoingHttpHeaders, ServerResponse } from 'node:http';
import { vllmError } from './errors';
import { DONE_EVENT } from './openai';

/** The response headers of vLLM's streamed answers (Starlette adds the charset to text types). */
export const SSE_HEADERS = { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache' };

/** Answers a JSON body, unless the client is already gone. */
export function sendJson(res: ServerResponse, status: number, body: string, headers: OutgoingHttpHeaders = {}): void {
  if (res.destroyed || res.headersSent) return;
  res.writeHead(status, { ...headers, 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

/** Answers vLLM's error body. */
export function sendError(
  res: ServerResponse,
  status: number,
  message: string,
  param: string | null = null,
  headers: OutgoingHttpHeaders = {},
): void {
  sendJson(res, status, JSON.stringify(vllmError(status, message, param)), headers);
}

/**
 * vLLM's answer to a streaming request that fails after the stream began: HTTP 200, an error
 * event, `[DONE]`. The event is Python's `json.dumps` of the error (vLLM 52a31cc,
 * `create_streaming_error_response`, vllm/entrypoints/openai/engine/serving.py:182): `", "` and
 * `": "` between members, non-ASCII escaped; the JSON answers are Starlette's compact form.
 */
export function sendStreamError(res: ServerResponse, message: string, status = 400): void {
  if (res.destroyed || res.headersSent) return;
  res.writeHead(200, SSE_HEADERS);
  res.write(`data: ${pythonJsonDumps(vllmError(status, message))}\n\n`);
  res.end(DONE_EVENT);
}

/** Python's `json.dumps(value)` with its defaults, for the plain values of an error body. */
export function pythonJsonDumps(value: unknown): string {
  if (value === null) return 'null';
  if (typeof value === 'string') return JSON.stringify(value).replace(/[\u007f-\uffff]/g, (char) => `\\u${char.charCodeAt(0).toString(16).padStart(4, '0')}`);
  if (Array.isArray(value)) return `[${value.map(pythonJsonDumps).join(', ')}]`;
  if (typeof value === 'object') return `{${Object.entries(value as Record<string, unknown>).map(([key, member]) => `${pythonJsonDumps(key)}: ${pythonJsonDumps(member)}`).join(', ')}}`;
  return JSON.stringify(value);
}

/** The request body, or why there is none to use. */
export type BodyResult = Buffer | 'aborted' | 'too_large';

/** Reads the whole body; stops collecting (but keeps draining) once it passes `limitBytes`. */
export function readBody(req: IncomingMessage, limitBytes: number): Promise<BodyResult> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size > limitBytes) resolve('too_large');
      else chunks.push(chunk);
    });
    req.on('end', () => resolve(size > limitBytes ? 'too_large' : Buffer.concat(chunks, size)));
    req.on('error', () => resolve('aborted'));
    req.on('close', () => resolve('aborted'));
  });
}

/** Far above any real prompt; only there so a hostile body cannot exhaust memory. */
const MAX_BODY_BYTES = 64 * 1024 * 1024;

/**
 * Reads and parses a JSON request body, answering what is wrong with it in vLLM's shape (413,
 * 400); `undefined` when it was answered or the client left.
 */
export async function readJsonBody(req: IncomingMessage, res: ServerResponse): Promise<{ body: unknown; raw: Buffer } | undefined> {
  const raw = await readBody(req, MAX_BODY_BYTES);
  if (raw === 'aborted') return undefined;
  if (raw === 'too_large') return void sendError(res, 413, 'Request body too large.', null, { connection: 'close' });
  try {
    return { body: JSON.parse(raw.toString('utf8')) as unknown, raw };
  } catch (error) {
    return void sendError(res, 400, `Invalid JSON body: ${(error as Error).message}`);
  }
}

/** The path without the query string. */
export function pathOf(url: string | undefined): string {
  if (!url) return '/';
  const query = url.indexOf('?');
  return query === -1 ? url : url.slice(0, query);
}

/** Ends a socket after what was written has been flushed: the peer sees the body cut short. */
export function dieAfterFlush(res: ServerResponse): void {
  const socket = res.socket;
  if (!socket || socket.destroyed) return;
  socket.end(() => socket.destroy());
}
