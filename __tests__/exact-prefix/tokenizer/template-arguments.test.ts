/**
 * The template's arguments as vLLM 52a31cc works them out (template-arguments.ts), seen through
 * templates that print them: the rules come from vLLM's source (each case names the file), the
 * real models' renderings are checked in real-tokenizers.test.ts.
 */
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from '@jest/globals';
import { MOCK_TOKENIZER_DIR } from '../../../example-server/mock-vllm/tokenize';
import { PromptTokenizer, readTokenizerFiles } from '../../../lib/exact-prefix/tokenizer/tokenizer';

const files = readTokenizerFiles(MOCK_TOKENIZER_DIR);
const messages = [{ role: 'user', content: 'Hi' }];

/** A tokenizer whose template prints `expression` as JSON. */
function printing(expression: string, chatTemplateKwargs?: Record<string, unknown>): PromptTokenizer {
  return new PromptTokenizer({ ...files, config: { ...files.config, chat_template: `{{ ${expression} | tojson }}` } }, { chatTemplateKwargs });
}

function rendered(tokenizer: PromptTokenizer, body: Record<string, unknown>): unknown {
  const text = tokenizer.renderChat({ messages, ...body });
  return typeof text === 'string' ? JSON.parse(text) : text;
}

describe('reasoning_effort and enable_thinking (chat_completion/protocol.py build_chat_params, #43401)', () => {
  const both = printing('[reasoning_effort, enable_thinking]');

  it.each([
    ['high', {}, ['high', true]],
    ['low', {}, ['low', true]],
    ['none', {}, ['none', false]],
    ['high', { enable_thinking: false }, ['high', false]],
  ])('reasoning_effort %j with chat_template_kwargs %j renders %j', (effort, kwargs, expected) => {
    expect(rendered(both, { reasoning_effort: effort, chat_template_kwargs: kwargs })).toEqual(expected);
  });

  it('injects nothing without reasoning_effort', () => {
    expect(rendered(printing('[reasoning_effort is defined, enable_thinking is defined]'), {})).toEqual([false, false]);
  });

  it('refuses an effort vLLM does not know, and a chat_template_kwargs that is not an object, as invalid', () => {
    expect(both.renderChat({ messages, reasoning_effort: 'extreme' })).toEqual({ refused: 'invalid' });
    expect(both.renderChat({ messages, chat_template_kwargs: ['enable_thinking'] })).toEqual({ refused: 'invalid' });
  });
});

describe('the merge (renderers/params.py merge_kwargs, ChatParams.with_defaults)', () => {
  it("puts the request's kwargs over the server's, and its fields over its kwargs", () => {
    const tokenizer = printing('[house, enable_thinking, add_generation_prompt]', { house: 'terse', enable_thinking: false });
    expect(rendered(tokenizer, {})).toEqual(['terse', false, true]);
    expect(rendered(tokenizer, { chat_template_kwargs: { house: 'verbose', add_generation_prompt: false } })).toEqual(['verbose', false, true]);
    expect(rendered(tokenizer, { reasoning_effort: 'medium' })).toEqual(['terse', true, true]);
  });

  it('drops null and "auto" values, so the server\'s value (or none) shows through', () => {
    const tokenizer = printing('[house is defined and house, mode is defined]', { house: 'terse' });
    expect(rendered(tokenizer, { chat_template_kwargs: { house: null, mode: 'auto' } })).toEqual(['terse', false]);
  });

  it("keeps a `__proto__` key a variable, on neither side's prototype", () => {
    const tokenizer = printing('[house]');
    const body = JSON.parse('{"chat_template_kwargs": {"__proto__": {"polluted": 1}, "house": "x"}}') as Record<string, unknown>;
    expect(rendered(tokenizer, body)).toEqual(['x']);
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
  });

  it("passes apply_chat_template's own parameters to it, not to the template", () => {
    const tokenizer = printing('[padding is defined, max_length is defined, continue_final_message is defined]');
    expect(rendered(tokenizer, { chat_template_kwargs: { padding: true, max_length: 5 } })).toEqual([false, false, false]);
  });

  it.each([
    ['chat_template', { chat_template: '{{ 1 }}' }, 'unsupported'],
    ['tokenize', { tokenize: true }, 'unsupported'],
    ['messages', { messages: [] }, 'template_error'],
    ['conversation', { conversation: [] }, 'template_error'],
    ['return_assistant_tokens_mask', { return_assistant_tokens_mask: true }, 'template_error'],
  ])('refuses `%s` in chat_template_kwargs (safe_apply_chat_template / apply_chat_template would not render it as the router does)', (_key, kwargs, refused) => {
    expect(printing('1').renderChat({ messages, chat_template_kwargs: kwargs })).toEqual({ refused });
  });
});

describe('documents (chat_completion/protocol.py: list[dict[str, str]])', () => {
  const tokenizer = printing('documents');

  it('hands them to the template, from the field or from chat_template_kwargs', () => {
    const documents = [{ title: 'T', text: 'x' }];
    expect(rendered(tokenizer, { documents })).toEqual(documents);
    expect(rendered(tokenizer, { chat_template_kwargs: { documents } })).toEqual(documents);
    expect(rendered(tokenizer, {})).toBeNull();
  });

  it.each([
    ['a document that is not an object', ['x']],
    ['a value that is not a string', [{ title: 'T', page: 3 }]],
    ['an object', { title: 'T' }],
  ])('refuses %s as invalid', (_name, documents) => {
    expect(tokenizer.renderChat({ messages, documents })).toEqual({ refused: 'invalid' });
  });
});

describe('tools as ChatCompletionToolsParam.model_dump() writes them', () => {
  const tokenizer = printing('tools');

  it('fills in defaults, puts declared fields first, keeps extra fields, carries defer_loading to the function', () => {
    const tools = [{ function: { parameters: { type: 'object' }, name: 'now', strict: true }, defer_loading: true, custom: 1 }];
    expect(JSON.stringify(rendered(tokenizer, { tools }))).toBe(
      JSON.stringify([{ type: 'function', function: { name: 'now', description: null, parameters: { type: 'object' }, defer_loading: true, strict: true }, defer_loading: true, custom: 1 }]),
    );
  });

  it.each([
    ['an empty list', []],
    ['a tool of another type', [{ type: 'custom', function: { name: 'f' } }]],
    ['a function without a name', [{ type: 'function', function: {} }]],
    ['a description that is not a string', [{ type: 'function', function: { name: 'f', description: 3 } }]],
  ])('refuses %s as invalid (vLLM answers 400)', (_name, tools) => {
    expect(tokenizer.renderChat({ messages, tools })).toEqual({ refused: 'invalid' });
  });
});

describe('template files (transformers: chat_template.jinja, chat_templates/NAME.jinja)', () => {
  function directory(config: Record<string, unknown>, templates: Record<string, string>): string {
    const dir = mkdtempSync(join(tmpdir(), 'dp-router-templates-'));
    writeFileSync(join(dir, 'tokenizer.json'), JSON.stringify(files.tokenizer));
    writeFileSync(join(dir, 'tokenizer_config.json'), JSON.stringify(config));
    for (const [name, text] of Object.entries(templates)) {
      mkdirSync(join(dir, name, '..'), { recursive: true });
      writeFileSync(join(dir, name), text);
    }
    return dir;
  }

  it("prefers chat_template.jinja to the config's chat_template", () => {
    const tokenizer = PromptTokenizer.load(directory({ ...files.config, chat_template: 'config' }, { 'chat_template.jinja': 'file' }));
    expect(tokenizer.renderChat({ messages })).toBe('file');
  });

  it('renders a request with tools with the tool_use template of a named set, others with default', () => {
    const dir = directory({ ...files.config, chat_template: 'config' }, { 'chat_template.jinja': 'default', 'chat_templates/tool_use.jinja': 'tool_use' });
    const tokenizer = PromptTokenizer.load(dir);
    expect(tokenizer.renderChat({ messages })).toBe('default');
    expect(tokenizer.renderChat({ messages, tools: [{ type: 'function', function: { name: 'f' } }] })).toBe('tool_use');
    const listed = new PromptTokenizer({ ...files, config: { ...files.config, chat_template: [{ name: 'default', template: 'd' }, { name: 'tool_use', template: 't' }] } });
    expect(listed.renderChat({ messages, tools: [{ type: 'function', function: { name: 'f' } }] })).toBe('t');
  });

  it('says at creation when there is no template, or one that does not compile here', () => {
    const none = new PromptTokenizer({ ...files, config: {}, source: '/models/x' });
    expect(none.notices).toEqual([
      "(/models/x) has no chat template (no chat_template.jinja, no `chat_template` in tokenizer_config.json): its chat requests are routed on the approximate prefix index (completions prompts are tokenized). Point it at the model's directory as vLLM serves it.",
    ]);
    const broken = new PromptTokenizer({ ...files, config: { ...files.config, chat_template: '{% for %}' }, source: '/models/y' });
    expect(broken.notices).toEqual([expect.stringMatching(/^\(\/models\/y\): its chat template does not compile here \(.+\), so its chat requests are routed on the approximate prefix index/)]);
    expect(broken.tokenize('chat', { messages })).toEqual({ refused: 'unsupported' });
  });
});
