/**
 * Whether a request's timings may teach the latency model, and whose they are. The latency
 * model changes routing for everyone, so it follows CONTRACT.md's rule on evidence: it learns
 * only from the router's own measurements of requests it models exactly, and bounds each
 * source's share (source-shares.ts). The shared predicate of lib/verdicts/ is not on main yet:
 * this is the SLO feature's copy of its rule, to be replaced by it.
 */
import { createHash } from 'node:crypto';
import type { IncomingHttpHeaders, IncomingMessage } from 'node:http';

/**
 * Body members whose effect on the engine's work the router does not model: a prompt cut by
 * the engine (`truncate_prompt_tokens`), a cache key the index does not see (`cache_salt`),
 * multimodal parts and prompt embeddings (prefill the router cannot count), several choices
 * decoded together (`n`, `best_of`: more tokens per event, or fewer events per token), token
 * ids where the router counts text, special tokens added or not. A body mentioning one is no
 * evidence: a mention inside a message's text only costs a sample.
 */
const UNMODELLED = ['"truncate_prompt_tokens"', '"cache_salt"', '"image_url"', '"input_audio"', '"video_url"', '"prompt_embeds"', '"n"', '"best_of"', '"add_special_tokens"', '"prompt_token_ids"'].map((name) => Buffer.from(name));

/** Whether the body's timings can be evidence (see {@link UNMODELLED}); a prompt given as token ids never is. */
export function modelledExactly(body: Buffer | undefined, members: Readonly<Record<string, unknown>> | undefined): boolean {
  if (body === undefined) return false;
  if (members !== undefined && Array.isArray(members.prompt)) return false;
  for (const name of UNMODELLED) if (body.indexOf(name) >= 0) return false;
  // `"prompt": [` (token ids, or a batch of prompts) when the members were scanned, not decoded.
  return members !== undefined || !/"prompt"\s*:\s*\[/.test(body.toString('latin1', 0, Math.min(body.length, 1 << 16)));
}

/**
 * The request's source: its tenant as admission resolves it (not the default one), else a hash
 * of its credentials (`Authorization`, `x-api-key`), else its address (`req.ip`, which honours
 * Express's `trust proxy`, or the socket's).
 */
export function sourceOf(req: IncomingMessage & { ip?: string }, headers: IncomingHttpHeaders, tenant: string | undefined): string {
  if (tenant !== undefined && tenant !== '') return `t:${tenant}`;
  const credentials = headers.authorization ?? headers['x-api-key'];
  if (credentials !== undefined) return `c:${createHash('sha256').update(String(credentials)).digest('base64url').slice(0, 16)}`;
  return `a:${req.ip ?? req.socket?.remoteAddress ?? ''}`;
}
