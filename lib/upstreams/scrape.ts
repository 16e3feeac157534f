import { smallRequest } from '../http/small-http';

/** Largest `/metrics` page read; vLLM's is tens of kilobytes. */
export const MAX_SCRAPE_BYTES = 4 * 1024 * 1024;

/**
 * GETs a URL's body as text within `timeoutMs` (a deadline for the whole answer), refusing
 * more than `MAX_SCRAPE_BYTES`. Rejects on any status other than 200, and when `signal` aborts.
 */
export async function fetchText(url: string, timeoutMs: number, signal?: AbortSignal): Promise<string> {
  const answer = await smallRequest(url, { headers: { accept: 'text/plain' }, deadlineMs: timeoutMs, maxBytes: MAX_SCRAPE_BYTES, signal });
  return answer.body.toString('utf8');
}
