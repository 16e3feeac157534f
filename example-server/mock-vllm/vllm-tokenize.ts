/**
 * The mock's own `/tokenize`, computed as vLLM computes it and independently of the router:
 * `@huggingface/tokenizers` and `@huggingface/jinja` used directly on the fixture's files, with
 * pydantic's lax coercion of the boolean fields (vLLM's request models), and Python's string
 * trimming and splitting in templates (python-str.ts, as jinja2 does). Nothing of the
 * router's tokenizing (PromptTokenizer, its chat renderer, its Python strip, its template
 * arguments) is used, so the router's tokenizer-agreement tests can fail.
 *
 * Its fields are vLLM 52a31cc's `TokenizeChatRequest` (vllm/entrypoints/serve/tokenize/protocol.py):
 * there is no `documents` and no `reasoning_effort`, and like every vLLM request model it
 * ignores fields it does not know; `chat_template_kwargs` is merged under
 * `add_generation_prompt` and `continue_final_message` (`merge_kwargs`, vllm/renderers/params.py,
 * which drops None and "auto"), so `documents` reach the template only through it. `tools` are
 * handed over as pydantic dumps them (`description: null` filled in, declared fields first).
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
// The packages are optional (loaded on the first `/tokenize`, as the router loads them): only
// their loader is shared with lib/, none of its tokenizing.
import { loadJinjaPackage, loadTokenizersPackage } from '../../lib/exact-prefix/tokenizer/tokenizer-files';
import { pythonStrFunctions, rewriteForPython } from './python-str';

/** A tokenizer directory loaded for `/tokenize`. */
export interface VllmTokenizer {
  /** The request's token ids, or why it cannot be tokenized (a 400). */
  tokenize(request: Record<string, unknown>): number[] | { error: string; param: string };
  /** The vocabulary's string for `id`. */
  tokenString(id: number): string;
}

/** pydantic's lax bool: true/false, 0/1, and its accepted strings (any case); undefined for anything else. */
export function laxBool(value: unknown): boolean | undefined {
  if (typeof value === 'boolean') return value;
  if (value === 0 || value === 1) return value === 1;
  if (typeof value === 'string') {
    const word = value.toLowerCase();
    if (['1', 'on', 't', 'true', 'y', 'yes'].includes(word)) return true;
    if (['0', 'off', 'f', 'false', 'n', 'no'].includes(word)) return false;
  }
  return undefined;
}

const UNTRUSTED_TEMPLATE = 'Chat template is passed with request, but --trust-request-chat-template is not set. Refused request with untrusted chat template.';

/** `tools` as vLLM's `ChatCompletionToolsParam.model_dump()` writes them, or the error message. */
function dumpTools(tools: unknown): Array<Record<string, unknown>> | null | string {
  if (tools === undefined || tools === null) return null;
  if (!Array.isArray(tools)) return '`tools` must be a list.';
  const out: Array<Record<string, unknown>> = [];
  for (const tool of tools as Array<Record<string, unknown>>) {
    const fn = tool?.function as Record<string, unknown> | undefined;
    if (typeof fn !== 'object' || fn === null || typeof fn.name !== 'string') return 'Each tool needs a `function` with a `name`.';
    const { name, description = null, parameters = null, defer_loading: fnDefer, ...fnRest } = fn;
    const { type = 'function', function: _function, defer_loading: toolDefer, ...rest } = tool;
    const defer = fnDefer ?? toolDefer ?? null;
    const dumpedFunction = { name, description, parameters, ...(defer !== null && { defer_loading: defer }), ...fnRest };
    out.push({ type, function: dumpedFunction, ...(toolDefer !== undefined && toolDefer !== null && { defer_loading: toolDefer }), ...rest });
  }
  return out;
}

/** Loads `tokenizer.json` and `tokenizer_config.json` from `dir`, or from the two paths given. */
export function loadVllmTokenizer(dir: string | readonly [string, string]): VllmTokenizer {
  const [jsonPath, configPath] = typeof dir === 'string' ? [join(dir, 'tokenizer.json'), join(dir, 'tokenizer_config.json')] : dir;
  const json = JSON.parse(readFileSync(jsonPath, 'utf8')) as Record<string, unknown>;
  const config = JSON.parse(readFileSync(configPath, 'utf8')) as Record<string, unknown>;
  const { Tokenizer } = loadTokenizersPackage();
  const { Template } = loadJinjaPackage();
  const tokenizer = new Tokenizer(json, config);
  const template = typeof config.chat_template === 'string' ? new Template(config.chat_template) : undefined;
  if (template !== undefined) rewriteForPython(template.parsed);
  const special = { bos_token: config.bos_token, eos_token: config.eos_token };
  const flag = (request: Record<string, unknown>, name: string, fallback: boolean): boolean | { error: string; param: string } => {
    if (request[name] === undefined || request[name] === null) return fallback;
    const value = laxBool(request[name]);
    return value === undefined ? { error: `\`${name}\` must be a boolean.`, param: name } : value;
  };
  return {
    tokenize(request) {
      if (request.messages !== undefined) {
        if (template === undefined) return { error: 'The model has no chat template.', param: 'messages' };
        if (!Array.isArray(request.messages)) return { error: '`messages` must be a list.', param: 'messages' };
        const addGenerationPrompt = flag(request, 'add_generation_prompt', true);
        const continueFinal = flag(request, 'continue_final_message', false);
        const addSpecial = flag(request, 'add_special_tokens', false);
        for (const value of [addGenerationPrompt, continueFinal, addSpecial]) if (typeof value !== 'boolean') return value;
        // The mock serves a text-only model: an image (or any non-text part) cannot be tokenized.
        const parts = (request.messages as Array<{ content?: unknown }>).flatMap((message) => (Array.isArray(message.content) ? (message.content as Array<{ type?: unknown }>) : []));
        if (parts.some((part) => part?.type !== 'text')) return { error: 'Cannot tokenize this request (unsupported).', param: 'messages' };
        const messages = (request.messages as Array<Record<string, unknown>>).map((message) => ({
          ...message,
          content: Array.isArray(message.content) ? (message.content as Array<{ text?: string }>).map((part) => part.text ?? '').join('\n') : (message.content ?? ''),
        }));
        if (request.chat_template !== undefined && request.chat_template !== null) return { error: UNTRUSTED_TEMPLATE, param: 'chat_template' };
        const own = request.chat_template_kwargs ?? {};
        if (typeof own !== 'object' || Array.isArray(own)) return { error: '`chat_template_kwargs` must be an object.', param: 'chat_template_kwargs' };
        const tools = dumpTools(request.tools);
        if (typeof tools === 'string') return { error: tools, param: 'tools' };
        // Unknown top-level fields (`documents`, `reasoning_effort`) are ignored, as pydantic's extra="allow" does.
        const kwargs = new Map(Object.entries(own as Record<string, unknown>));
        kwargs.set('add_generation_prompt', addGenerationPrompt);
        kwargs.set('continue_final_message', continueFinal);
        if (tools !== null && (kwargs.get('tools') ?? null) === null) kwargs.set('tools', tools);
        for (const [key, value] of kwargs) if (value === null || value === 'auto') kwargs.delete(key);
        const variables = Object.fromEntries([...kwargs].filter(([key]) => key !== 'continue_final_message'));
        const text = template.render({ ...special, ...variables, ...pythonStrFunctions, messages, tools: kwargs.get('tools') ?? null, documents: kwargs.get('documents') ?? null });
        return tokenizer.encode(text, { add_special_tokens: addSpecial as boolean }).ids;
      }
      if (typeof request.prompt !== 'string') return { error: '`prompt` must be a string (or send `messages`).', param: 'prompt' };
      const addSpecial = flag(request, 'add_special_tokens', true);
      if (typeof addSpecial !== 'boolean') return addSpecial;
      return tokenizer.encode(request.prompt, { add_special_tokens: addSpecial }).ids;
    },
    tokenString(id) {
      return tokenizer.id_to_token(id) ?? '';
    },
  };
}
