import type { IncomingHttpHeaders, OutgoingHttpHeaders } from 'node:http';
import { parseOutOfRange } from './rank-header-check';
import { smallRequest } from '../http/small-http';

/** What a probe found: the value refused as vLLM refuses it, taken, or neither (no answer, another error). */
export type ProbeOutcome = 'refused' | 'honoured' | 'unknown';

/** A probe's whole exchange, in ms. */
const PROBE_DEADLINE_MS = 5000;
/** vLLM's error is far smaller; a 1-token completion too. */
const PROBE_MAX_BYTES = 16 * 1024;
/**
 * A 1-token completion with no `model`: vLLM 52a31cc takes it (`CompletionRequest.model` is
 * optional, vllm/entrypoints/openai/completion/protocol.py:46, and `_is_model_supported(None)`
 * is true, engine/serving.py:592-594) and checks the rank before it runs anything
 * (vllm/v1/engine/input_processor.py:255-259).
 */
const PROBE_BODY = JSON.stringify({ prompt: '0', max_tokens: 1 });
/** What the probe may carry of the request that raised the suspicion: the credentials the server checks first (`--api-key`), nothing else. */
const CREDENTIALS = ['authorization', 'x-api-key'] as const;

/**
 * The router's own confirmation of a refused rank header: the same header value on a request it
 * builds itself, to the same server. Only vLLM's own error for that very value confirms; a
 * client's request that made the server echo the sentence (a validation error quoting its
 * input) is not repeated by this one. Never rejects.
 */
export async function probeRankHeader(url: string, header: string, value: string, from: IncomingHttpHeaders | undefined): Promise<ProbeOutcome> {
  const headers: OutgoingHttpHeaders = { 'content-type': 'application/json', [header]: value };
  // Held for this one request only: never stored, logged or counted.
  if (from !== undefined) {
    for (const name of CREDENTIALS) {
      const credential = from[name];
      if (credential !== undefined) (headers as Record<string, string | string[]>)[name] = credential;
    }
  }
  const target = new URL('v1/completions', url.endsWith('/') ? url : `${url}/`);
  try {
    const answer = await smallRequest(target, { method: 'POST', headers, body: PROBE_BODY, deadlineMs: PROBE_DEADLINE_MS, maxBytes: PROBE_MAX_BYTES, accept: () => true });
    if (answer.status >= 200 && answer.status < 300) return 'honoured';
    const refused = answer.status === 400 ? parseOutOfRange(answer.body.toString('utf8')) : undefined;
    return refused !== undefined && String(refused.rank) === value ? 'refused' : 'unknown';
  } catch {
    return 'unknown';
  }
}
