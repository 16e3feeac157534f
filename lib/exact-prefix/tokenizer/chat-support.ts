/**
 * Whether chat requests can be rendered here as vLLM renders them for the engine, and what the
 * router says at creation when they cannot (they are then routed on the approximate index;
 * completions prompts are still tokenized):
 *
 * - gpt-oss: vLLM renders its chat requests with openai-harmony, not with a chat template
 *   (vllm/entrypoints/serve/render/serving.py `_make_request_with_harmony`, taken when the
 *   model type is `gpt_oss`), and its `/tokenize` renders the template instead, so that not
 *   even the agreement check would notice; known here by harmony's special tokens;
 * - no chat template in the files (vLLM would then answer chat requests with an error, or use
 *   its own `--chat-template`, which the router is not told);
 * - a template that does not compile with @huggingface/jinja.
 */
import { ChatRenderer, type RenderLimits } from './tokenizer-chat';
import { addedTokens, chatTemplatesOf, type TokenizerFiles } from './tokenizer-files';

/** The renderer of a model's chat requests, or the notice saying why there is none. */
export type ChatSupport = { renderer: ChatRenderer; notice?: undefined } | { renderer?: undefined; notice: string };

const HARMONY_TOKENS = ['<|start|>', '<|channel|>', '<|message|>'];
const ROUTED = 'its chat requests are routed on the approximate prefix index (completions prompts are tokenized)';

/** Builds the renderer of `files`' chat template with vLLM's server-side `--default-chat-template-kwargs`. */
export function chatSupport(files: TokenizerFiles, limits: RenderLimits, serverKwargs: Record<string, unknown>): ChatSupport {
  const added = addedTokens(files.tokenizer);
  if (HARMONY_TOKENS.every((token) => added.has(token))) {
    return { notice: `(${files.source}) is gpt-oss's (harmony) tokenizer: vLLM renders gpt-oss chat requests with openai-harmony, not with a chat template, so ${ROUTED}.` };
  }
  const templates = chatTemplatesOf(files);
  if (templates === undefined) {
    return { notice: `(${files.source}) has no chat template (no chat_template.jinja, no \`chat_template\` in tokenizer_config.json): ${ROUTED}. Point it at the model's directory as vLLM serves it.` };
  }
  try {
    return { renderer: new ChatRenderer(templates, files.config, limits, serverKwargs) };
  } catch (error) {
    return { notice: `(${files.source}): ${(error as Error).message}, so ${ROUTED}.` };
  }
}
