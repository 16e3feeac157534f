/**
 * Renders a `/v1/chat/completions` request's messages into the prompt text the engine will
 * see, as vLLM does by default: the model's chat template (`chat_template.jinja`, or
 * `tokenizer_config.json`'s; of a named set, `tool_use` for a request with tools, else
 * `default`), given the messages (text parts joined by a newline unless the template loops
 * over content parts), the arguments template-arguments.ts works out (`add_generation_prompt`,
 * `tools`, `documents`, `reasoning_effort`, `enable_thinking`, `chat_template_kwargs` and the
 * server's defaults), and the tokenizer's special tokens (`bos_token`, `eos_token`, ...), as
 * transformers' `apply_chat_template` passes them.
 */
import type * as HfJinja from '@huggingface/jinja';
import { pythonStrip, renderPythonStrip } from './python-strip';
import { INVALID, TEMPLATE_ERROR, TOO_LONG, UNSUPPORTED, isRefused, type Refused } from './refusals';
import { templateArguments } from './template-arguments';
import { loadJinjaPackage, type ChatTemplates } from './tokenizer-files';
import { isRecord } from '../../guards';

/** What a request may bring before its template is rendered (rendering runs on the event loop, ~26 µs a message). */
export interface RenderLimits {
  /** The most messages. */
  maxMessages: number;
  /** The most text over all messages' contents, in UTF-16 units. */
  maxChars: number;
}

interface Compiled {
  readonly template: HfJinja.Template;
  /** Whether it iterates over a message's content parts (vLLM's "openai" content format). */
  readonly partsFormat: boolean;
}

/** A model's compiled chat templates. */
export class ChatRenderer {
  private readonly jinja: typeof HfJinja;
  private readonly templates: ReadonlyMap<string, Compiled>;
  private readonly specialTokens: Record<string, unknown>;

  /** Throws, naming the template, when one does not compile. */
  constructor(
    templates: ChatTemplates,
    config: Record<string, unknown>,
    private readonly limits: RenderLimits = { maxMessages: Infinity, maxChars: Infinity },
    /** The server's `--default-chat-template-kwargs`. */
    private readonly serverKwargs: Record<string, unknown> = {},
  ) {
    this.jinja = loadJinjaPackage();
    const compiled = new Map<string, Compiled>();
    for (const [name, source] of Object.entries(templates)) {
      try {
        compiled.set(name, { template: new this.jinja.Template(source), partsFormat: PARTS_LOOP.test(source) });
      } catch (error) {
        throw new Error(`its chat template${name === 'default' ? '' : ` '${name}'`} does not compile here (${(error as Error).message})`);
      }
    }
    this.templates = compiled;
    this.specialTokens = specialTokensOf(config);
  }

  /** The rendered prompt, or why not. */
  render(body: Record<string, unknown>): string | Refused {
    const messages = body.messages;
    if (!Array.isArray(messages) || messages.length === 0) return INVALID;
    // A template of the client's own is compiled per request only by vLLM itself.
    if (body.chat_template !== undefined && body.chat_template !== null) return UNSUPPORTED;
    // Bounded before rendering: 200k tiny messages took 5.3 s in the template alone.
    if (messages.length > this.limits.maxMessages) return TOO_LONG;
    const args = templateArguments(body, this.serverKwargs);
    if (isRefused(args)) return args;
    // transformers' get_chat_template: of a named set, `tool_use` when there are tools.
    const compiled = (args.tools !== null ? this.templates.get('tool_use') : undefined) ?? this.templates.get('default');
    if (compiled === undefined) return TEMPLATE_ERROR;
    const conversation: Record<string, unknown>[] = [];
    let chars = 0;
    for (const message of messages) {
      const converted = convertMessage(message, compiled.partsFormat);
      if (isRefused(converted)) return converted;
      chars += contentLength(converted.content);
      if (chars > this.limits.maxChars) return TOO_LONG;
      conversation.push(converted);
    }
    let rendered: string;
    try {
      rendered = renderPythonStrip(this.jinja, compiled.template, { ...this.specialTokens, ...args.variables, messages: conversation });
    } catch {
      return TEMPLATE_ERROR;
    }
    return args.continueFinal ? cutAfterFinalMessage(rendered, conversation[conversation.length - 1]) : rendered;
  }
}

/** vLLM's conversation message (chat_utils.py): role, content as the template's format wants it, the fields it keeps. */
function convertMessage(message: unknown, partsFormat: boolean): Record<string, unknown> | Refused {
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
  const asParts = partsFormat && role !== 'tool';
  const out: Record<string, unknown> = { role, content: asParts ? texts.map((text) => ({ type: 'text', text })) : texts.join('\n') };
  if (role === 'assistant') {
    if (Array.isArray(message.tool_calls) && message.tool_calls.length > 0) {
      const calls = message.tool_calls.map(parseArguments);
      if (calls.some(isRefused)) return INVALID;
      out.tool_calls = calls;
    }
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

// vLLM's content-format detection (vllm/renderers/hf.py `_iter_nodes_assign_content_item`) walks
// the template's syntax tree for a loop over `message['content']` or over a variable named
// `content`; the loop's source text is what that finds.
const PARTS_LOOP = /\{%-?\s*for\s+\w+\s+in\s+(?:\w+(?:\[\s*['"]content['"]\s*\]|\.content\b)|content\b)/;

/**
 * vLLM hands templates each tool call's `arguments` parsed from its JSON string, `{}` for an
 * empty one, and answers 400 to one that is not JSON or a call that is not a function's
 * (chat_utils.py `_postprocess_messages`).
 */
function parseArguments(call: unknown): Record<string, unknown> | Refused {
  if (!isRecord(call) || !isRecord(call.function) || (call.type !== undefined && call.type !== 'function')) return INVALID;
  const raw = call.function.arguments;
  let parsed: unknown = {};
  if (typeof raw === 'string' && raw !== '') {
    try {
      parsed = JSON.parse(raw);
    } catch {
      return INVALID;
    }
  } else if (typeof raw === 'object' && raw !== null) {
    parsed = raw;
  } else if (raw !== undefined && raw !== null && raw !== '' && raw !== 0 && raw !== false) {
    return INVALID;
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
  // transformers 5 names the tokens of an `extra_special_tokens` object as it names bos_token.
  const named = config.extra_special_tokens;
  if (isRecord(named)) {
    for (const [key, value] of Object.entries(named)) {
      const text = tokenText(value);
      if (text !== undefined && !Object.hasOwn(tokens, key)) Object.defineProperty(tokens, key, { value: text, enumerable: true });
    }
  }
  return tokens;
}

function tokenText(value: unknown): string | undefined {
  if (typeof value === 'string') return value;
  if (isRecord(value) && typeof value.content === 'string') return value.content;
  return undefined;
}
