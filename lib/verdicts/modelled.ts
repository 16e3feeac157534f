/**
 * The one rule every check that can change routing for everyone applies first
 * (CONTRACT.md, "Evidence that changes routing for everyone"): a request the router does not
 * model exactly is never evidence. Its prompt tokens, its cached blocks or its token count at
 * the engine differ from the router's for reasons of the client's choosing, so a receipt or a
 * tokenizer sample taken on it says nothing about the upstream.
 *
 * Pure: a parsed body in, the field that rules it out (or `undefined`) out.
 */
import { isRecord } from '../guards';

/**
 * Why a request is not evidence, by the field that makes it so:
 *
 * - `truncate_prompt_tokens`: vLLM cuts the prompt (its `usage.prompt_tokens` is the cut one);
 * - `cache_salt`: vLLM keys the first block with it (vllm/v1/core/kv_cache_utils.py:524-532 at
 *   52a31cc); evidence only where the caller's index keys it as vLLM does;
 * - `multimodal`: a message part other than text, or `prompt_embeds`/`multi_modal_data`: the
 *   engine's tokens and block keys hold what the router does not see;
 * - `add_special_tokens`: the client chose the special tokens, not the server's defaults;
 * - `token_ids`: the prompt is given as token ids, which the router does not count as text;
 * - `tool_choice_none`: a server with `--exclude-tools-when-tool-choice-none` renders the
 *   prompt without the tools, its `/tokenize` with them.
 */
export type Unmodelled = 'truncate_prompt_tokens' | 'cache_salt' | 'multimodal' | 'add_special_tokens' | 'token_ids' | 'tool_choice_none';

/** A request's prompt kind, by its endpoint. */
export type EvidenceKind = 'chat' | 'completions';

const absent = (value: unknown) => value === undefined || value === null;

/**
 * The field of `body` that keeps it from being evidence, or `undefined` when the router models
 * it exactly. `saltKeyed`: the caller's index keys `cache_salt` as vLLM does (the exact index
 * does; a `/tokenize` sample is unaffected by the salt too).
 */
export function unmodelled(kind: EvidenceKind, body: Readonly<Record<string, unknown>>, saltKeyed: boolean): Unmodelled | undefined {
  if (!absent(body.truncate_prompt_tokens)) return 'truncate_prompt_tokens';
  if (!absent(body.cache_salt) && !(saltKeyed && typeof body.cache_salt === 'string')) return 'cache_salt';
  if (!absent(body.add_special_tokens)) return 'add_special_tokens';
  if (!absent(body.prompt_embeds) || !absent(body.multi_modal_data)) return 'multimodal';
  if (kind === 'completions') {
    const prompt = body.prompt;
    if (Array.isArray(prompt) && prompt.some((one) => typeof one !== 'string')) return 'token_ids';
    return undefined;
  }
  if (body.tool_choice === 'none' && !absent(body.tools)) return 'tool_choice_none';
  const messages = body.messages;
  if (Array.isArray(messages) && messages.some(hasMediaPart)) return 'multimodal';
  return undefined;
}

/** Whether a chat message carries a content part other than text. */
function hasMediaPart(message: unknown): boolean {
  if (!isRecord(message) || !Array.isArray(message.content)) return false;
  return message.content.some((part) => !isRecord(part) || part.type !== 'text');
}
