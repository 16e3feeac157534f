/**
 * Renders a `/v1/chat/completions` request's messages into the prompt text the engine will
 * see, as vLLM does by default: the model's chat template from `tokenizer_config.json`, given
 * the messages (text parts joined by a newline unless the template loops over content parts),
 * `add_generation_prompt` (default true), `continue_final_message`, `tools`, `documents`,
 * `chat_template_kwargs` and the tokenizer's special tokens (`bos_token`, `eos_token`, ...), as
 * transformers' `apply_chat_template` passes them.
 */
import type * as HfJinja from '@huggingface/jinja';
import { pythonStrip, renderPythonStrip } from './python-strip';
import { loadJinjaPackage } from './tokenizer-files';
import { isRecord } from '../../guards';

/**
 * Why a request's prompt is not tokenized here (the caller routes it on the approximate index):
 * `invalid` (vLLM would refuse it too), `unsupported` (images, a client's own template, no
 * template), `template_error` (the template raised), `too_long` (more new text than the
 * tokenizer's `maxUncachedChars`).
 */
export type RenderRefusal = 'invalid' | 'unsupported' | 'template_error' | 'too_long';

/** A refusal, as an object so no rendered text can be mistaken for one. */
export interface Refused {
  refused: RenderRefusal;
}

const INVALID: Refused = Object.freeze({ refused: 'invalid' });
const UNSUPPORTED: Refused = Object.freeze({ refused: 'unsupported' });
const TEMPLATE_ERROR: Refused = Object.freeze({ refused: 'template_error' });
/** Shared with the tokenizer, whose budget refuses with the same answer. */
export const TOO_LONG: Refused = Object.freeze({ refused: 'too_long' });

/** Whether `value` is one of the refusals above (never a message or a text). */
export function isRefused(value: unknown): value is Refused {
  return value === INVALID || value === UNSUPPORTED || value === TEMPLATE_ERROR || value === TOO_LONG;
}

const LAX_TRUE = new Set(['1', 'on', 't', 'true', 'y', 'yes']);
const LAX_FALSE = new Set(['0', 'off', 'f', 'false', 'n', 'no']);

/** pydantic's lax bool (what vLLM's request fields accept): booleans, 0/1, and its words in any case; `fallback` when absent, undefined when refused. */
export function laxBool(value: unknown, fallback: boolean): boolean | undefined {
  if (value === undefined || value === null) return fallback;
  if (typeof value === 'boolean') return value;
  if (value === 0 || value === 1) return value === 1;
  if (typeof value === 'string') {
    const word = value.toLowerCase();
    if (LAX_TRUE.has(word)) return true;
    if (LAX_FALSE.has(word)) return false;
  }
  return undefined;
}

/** What a request may bring before its template is rendered (rendering runs on the event loop, ~26 µs a message). */
export interface RenderLimits {
  /** The most messages. */
  maxMessages: number;
  /** The most text over all messages' contents, in UTF-16 units. */
  maxChars: number;
}

/** A compiled chat template. */
export class ChatRenderer {
  private readonly jinja: typeof HfJinja;
  private readonly template: HfJinja.Template;
  private readonly specialTokens: Record<string, unknown>;
  /** Whether the template iterates over a message's content parts (vLLM's "openai" content format). */
  readonly partsFormat: boolean;

  constructor(
    chatTemplate: string,
    config: Record<string, unknown>,
    private readonly limits: RenderLimits = { maxMessages: Infinity, maxChars: Infinity },
  ) {
    this.jinja = loadJinjaPackage();
    this.template = new this.jinja.Template(chatTemplate);
    this.specialTokens = specialTokensOf(config);
    this.partsFormat = PARTS_LOOP.test(chatTemplate);
  }

  /** The rendered prompt, or why not. */
  render(body: Record<string, unknown>): string | Refused {
    const messages = body.messages;
    if (!Array.isArray(messages) || messages.length === 0) return INVALID;
    // A template of the client's own is compiled per request only by vLLM itself.
    if (body.chat_template !== undefined && body.chat_template !== null) return UNSUPPORTED;
    // Bounded before rendering: 200k tiny messages took 5.3 s in the template alone.
    if (messages.length > this.limits.maxMessages) return TOO_LONG;
    const conversation: Record<string, unknown>[] = [];
    let chars = 0;
    for (const message of messages) {
      const converted = this.convertMessage(message);
      if (isRefused(converted)) return converted;
      chars += contentLength(converted.content);
      if (chars > this.limits.maxChars) return TOO_LONG;
      conversation.push(converted);
    }
    // vLLM's request models are pydantic's: `1`, `"true"`, `"yes"` are true there.
    const continueFinal = laxBool(body.continue_final_message, false);
    const addGenerationPrompt = laxBool(body.add_generation_prompt, true);
    if (continueFinal === undefined || addGenerationPrompt === undefined) return INVALID;
    // transformers refuses both at once, and vLLM's default for the first is true.
    if (continueFinal && addGenerationPrompt) return INVALID;
    const kwargs = isRecord(body.chat_template_kwargs) ? body.chat_template_kwargs : {};
    let rendered: string;
    try {
      rendered = renderPythonStrip(this.jinja, this.template, {
        ...this.specialTokens,
        ...kwargs,
        messages: conversation,
        add_generation_prompt: addGenerationPrompt,
        continue_final_message: continueFinal,
        tools: body.tools ?? null,
        documents: body.documents ?? null,
      });
    } catch {
      return TEMPLATE_ERROR;
    }
    return continueFinal ? cutAfterFinalMessage(rendered, conversation[conversation.length - 1]) : rendered;
  }

  /** vLLM's conversation message (chat_utils.py): role, content as the template's format wants it, the fields it keeps. */
  private convertMessage(message: unknown): Record<string, unknown> | Refused {
    if (!isRecord(message) || typeof message.role !== 'string') return INVALID;
    const role = message.role;
    const texts: string[] = [];
    const content = message.content;
    if (typeof content === 'string') {
      texts.push(content);
    } else if (Array.isArray(content)) {
      for (const part of content) {
        const text = partText(part);
        if (isRefused(text)) return text;
        if (text !== undefined) texts.push(text);
      }
    } else if (content !== undefined && content !== null) {
      return INVALID;
    }
    // Tool results are always a string: most templates read them as one.
    const asParts = this.partsFormat && role !== 'tool';
    const out: Record<string, unknown> = { role, content: asParts ? texts.map((text) => ({ type: 'text', text })) : texts.join('\n') };
    if (role === 'assistant') {
      if (Array.isArray(message.tool_calls) && message.tool_calls.length > 0) out.tool_calls = message.tool_calls.map(parseArguments);
      if (message.reasoning !== undefined && message.reasoning !== null) out.reasoning = out.reasoning_content = message.reasoning;
    } else if (role === 'tool' && 'tool_call_id' in message) {
      out.tool_call_id = message.tool_call_id;
    } else if (role === 'developer') {
      out.tools = message.tools ?? null;
    }
    if (typeof message.name === 'string') out.name = message.name;
    if (typeof message.task === 'string') out.task = message.task;
    return out;
  }
}

function contentLength(content: unknown): number {
  if (typeof content === 'string') return content.length;
  let length = 0;
  if (Array.isArray(content)) for (const part of content as Array<{ text: string }>) length += part.text.length;
  return length;
}

const TEXT_PART_KEYS: Record<string, string> = { text: 'text', input_text: 'text', output_text: 'text', refusal: 'refusal', thinking: 'thinking' };

/** A content part's text; undefined for a text part without one (vLLM skips it). */
function partText(part: unknown): string | undefined | Refused {
  if (typeof part === 'string') return part;
  if (!isRecord(part) || typeof part.type !== 'string') return INVALID;
  const key = TEXT_PART_KEYS[part.type];
  // Images, audio, video, embeddings: their placeholder tokens and the engine's hash extras are the model processor's.
  if (key === undefined || part.uuid !== undefined) return UNSUPPORTED;
  const text = part[key];
  if (text === undefined || text === null) return undefined;
  return typeof text === 'string' ? text : INVALID;
}

// vLLM's content-format detection walks the template's syntax tree for a loop over
// `message['content']`; the loop's source text is what that finds.
const PARTS_LOOP = /\{%-?\s*for\s+\w+\s+in\s+\w+(?:\[\s*['"]content['"]\s*\]|\.content\b)/;

/** vLLM hands templates each tool call's `arguments` parsed from its JSON string (`{}` when it is not JSON). */
function parseArguments(call: unknown): unknown {
  if (!isRecord(call) || !isRecord(call.function)) return call;
  const raw = call.function.arguments;
  let parsed: unknown = {};
  if (typeof raw === 'string') {
    try {
      parsed = JSON.parse(raw);
    } catch {
      parsed = {};
    }
  } else if (typeof raw === 'object' && raw !== null) {
    parsed = raw;
  }
  return { ...call, function: { ...call.function, arguments: parsed } };
}

/** transformers' `continue_final_message`: the prompt ends where the final message's content does. */
function cutAfterFinalMessage(rendered: string, final: Record<string, unknown> | undefined): string | Refused {
  let content = final?.content;
  if (Array.isArray(content)) content = (content[content.length - 1] as { text?: string } | undefined)?.text ?? '';
  if (typeof content !== 'string') return INVALID;
  // transformers strips with Python's str.strip(), whose whitespace is not JavaScript's.
  const stripped = pythonStrip(content);
  const leftStripped = pythonStrip(content, 'start');
  const at = rendered.lastIndexOf(stripped);
  if (at === -1) return TEMPLATE_ERROR;
  // As transformers compares: the whole content, so content with leading space is cut stripped.
  const kept = rendered.slice(at, at + leftStripped.length) === content ? leftStripped : stripped;
  return rendered.slice(0, at + kept.length);
}

const SPECIAL_TOKEN_KEYS = ['bos_token', 'eos_token', 'unk_token', 'sep_token', 'pad_token', 'cls_token', 'mask_token'];

/** The special tokens transformers passes to every template, each as its text. */
function specialTokensOf(config: Record<string, unknown>): Record<string, unknown> {
  const tokens: Record<string, unknown> = {};
  for (const key of SPECIAL_TOKEN_KEYS) {
    const text = tokenText(config[key]);
    if (text !== undefined) tokens[key] = text;
  }
  const extra = config.additional_special_tokens;
  if (Array.isArray(extra)) tokens.additional_special_tokens = extra.map(tokenText).filter((text) => text !== undefined);
  return tokens;
}

function tokenText(value: unknown): string | undefined {
  if (typeof value === 'string') return value;
  if (isRecord(value) && typeof value.content === 'string') return value.content;
  return undefined;
}
