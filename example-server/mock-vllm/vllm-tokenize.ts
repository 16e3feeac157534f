/**
 * The mock's own `/tokenize`, computed as vLLM computes it and independently of the router:
 * `@huggingface/tokenizers` and `@huggingface/jinja` used directly on the fixture's files, with
 * pydantic's lax coercion of the boolean fields (vLLM's request models), and Python's string
 * trimming and splitting in templates (python-str.ts, as jinja2 does). Nothing of the
 * router's tokenizing (PromptTokenizer, its chat renderer, its Python strip) is used, so the
 * router's tokenizer-agreement tests can fail.
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

/** Loads `tokenizer.json` and `tokenizer_config.json` from `dir`. */
export function loadVllmTokenizer(dir: string): VllmTokenizer {
  const json = JSON.parse(readFileSync(join(dir, 'tokenizer.json'), 'utf8')) as Record<string, unknown>;
  const config = JSON.parse(readFileSync(join(dir, 'tokenizer_config.json'), 'utf8')) as Record<string, unknown>;
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
        const kwargs = typeof request.chat_template_kwargs === 'object' && request.chat_template_kwargs !== null ? request.chat_template_kwargs : {};
        const text = template.render({ ...special, ...kwargs, ...pythonStrFunctions, messages, add_generation_prompt: addGenerationPrompt, continue_final_message: continueFinal, tools: request.tools ?? null, documents: request.documents ?? null });
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
