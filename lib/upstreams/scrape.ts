import { get as httpGet, type IncomingMessage } from 'node:http';
import { get as httpsGet } from 'node:https';

/** Largest `/metrics` page read; vLLM's is tens of kilobytes. */
export const MAX_SCRAPE_BYTES = 4 * 1024 * 1024;

/**
 * GETs a URL's body as text within `timeoutMs`, refusing more than `MAX_SCRAPE_BYTES`.
 * Rejects on any status other than 200, and when `signal` aborts.
 */
export function fetchText(url: string, timeoutMs: number, signal?: AbortSignal): Promise<string> {
  return new Promise((resolve, reject) => {
    const get = url.startsWith('https:') ? httpsGet : httpGet;
    const request = get(url, { timeout: timeoutMs, signal, headers: { accept: 'text/plain' } }, (response: IncomingMessage) => {
      if (response.statusCode !== 200) {
        response.resume();
        reject(new Error(`${url} answered ${response.statusCode}`));
        return;
      }
      const chunks: Buffer[] = [];
      let size = 0;
      response.on('data', (chunk: Buffer) => {
        size += chunk.length;
        if (size > MAX_SCRAPE_BYTES) {
          request.destroy(new Error(`${url} sent more than ${MAX_SCRAPE_BYTES} bytes`));
          return;
        }
        chunks.push(chunk);
      });
      response.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
      response.on('error', reject);
    });
    request.on('timeout', () => request.destroy(new Error(`${url} did not answer within ${timeoutMs} ms`)));
    request.on('error', reject);
  });
}
