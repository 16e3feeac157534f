/**
 * vLLM's `POST /tokenize` (serving_tokenization.py), with the tokenizer the project ships for
 * the mock (example-server/mock-vllm/tokenizer/, made by make-tokenizer.ts):
 * `{model?, prompt, add_special_tokens = true}` or
 * `{model?, messages, add_generation_prompt = true, continue_final_message = false, add_special_tokens = false, ...}`
 * → `{count, max_model_len, tokens, token_strs}`.
 *
 * `/tokenize` goes through vllm-tokenize.ts (the tokenizer packages used directly), not the
 * router's PromptTokenizer: an agreement check between the two can then fail, as it can
 * against a real vLLM. The generation path (token counts, the prefix cache, KV events) keeps
 * `mockTokenizer()`.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { join } from 'node:path';
import { PromptTokenizer } from '../../lib/exact-prefix/tokenizer/tokenizer';
import { readJsonBody, sendError, sendJson } from './http';
import { unknownModelMessage } from './models';
import { loadVllmTokenizer, type VllmTokenizer } from './vllm-tokenize';

/** The directory of the mock's tokenizer (`tokenizer.json`, `tokenizer_config.json`). */
export const MOCK_TOKENIZER_DIR = join(__dirname, 'tokenizer');


let shared: PromptTokenizer | undefined;
let independent: VllmTokenizer | undefined;

/** The mock's tokenizer, loaded on the first `/tokenize` (the package is a dev dependency). */
export function mockTokenizer(): PromptTokenizer {
  // vLLM tokenizes any prompt it is sent; the router's per-request budget is not the server's.
  shared ??= PromptTokenizer.load(MOCK_TOKENIZER_DIR, { maxUncachedChars: Infinity });
  return shared;
}

/**
 * Serves one `/tokenize` request for a server of `model` with context length `maxModelLen`,
 * with the mock's tokenizer or `tokenizer` (a test's other model files).
 */
export async function serveTokenize(model: string, maxModelLen: number, req: IncomingMessage, res: ServerResponse, tokenizer?: VllmTokenizer): Promise<void> {
  const read = await readJsonBody(req, res);
  if (read === undefined) return;
  const { body } = read;
  if (typeof body !== 'object' || body === null || Array.isArray(body)) return sendError(res, 400, 'The request body must be a JSON object.');
  const request = body as Record<string, unknown>;
  const unknownModel = unknownModelMessage(model, request);
  if (unknownModel !== undefined) return sendError(res, 404, unknownModel, 'model');
  const isChat = request.messages !== undefined;
  if (!isChat && typeof request.prompt !== 'string') return sendError(res, 400, '`prompt` must be a string (or send `messages`).', 'prompt');
  const vllm = tokenizer ?? (independent ??= loadVllmTokenizer(MOCK_TOKENIZER_DIR));
  let tokens: number[];
  try {
    const outcome = vllm.tokenize(request);
    if (!Array.isArray(outcome)) return sendError(res, 400, outcome.error, outcome.param);
    tokens = outcome;
  } catch (error) {
    return sendError(res, 400, `Cannot tokenize this request (${(error as Error).message}).`, isChat ? 'messages' : 'prompt');
  }
  const tokenStrs = request.return_token_strs === true ? tokens.map((id) => vllm.tokenString(id)) : null;
  sendJson(res, 200, JSON.stringify({ count: tokens.length, max_model_len: maxModelLen, tokens, token_strs: tokenStrs }));
}
