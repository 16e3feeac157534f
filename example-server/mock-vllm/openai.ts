import { randomUUID } from 'node:crypto';
import type { PromptTokenizer } from '../../lib/exact-prefix/tokenizer/tokenizer';
import { countTokens } from './prefix-cache';

/** The two generation endpoints. */
export type GenerationKind = 'completions' | 'chat';

/** A validated generation request. */
export interface GenerationRequest {
  kind: GenerationKind;
  /** Prompt texts: one per `prompt` entry, or the chat rendered as one text. */
  prompts: string[];
  /** Each prompt's token ids, when the mock tokenizes (`kvEvents`): what the token counts and the cache go by. */
  tokenIds?: number[][];
  maxTokens: number;
  stream: boolean;
  includeUsage: boolean;
  /**
   * `stream_options.continuous_usage_stats` with `include_usage`: every event carries the usage so
   * far (vLLM 52a31cc vllm/entrypoints/utils.py:281-293; chat_completion/serving.py:546-551 and
   * 932-938, completion/serving.py:426-432), as on a server with `--enable-force-include-usage`.
   */
  continuousUsage: boolean;
}

/** Why a body was rejected (answered 400, like vLLM's validation). */
export interface RequestProblem {
  message: string;
  param: string | null;
}

const DEFAULT_MAX_TOKENS = 16;
const FILLER = ['lorem', 'ipsum', 'dolor', 'sit', 'amet', 'consectetur', 'adipiscing', 'elit'];

/**
 * Validates a generation body the way a gateway can observe vLLM doing it; with a `tokenizer`,
 * also tokenizes its prompts as vLLM does (the chat template, special tokens), else a token is
 * taken to be 4 characters.
 */
export function parseGenerationRequest(
  kind: GenerationKind,
  body: unknown,
  maxModelLen: number,
  tokenizer?: PromptTokenizer,
): GenerationRequest | RequestProblem {
  if (!isObject(body)) return { message: 'The request body must be a JSON object.', param: null };
  const prompts = kind === 'chat' ? chatPrompt(body.messages) : completionPrompts(body.prompt);
  if (!prompts) {
    return kind === 'chat'
      ? { message: '`messages` must be a list of {role, content} objects.', param: 'messages' }
      : { message: '`prompt` must be a string or a non-empty list of strings.', param: 'prompt' };
  }
  const maxTokensField = kind === 'chat' && body.max_completion_tokens != null ? 'max_completion_tokens' : 'max_tokens';
  const maxTokens = body[maxTokensField] ?? DEFAULT_MAX_TOKENS;
  if (!Number.isSafeInteger(maxTokens) || (maxTokens as number) < 1) {
    return { message: `${maxTokensField} must be at least 1, got ${JSON.stringify(maxTokens)}.`, param: maxTokensField };
  }
  let tokenIds: number[][] | undefined;
  if (tokenizer) {
    const outcome = tokenizer.tokenize(kind, body);
    if ('refused' in outcome) return { message: `Cannot tokenize this request (${outcome.refused}).`, param: kind === 'chat' ? 'messages' : 'prompt' };
    tokenIds = outcome.prompts.map((ids) => truncated(ids, body.truncate_prompt_tokens, body.truncation_side, maxModelLen));
  }
  const longestPrompt = tokenIds
    ? tokenIds.reduce((longest, ids) => Math.max(longest, ids.length), 0)
    : prompts.reduce((longest, prompt) => Math.max(longest, countTokens(prompt)), 0);
  if (longestPrompt + (maxTokens as number) > maxModelLen) {
    return {
      message:
        `This model's maximum context length is ${maxModelLen} tokens. However, you requested ` +
        `${longestPrompt + (maxTokens as number)} tokens (${longestPrompt} in the messages, ${maxTokens} in the completion). ` +
        'Please reduce the length of the messages or completion.',
      param: null,
    };
  }
  const streamOptions = isObject(body.stream_options) ? body.stream_options : {};
  return {
    kind,
    prompts,
    ...(tokenIds && { tokenIds }),
    maxTokens: maxTokens as number,
    stream: body.stream === true,
    includeUsage: streamOptions.include_usage === true,
    continuousUsage: streamOptions.include_usage === true && streamOptions.continuous_usage_stats === true,
  };
}

/**
 * The prompt as vLLM 52a31cc cuts it for `truncate_prompt_tokens` (`_token_truncation`,
 * vllm/renderers/params.py:396-413): −1 is the model's length; the tail kept with
 * `truncation_side: 'left'`, else the head (a Hugging Face tokenizer's default side).
 */
function truncated(ids: number[], limit: unknown, side: unknown, maxModelLen: number): number[] {
  if (typeof limit !== 'number' || !Number.isSafeInteger(limit) || limit < -1) return ids;
  const keep = limit < 0 ? maxModelLen : limit;
  if (keep >= ids.length) return ids;
  return side === 'left' ? ids.slice(ids.length - keep) : ids.slice(0, keep);
}

/** Tells a rejected body from a valid one. */
export function isProblem(parsed: GenerationRequest | RequestProblem): parsed is RequestProblem {
  return 'message' in parsed;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function completionPrompts(prompt: unknown): string[] | null {
  if (typeof prompt === 'string') return [prompt];
  if (Array.isArray(prompt) && prompt.length > 0 && prompt.every((p) => typeof p === 'string')) return prompt;
  return null;
}

/** Renders the conversation as one text, standing in for the chat template, so turns share a prefix. */
function chatPrompt(messages: unknown): string[] | null {
  if (!Array.isArray(messages) || messages.length === 0) return null;
  let text = '';
  for (const message of messages) {
    if (!isObject(message) || typeof message.role !== 'string') return null;
    const content = messageText(message.content);
    if (content === null) return null;
    text += `<|${message.role}|>\n${content}\n`;
  }
  return [text];
}

/** A content string, or the text parts of a content array (other parts carry no prompt text here). */
function messageText(content: unknown): string | null {
  if (content == null) return '';
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return null;
  let text = '';
  for (const part of content) {
    if (!isObject(part)) return null;
    if (part.type === 'text' && typeof part.text === 'string') text += part.text;
  }
  return text;
}

/** Output token `index` of `rank`: the text starts with `rank N:` so callers can see who answered. */
export function outputToken(rank: number, index: number): string {
  return index === 0 ? `rank ${rank}:` : ` ${FILLER[(index - 1) % FILLER.length]}`;
}

function outputText(rank: number, tokens: number): string {
  let text = '';
  for (let i = 0; i < tokens; i++) text += outputToken(rank, i);
  return text;
}

/** One admitted generation: what its answer needs. */
export interface Generation {
  request: GenerationRequest;
  model: string;
  rank: number;
  promptTokens: number;
  cachedTokens: number;
  /** vLLM's `--enable-prompt-tokens-details`. */
  reportsCached: boolean;
}

function usage(generation: Generation) {
  const completionTokens = generation.request.maxTokens * generation.request.prompts.length;
  return {
    prompt_tokens: generation.promptTokens,
    total_tokens: generation.promptTokens + completionTokens,
    completion_tokens: completionTokens,
    // Only with cached tokens: vllm/entrypoints/openai/chat_completion/serving.py:952 and 1384 (52a31cc).
    ...(generation.reportsCached && generation.cachedTokens > 0 && { prompt_tokens_details: { cached_tokens: generation.cachedTokens } }),
  };
}

function responseId(kind: GenerationKind): string {
  return `${kind === 'chat' ? 'chatcmpl' : 'cmpl'}-${randomUUID().replace(/-/g, '')}`;
}

const unixSeconds = () => Math.floor(Date.now() / 1000);

/** The non-streaming answer body, in vLLM's shape. */
export function completionBody(generation: Generation): string {
  const { request, model, rank } = generation;
  const text = outputText(rank, request.maxTokens);
  const id = responseId(request.kind);
  const created = unixSeconds();
  if (request.kind === 'chat') {
    return JSON.stringify({
      id,
      object: 'chat.completion',
      created,
      model,
      choices: [
        {
          index: 0,
          message: { role: 'assistant', content: text, tool_calls: [] },
          logprobs: null,
          finish_reason: 'length',
          stop_reason: null,
        },
      ],
      usage: usage(generation),
      prompt_logprobs: null,
    });
  }
  return JSON.stringify({
    id,
    object: 'text_completion',
    created,
    model,
    choices: request.prompts.map((_, index) => ({
      index,
      text,
      logprobs: null,
      finish_reason: 'length',
      stop_reason: null,
      prompt_logprobs: null,
    })),
    usage: usage(generation),
  });
}

/** The SSE events of a streamed answer, grouped by decode step (one output token per choice). */
export class SseStream {
  readonly steps: number;
  /** `{"id":…,"object":…,"created":…,"model":…,"choices":[`, built once per stream. */
  private readonly head: string;

  constructor(private readonly generation: Generation) {
    const { kind, maxTokens } = generation.request;
    this.steps = maxTokens;
    const object = kind === 'chat' ? 'chat.completion.chunk' : 'text_completion';
    this.head =
      `{"id":${JSON.stringify(responseId(kind))},"object":"${object}",` +
      `"created":${unixSeconds()},"model":${JSON.stringify(generation.model)},"choices":[`;
  }

  /** The events of `step`; the first adds chat's role chunk, the last adds usage and `[DONE]`. */
  eventsAt(step: number): string[] {
    const { request, rank } = this.generation;
    const events: string[] = [];
    const isLast = step === this.steps - 1;
    const finishReason = isLast ? 'length' : null;
    const token = outputToken(rank, step);
    if (request.kind === 'chat') {
      if (step === 0) events.push(this.event({ index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }, 0));
      events.push(this.event({ index: 0, delta: { content: token }, logprobs: null, finish_reason: finishReason, ...(isLast && { stop_reason: null }) }, step + 1));
    } else {
      for (let index = 0; index < request.prompts.length; index++) {
        events.push(this.event({ index, text: token, logprobs: null, finish_reason: finishReason, stop_reason: null }, step + 1));
      }
    }
    if (isLast) {
      if (request.includeUsage) events.push(`data: ${this.head}],"usage":${JSON.stringify(usage(this.generation))}}\n\n`);
      events.push(DONE_EVENT);
    }
    return events;
  }

  /** One choice's event; `completed`: that choice's tokens so far (the continuous usage, when asked). */
  private event(choice: object, completed: number): string {
    if (!this.generation.request.continuousUsage) return `data: ${this.head}${JSON.stringify(choice)}]}\n\n`;
    // The mock's prompt count is the request's (vLLM gives each completions prompt its own).
    const prompt = this.generation.promptTokens;
    return `data: ${this.head}${JSON.stringify(choice)}],"usage":{"prompt_tokens":${prompt},"total_tokens":${prompt + completed},"completion_tokens":${completed}}}\n\n`;
  }
}

/** The stream terminator vLLM sends after the last event, errors included. */
export const DONE_EVENT = 'data: [DONE]\n\n';
