import { Agent, request, type ClientRequest } from 'node:http';

/** What one streamed completion delivered. */
export interface StreamResult {
  status: number;
  /** SSE events received (`data:` lines), the usage chunk and `[DONE]` included. */
  events: number;
  /** Per token chunk: arrival here − the upstream's write time (`"t"`), ms. */
  delays: number[];
}

const BODY = Buffer.from(
  JSON.stringify({
    model: 'bench',
    messages: [
      { role: 'system', content: 'You are a helpful assistant. '.repeat(8) },
      { role: 'user', content: 'Stream a long answer, please.' },
    ],
    stream: true,
    stream_options: { include_usage: true },
    max_tokens: 1000,
  }),
);
const T = Buffer.from('"t":');
const DATA = Buffer.from('data: ');

/**
 * A client of many concurrent streams (no socket limit, connections kept alive between
 * streams). Each chunk is scanned for `data: ` events and their `"t"` without decoding JSON,
 * so that the client's own cost per chunk stays small.
 */
export function createStreamClient() {
  const agent = new Agent({ keepAlive: true, maxSockets: Infinity, maxFreeSockets: 20_000 });
  const headers = (chunks: number, chunkMs: number) => ({
    'content-type': 'application/json',
    'content-length': BODY.length,
    'x-bench-chunks': String(chunks),
    'x-bench-chunk-ms': String(chunkMs),
    'x-tenant-id': 'bench',
    'x-session-id': 'bench-session',
  });

  /** One streamed completion of `chunks` token chunks, one every `chunkMs`; `onFirst` once its first event is in. */
  const stream = (port: number, chunks: number, chunkMs: number, measure: boolean, onFirst?: () => void, started?: (req: ClientRequest) => void) =>
    new Promise<StreamResult>((resolve, reject) => {
      const result: StreamResult = { status: 0, events: 0, delays: [] };
      const outgoing = request({ host: '127.0.0.1', port, path: '/v1/chat/completions', method: 'POST', agent, headers: headers(chunks, chunkMs) }, (response) => {
        result.status = response.statusCode ?? 0;
        let first = true;
        response.on('data', (chunk: Buffer) => {
          const now = performance.timeOrigin + performance.now();
          for (let at = chunk.indexOf(DATA); at !== -1; at = chunk.indexOf(DATA, at + DATA.length)) result.events++;
          if (first) {
            first = false;
            onFirst?.();
          }
          if (!measure) return;
          for (let at = chunk.indexOf(T); at !== -1; at = chunk.indexOf(T, at + T.length)) {
            const end = chunk.indexOf(0x7d, at);
            result.delays.push(now - Number(chunk.toString('latin1', at + T.length, end)));
          }
        });
        response.on('end', () => resolve(result));
        response.on('error', reject);
        response.on('aborted', () => resolve(result));
      });
      started?.(outgoing);
      outgoing.on('error', (error: NodeJS.ErrnoException) => (error.code === 'ECONNRESET' || error.message === 'socket hang up' ? resolve(result) : reject(error)));
      outgoing.end(BODY);
    });

  return { stream, close: () => agent.destroy() };
}
