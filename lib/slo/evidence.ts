/**
 * Whether a request's timings may teach the latency model, and whose they are. The latency
 * model changes routing for everyone, so it follows CONTRACT.md's rule on evidence: it learns
 * only from the router's own measurements of requests it models exactly, and bounds each
 * source's share (source-shares.ts). The rule and the source are lib/verdicts/'s, shared with
 * every other check; timings add what only they depend on (several choices per request).
 */
import { unmodelled } from '../verdicts/modelled';

export { evidenceSource as sourceOf } from '../verdicts/source';

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
  // The shared rule, on the members routing decoded (the salt is not keyed for timings: a salted prompt's prefill is not the one predicted).
  if (members !== undefined && unmodelled(members.messages !== undefined ? 'chat' : 'completions', members, false) !== undefined) return false;
  if (members !== undefined && Array.isArray(members.prompt)) return false;
  for (const name of UNMODELLED) if (body.indexOf(name) >= 0) return false;
  // `"prompt": [` (token ids, or a batch of prompts) when the members were scanned, not decoded.
  return members !== undefined || !/"prompt"\s*:\s*\[/.test(body.toString('latin1', 0, Math.min(body.length, 1 << 16)));
}
