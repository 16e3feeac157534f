/**
 * What vLLM (commit 52a31cc) hands a chat template besides the messages, from a
 * `/v1/chat/completions` body and the server's `--default-chat-template-kwargs`:
 *
 * - `ChatCompletionRequest.build_chat_params` (vllm/entrypoints/openai/chat_completion/protocol.py:471)
 *   puts `add_generation_prompt`, `continue_final_message`, `documents`, `reasoning_effort` and,
 *   when `reasoning_effort` is set and the request's `chat_template_kwargs` has no
 *   `enable_thinking`, `enable_thinking = reasoning_effort != "none"` over the request's
 *   `chat_template_kwargs` (#43401, the commit itself);
 * - `ChatParams.with_defaults` (vllm/renderers/params.py:90) puts that over the server's defaults
 *   and the request's tools as `model_dump()` writes them (serve/render/serving.py:542);
 * - `merge_kwargs` (params.py:28) drops every `None` and `"auto"` it puts over something;
 * - transformers' `apply_chat_template` takes `tools`, `documents`, `add_generation_prompt` and
 *   `continue_final_message` as its own parameters, and passes the rest to the template.
 *
 * `/tokenize` has no `documents` or `reasoning_effort` field (serve/tokenize/protocol.py), but
 * takes `chat_template_kwargs` through the same merge: {@link requestTemplateKwargs} is what
 * reproduces a chat request's rendering there.
 */
import { isRecord } from '../../guards';
import { INVALID, TEMPLATE_ERROR, UNSUPPORTED, isRefused, type Refused } from './refusals';

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

/** `reasoning_effort`'s values (chat_completion/protocol.py:216); vLLM answers 400 to any other. */
const REASONING_EFFORTS = new Set(['none', 'minimal', 'low', 'medium', 'high', 'xhigh', 'max']);

/** `merge_kwargs`: `overrides` over `defaults`, less the overrides that are `None` or `"auto"`. Built by entries, so a `__proto__` key stays a key. */
export function mergeKwargs(defaults: Record<string, unknown>, overrides: Record<string, unknown>): Record<string, unknown> {
  const set = Object.entries(overrides).filter(([, value]) => value !== null && value !== undefined && value !== 'auto');
  const replaced = new Set(set.map(([key]) => key));
  return Object.fromEntries([...Object.entries(defaults).filter(([key]) => !replaced.has(key)), ...set]);
}

/**
 * The request's part of the template's arguments (`build_chat_params`' `chat_template_kwargs`,
 * before the server's defaults), or INVALID for what vLLM answers 400 to.
 */
export function requestTemplateKwargs(body: Record<string, unknown>, addGenerationPrompt: boolean, continueFinal: boolean): Record<string, unknown> | Refused {
  const own = body.chat_template_kwargs ?? {};
  if (!isRecord(own)) return INVALID;
  const effort = body.reasoning_effort ?? null;
  if (effort !== null && !(typeof effort === 'string' && REASONING_EFFORTS.has(effort))) return INVALID;
  const documents = body.documents ?? null;
  // `list[dict[str, str]]`: pydantic coerces nothing to a string.
  if (documents !== null && !(Array.isArray(documents) && documents.every((doc) => isRecord(doc) && Object.values(doc).every((text) => typeof text === 'string')))) return INVALID;
  const extra: Record<string, unknown> = { add_generation_prompt: addGenerationPrompt, continue_final_message: continueFinal, documents, reasoning_effort: effort };
  if (effort !== null && !Object.hasOwn(own, 'enable_thinking')) extra.enable_thinking = effort !== 'none';
  return mergeKwargs(own, extra);
}

/** A chat request's template arguments. */
export interface TemplateArguments {
  /** The template's variables other than `messages` (the tokenizer's special tokens go under them). */
  variables: Record<string, unknown>;
  /** `tools` as `apply_chat_template` is given them (they pick a named set's `tool_use` template). */
  tools: unknown[] | null;
  addGenerationPrompt: boolean;
  continueFinal: boolean;
}

/** `apply_chat_template`'s parameters that never reach the template (transformers' tokenization_utils_base.py). */
const CALL_ONLY = ['padding', 'truncation', 'max_length', 'return_tensors', 'return_dict', 'tokenizer_kwargs'];

/** The template's arguments for `body` on a server started with `serverKwargs` as `--default-chat-template-kwargs`, or why not. */
export function templateArguments(body: Record<string, unknown>, serverKwargs: Record<string, unknown>): TemplateArguments | Refused {
  // vLLM's request models are pydantic's: `1`, `"true"`, `"yes"` are true there.
  const continueFinal = laxBool(body.continue_final_message, false);
  const addGenerationPrompt = laxBool(body.add_generation_prompt, true);
  if (continueFinal === undefined || addGenerationPrompt === undefined) return INVALID;
  // transformers refuses both at once, and vLLM's default for the first is true.
  if (continueFinal && addGenerationPrompt) return INVALID;
  const request = requestTemplateKwargs(body, addGenerationPrompt, continueFinal);
  if (isRefused(request)) return request;
  const dumped = toolsOf(body.tools);
  if (dumped === INVALID) return INVALID;
  const kwargs = mergeKwargs(mergeKwargs(serverKwargs, { tools: dumped }), request);
  // safe_apply_chat_template's own parameters (vllm/renderers/hf.py:634): a template of the
  // client's own is compiled by vLLM itself; `tokenize` would make it skip `add_special_tokens`.
  if (kwargs.chat_template !== undefined || (kwargs.tokenize !== undefined && kwargs.tokenize !== false)) return UNSUPPORTED;
  const { tools = null, documents = null, add_generation_prompt, continue_final_message, conversation, messages, return_assistant_tokens_mask, ...variables } = kwargs;
  // Python: "got multiple values for argument"; transformers refuses the mask without tokenizing.
  if (conversation !== undefined || messages !== undefined || (return_assistant_tokens_mask !== undefined && return_assistant_tokens_mask !== false)) return TEMPLATE_ERROR;
  // transformers refuses tools and documents that are not lists of objects.
  if (!listOfObjects(tools) || !listOfObjects(documents)) return TEMPLATE_ERROR;
  for (const key of CALL_ONLY) delete variables[key];
  return {
    variables: { ...variables, tools, documents, add_generation_prompt },
    tools: tools as unknown[] | null,
    addGenerationPrompt: add_generation_prompt === true,
    continueFinal: continue_final_message === true,
  };
}

function listOfObjects(value: unknown): boolean {
  return value === null || (Array.isArray(value) && value.every(isRecord));
}

/** The request's `tools` as vLLM's `ChatCompletionToolsParam.model_dump()` writes each; null without; INVALID for what it answers 400 to. */
function toolsOf(tools: unknown): unknown[] | null | Refused {
  if (tools === undefined || tools === null) return null;
  // check_tool_usage (chat_completion/protocol.py:768) refuses an empty list.
  if (!Array.isArray(tools) || tools.length === 0) return INVALID;
  const dumped: unknown[] = [];
  for (const tool of tools) {
    const one = dumpTool(tool);
    if (one === undefined) return INVALID;
    dumped.push(one);
  }
  return dumped;
}

const TOOL_FIELDS = new Set(['type', 'function', 'defer_loading']);
const FUNCTION_FIELDS = new Set(['name', 'description', 'parameters', 'defer_loading']);

/**
 * One tool as pydantic dumps it (vllm/entrypoints/openai/engine/protocol.py:166,
 * chat_completion/protocol.py:156): declared fields first, in declaration order, defaults
 * filled in (`description: null`), `defer_loading` only when set, then the extra fields as sent.
 * A template that writes `tool | tojson` shows all of it.
 */
function dumpTool(tool: unknown): Record<string, unknown> | undefined {
  if (!isRecord(tool) || !isRecord(tool.function)) return undefined;
  const fn = tool.function;
  if ((tool.type !== undefined && tool.type !== 'function') || typeof fn.name !== 'string') return undefined;
  const description = fn.description ?? null;
  const parameters = fn.parameters ?? null;
  if ((description !== null && typeof description !== 'string') || (parameters !== null && !isRecord(parameters))) return undefined;
  const toolDefer = optionalBool(tool.defer_loading);
  let fnDefer = optionalBool(fn.defer_loading);
  if (toolDefer === INVALID || fnDefer === INVALID) return undefined;
  // _propagate_defer_loading: the tool's flag reaches its function.
  fnDefer ??= toolDefer;
  const dumpedFunction = Object.fromEntries([
    ['name', fn.name],
    ['description', description],
    ['parameters', parameters],
    ...(fnDefer === undefined ? [] : [['defer_loading', fnDefer]]),
    ...Object.entries(fn).filter(([key]) => !FUNCTION_FIELDS.has(key)),
  ]);
  return Object.fromEntries([
    ['type', 'function'],
    ['function', dumpedFunction],
    ...(toolDefer === undefined ? [] : [['defer_loading', toolDefer]]),
    ...Object.entries(tool).filter(([key]) => !TOOL_FIELDS.has(key)),
  ]);
}

function optionalBool(value: unknown): boolean | undefined | Refused {
  if (value === undefined || value === null) return undefined;
  return laxBool(value, false) ?? INVALID;
}
