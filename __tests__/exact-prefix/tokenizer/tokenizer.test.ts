import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it, jest } from '@jest/globals';
import fc from 'fast-check';
import { makeTokenizerFiles } from '../../../example-server/mock-vllm/make-tokenizer';
import { MOCK_TOKENIZER_DIR } from '../../../example-server/mock-vllm/tokenize';
import { PromptTokenizer, readTokenizerFiles, type TokenizerFiles } from '../../../lib/exact-prefix/tokenizer/tokenizer';

const files = readTokenizerFiles(MOCK_TOKENIZER_DIR);
const tokenizer = new PromptTokenizer(files);

// The fixture's special tokens (make-tokenizer.ts appends them after the trained vocabulary).
const BOS = 402;
const START_HEADER = 404;
const END_HEADER = 405;
const EOT = 406;
const NEWLINE = 198;

function prompt(outcome: ReturnType<PromptTokenizer['tokenize']>): number[] {
  if ('refused' in outcome) throw new Error(`refused: ${outcome.refused}`);
  expect(outcome.prompts).toHaveLength(1);
  return outcome.prompts[0];
}

describe('the fixture tokenizer', () => {
  it('is small and round-trips text through its ids', () => {
    expect(readFileSync(join(MOCK_TOKENIZER_DIR, 'tokenizer.json')).length).toBeLessThan(200 * 1024);
    for (const text of ['What is the capital of France?', 'naïve café 🚀\n\n\ttabs  and  spaces ', "don't WE'LL 12345", '']) {
      const ids = tokenizer.encodeWhole(text, false);
      expect(tokenizer.decode(ids)).toBe(text);
    }
    // Merges were learnt: a common word is one token.
    expect(tokenizer.encodeWhole(' the', false)).toHaveLength(1);
  });

  it('is what make-tokenizer.ts writes', () => {
    for (const [name, text] of Object.entries(makeTokenizerFiles())) expect(readFileSync(join(MOCK_TOKENIZER_DIR, name), 'utf8')).toBe(text);
  });

  it('puts <|begin_of_text|> first when special tokens are added, as Llama 3 does', () => {
    expect(tokenizer.encodeWhole('Hi', true)).toEqual([BOS, ...tokenizer.encodeWhole('Hi', false)]);
    expect(tokenizer.tokenString(BOS)).toBe('<|begin_of_text|>');
  });
});

describe('PromptTokenizer chat rendering', () => {
  const body = {
    messages: [
      { role: 'system', content: 'You are a helpful assistant.' },
      { role: 'user', content: '  What is the capital of France?\n' },
    ],
  };

  it('renders the template with the generation prompt and bos_token, contents trimmed by the template', () => {
    expect(tokenizer.renderChat(body)).toBe(
      '<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|>' +
        '<|start_header_id|>user<|end_header_id|>\n\nWhat is the capital of France?<|eot_id|>' +
        '<|start_header_id|>assistant<|end_header_id|>\n\n',
    );
  });

  it('tokenizes it without adding special tokens again (one BOS, from the template)', () => {
    const text = (s: string) => tokenizer.encodeWhole(s, false);
    expect(prompt(tokenizer.tokenize('chat', body))).toEqual([
      BOS,
      START_HEADER, ...text('system'), END_HEADER, NEWLINE, NEWLINE, ...text('You are a helpful assistant.'), EOT,
      START_HEADER, ...text('user'), END_HEADER, NEWLINE, NEWLINE, ...text('What is the capital of France?'), EOT,
      START_HEADER, ...text('assistant'), END_HEADER, NEWLINE, NEWLINE,
    ]);
    // Pinned, so a change to the fixture or the rendering shows here.
    expect(prompt(tokenizer.tokenize('chat', body))).toEqual([
      402, 404, 82, 377, 405, 198, 198, 56, 318, 322, 260, 220, 257, 75, 79, 69, 84, 75, 386, 13, 406, 404, 84, 321, 405, 198, 198, 54, 357,
      304, 258, 388, 292, 379, 30, 406, 404, 64, 82, 372, 405, 198, 198,
    ]);
  });

  it('follows add_generation_prompt, add_special_tokens and continue_final_message as vLLM does', () => {
    const full = prompt(tokenizer.tokenize('chat', body));
    const noPrompt = prompt(tokenizer.tokenize('chat', { ...body, add_generation_prompt: false }));
    expect(full.slice(0, noPrompt.length)).toEqual(noPrompt);
    expect(prompt(tokenizer.tokenize('chat', { ...body, add_special_tokens: true }))).toEqual([BOS, ...full]);

    const prefill = { messages: [...body.messages, { role: 'assistant', content: 'The capital is ' }], add_generation_prompt: false, continue_final_message: true };
    expect(tokenizer.renderChat(prefill)).toMatch(/<\|start_header_id\|>assistant<\|end_header_id\|>\n\nThe capital is$/);
    // vLLM defaults add_generation_prompt to true, and transformers refuses both.
    expect(tokenizer.tokenize('chat', { ...prefill, add_generation_prompt: undefined })).toEqual({ refused: 'invalid' });
  });

  it('joins text parts with a newline (the template reads content as a string) and refuses images', () => {
    const parts = { messages: [{ role: 'user', content: [{ type: 'text', text: 'a' }, { type: 'text', text: 'b' }] }] };
    expect(tokenizer.renderChat(parts)).toContain('<|end_header_id|>\n\na\nb<|eot_id|>');
    const image = { messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'data:' } }] }] };
    expect(tokenizer.tokenize('chat', image)).toEqual({ refused: 'unsupported' });
    expect(tokenizer.tokenize('chat', { ...body, chat_template: '{{ messages }}' })).toEqual({ refused: 'unsupported' });
  });

  it('hands the template the messages as vLLM converts them', () => {
    const dump = (template: string) => new PromptTokenizer({ ...files, config: { ...files.config, chat_template: template } });
    const messages = [
      { role: 'system', content: 'S', extra: 'dropped' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: '{"x":1}' } }, { id: 'c2', type: 'function', function: { name: 'g', arguments: '' } }] },
      { role: 'tool', tool_call_id: 'c1', content: [{ type: 'text', text: 'r1' }, { type: 'text', text: 'r2' }] },
      { role: 'user', name: 'ann', content: [{ type: 'input_text', text: 'a' }, { type: 'text', text: null }, 'b'] },
      { role: 'assistant', content: 'A', tool_calls: [], reasoning: 'R' },
    ];
    const asString = JSON.parse(dump('{{ messages | tojson }}').renderChat({ messages, add_generation_prompt: false }) as string);
    expect(asString).toEqual([
      { role: 'system', content: 'S' },
      { role: 'assistant', content: '', tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: { x: 1 } } }, { id: 'c2', type: 'function', function: { name: 'g', arguments: {} } }] },
      { role: 'tool', content: 'r1\nr2', tool_call_id: 'c1' },
      { role: 'user', content: 'a\nb', name: 'ann' },
      { role: 'assistant', content: 'A', reasoning: 'R', reasoning_content: 'R' },
    ]);
    // A template that loops over content parts gets parts (vLLM's "openai" content format), tool results excepted.
    const parts = dump("{% for m in messages %}{% if m.role != 'tool' %}{% for p in m['content'] %}{% endfor %}{% endif %}{% endfor %}{{ messages | tojson }}");
    const asParts = JSON.parse(parts.renderChat({ messages, add_generation_prompt: false }) as string);
    expect(asParts[0].content).toEqual([{ type: 'text', text: 'S' }]);
    expect(asParts[2].content).toBe('r1\nr2');
    expect(asParts[3].content).toEqual([{ type: 'text', text: 'a' }, { type: 'text', text: 'b' }]);
  });

  it('refuses tool call arguments that are not JSON, as vLLM answers 400 (chat_utils.py _postprocess_messages: json.loads)', () => {
    const call = (arguments_: unknown, type = 'function') => ({ messages: [{ role: 'assistant', content: null, tool_calls: [{ id: 'c', type, function: { name: 'f', arguments: arguments_ } }] }, { role: 'user', content: 'x' }] });
    expect(tokenizer.tokenize('chat', call('not json'))).toEqual({ refused: 'invalid' });
    expect(tokenizer.tokenize('chat', call(5))).toEqual({ refused: 'invalid' });
    expect(tokenizer.tokenize('chat', call('{}', 'custom'))).toEqual({ refused: 'invalid' });
    expect(tokenizer.tokenize('chat', call(''))).toHaveProperty('prompts');
  });

  it.each([
    ['no messages', {}],
    ['empty messages', { messages: [] }],
    ['a message without a role', { messages: [{ content: 'x' }] }],
    ['a numeric content', { messages: [{ role: 'user', content: 5 }] }],
    // 'yes' is true for vLLM's pydantic models (item 22.14); a word pydantic refuses is invalid.
    ['a non-boolean add_special_tokens', { ...body, add_special_tokens: 'maybe' }],
  ])('refuses %s as invalid', (_name, request) => {
    expect(tokenizer.tokenize('chat', request)).toEqual({ refused: 'invalid' });
  });

  it('answers template_error when the template raises', () => {
    const strict: TokenizerFiles = { ...files, config: { ...files.config, chat_template: "{{ raise_exception('roles must alternate') }}" } };
    expect(new PromptTokenizer(strict).tokenize('chat', body)).toEqual({ refused: 'template_error' });
  });

  it('refuses chat requests when the files have no chat template', () => {
    expect(new PromptTokenizer({ ...files, config: {} }).tokenize('chat', body)).toEqual({ refused: 'unsupported' });
  });
});

describe('PromptTokenizer completions prompts', () => {
  it('adds special tokens to a text prompt by default, not when asked not to', () => {
    const plain = tokenizer.encodeWhole('Once upon a time', false);
    expect(prompt(tokenizer.tokenize('completions', { prompt: 'Once upon a time' }))).toEqual([BOS, ...plain]);
    expect(prompt(tokenizer.tokenize('completions', { prompt: 'Once upon a time', add_special_tokens: false }))).toEqual(plain);
  });

  it('takes token arrays as they are, and batches prompt by prompt', () => {
    expect(tokenizer.tokenize('completions', { prompt: [5, 6, 7] })).toEqual({ prompts: [[5, 6, 7]] });
    expect(tokenizer.tokenize('completions', { prompt: ['a', [1, 2]] })).toEqual({ prompts: [[BOS, ...tokenizer.encodeWhole('a', false)], [1, 2]] });
  });

  it.each([[undefined], [[]], [[1.5]], [[-1]], [[[]]], [[{}]], [42]])('refuses prompt %j as invalid', (value) => {
    expect(tokenizer.tokenize('completions', { prompt: value })).toEqual({ refused: 'invalid' });
  });
});

describe('PromptTokenizer prefix cache', () => {
  const content = fc.oneof(
    fc.string({ unit: 'grapheme', maxLength: 40 }),
    fc.constantFrom('You are a helpful assistant.', '  spaced  ', '\n\n', '<|eot_id|>', 'a<|start_header_id|>b', '<|begin_of_text|>', ''),
  );
  const message = fc.record({ role: fc.constantFrom('system', 'user', 'assistant', 'tool'), content });
  const conversation = fc.array(message, { minLength: 1, maxLength: 6 });

  it('gives the same tokens as tokenizing the whole rendered text, over random conversations', () => {
    const cached = new PromptTokenizer(files, { selfCheckRequests: 0 });
    fc.assert(
      fc.property(conversation, fc.boolean(), (messages, addGenerationPrompt) => {
        const body = { messages, add_generation_prompt: addGenerationPrompt };
        const text = cached.renderChat(body) as string;
        expect(prompt(cached.tokenize('chat', body))).toEqual(cached.encodeWhole(text, false));
        expect(prompt(cached.tokenize('completions', { prompt: text }))).toEqual(cached.encodeWhole(text, true));
      }),
      { numRuns: 300 },
    );
    expect(cached.stats()).toMatchObject({ segmenting: true });
    expect(cached.stats().hits).toBeGreaterThan(0);
  });

  it('tokenizes a repeated system prompt once', () => {
    const cached = new PromptTokenizer(files);
    const system = { role: 'system', content: 'Shared instructions. '.repeat(200) };
    cached.tokenize('chat', { messages: [system, { role: 'user', content: 'first' }] });
    const before = cached.stats();
    cached.tokenize('chat', { messages: [system, { role: 'user', content: 'second' }] });
    const after = cached.stats();
    // Only the new user message is a miss; the system prompt and the headers are hits.
    expect(after.misses - before.misses).toBe(1);
    expect(after.hits - before.hits).toBeGreaterThanOrEqual(4);
  });

  it('keeps its memory within cacheBytes, dropping the least recently used', () => {
    const small = new PromptTokenizer(files, { cacheBytes: 20_000 });
    for (let i = 0; i < 200; i++) small.tokenize('chat', { messages: [{ role: 'user', content: `message number ${i} `.repeat(10) }] });
    expect(small.stats().cachedBytes).toBeLessThanOrEqual(20_000);
    expect(small.stats().cachedBytes).toBeGreaterThan(10_000);
  });

  it('refuses a request bringing more new text than maxUncachedChars, keeping what it tokenized for the next', () => {
    const budgeted = new PromptTokenizer(files, { maxUncachedChars: 1000 });
    const first = { role: 'system', content: 'a'.repeat(700) };
    const second = { role: 'user', content: 'b'.repeat(700) };
    const body = { messages: [first, second] };
    expect(budgeted.tokenize('chat', body)).toEqual({ refused: 'too_long' });
    // The system prompt was taken in: now only the user message is new, and fits.
    expect(prompt(budgeted.tokenize('chat', body))).toEqual(budgeted.encodeWhole(budgeted.renderChat(body) as string, false));
    expect(budgeted.tokenize('completions', { prompt: 'c'.repeat(1001) })).toEqual({ refused: 'too_long' });
    expect(budgeted.tokenize('completions', { prompt: ['d'.repeat(600), 'e'.repeat(600)] })).toEqual({ refused: 'too_long' });
    // Outside tokenize() (the agreement check, benchmarks) there is no budget.
    expect(budgeted.encode('f'.repeat(5000), false)).toHaveLength(budgeted.encodeWhole('f'.repeat(5000), false).length);
  });

  it('stops cutting, says so once, and answers whole-text tokens when a check disagrees', () => {
    const told: string[] = [];
    // A tokenizer whose whole-text result differs from its pieces' for one text.
    class Diverging extends PromptTokenizer {
      override encodeWhole(text: string, addSpecialTokens: boolean): number[] {
        const ids = super.encodeWhole(text, addSpecialTokens);
        return text.includes('DIVERGE<|eot_id|>') ? [...ids, 0] : ids;
      }
    }
    const diverging = new Diverging(files, { selfCheckRequests: 5, onSegmentMismatch: (text) => told.push(text) });
    expect(diverging.stats().segmenting).toBe(true);
    const body = { messages: [{ role: 'user', content: 'DIVERGE' }, { role: 'assistant', content: 'ok' }] };
    const text = diverging.renderChat(body) as string;
    expect(prompt(diverging.tokenize('chat', body))).toEqual(diverging.encodeWhole(text, false));
    expect(diverging.stats()).toMatchObject({ segmenting: false, cachedBytes: 0 });
    diverging.tokenize('chat', body);
    expect(told).toEqual([text]);
  });
});

describe('readTokenizerFiles', () => {
  it('reads a directory, tokenizer.json alone (its config beside it), or the two paths', () => {
    const json = join(MOCK_TOKENIZER_DIR, 'tokenizer.json');
    const config = join(MOCK_TOKENIZER_DIR, 'tokenizer_config.json');
    expect(readTokenizerFiles(json).config).toEqual(files.config);
    expect(readTokenizerFiles([json, config]).config).toEqual(files.config);
  });

  it('names the file that is missing or broken', () => {
    const dir = mkdtempSync(join(tmpdir(), 'tok-'));
    expect(() => readTokenizerFiles(dir)).toThrow(join(dir, 'tokenizer.json'));
    writeFileSync(join(dir, 'tokenizer.json'), '{');
    expect(() => readTokenizerFiles(dir)).toThrow(/tokenizer\.json is not JSON/);
    expect(() => readTokenizerFiles(join(MOCK_TOKENIZER_DIR, 'tokenizer_config.json'))).toThrow(/name tokenizer\.json/);
    // Without a config next to it, the tokenizer still loads (chat requests are then unsupported).
    writeFileSync(join(dir, 'tokenizer.json'), JSON.stringify(files.tokenizer));
    expect(new PromptTokenizer(readTokenizerFiles(dir)).hasChatTemplate).toBe(false);
  });
});

describe('loading @huggingface/tokenizers', () => {
  it('is lazy, and a missing package names the install command', () => {
    jest.isolateModules(() => {
      let loaded = false;
      jest.doMock('@huggingface/tokenizers', () => {
        loaded = true;
        throw new Error("Cannot find module '@huggingface/tokenizers'");
      });
      const { PromptTokenizer: Isolated } = require('../../../lib/exact-prefix/tokenizer/tokenizer') as typeof import('../../../lib/exact-prefix/tokenizer/tokenizer');
      expect(loaded).toBe(false);
      expect(() => new Isolated(files)).toThrow(/"@huggingface\/tokenizers", which could not be loaded .*Install it with: npm install @huggingface\/tokenizers$/);
    });
  });
});

describe('template arguments count against the budget before rendering (issue 46, reproduction 4)', () => {
  // A template that raises when rendered at all: a request refused before rendering is `too_long`, never `template_error`.
  const raising = new PromptTokenizer({ ...files, config: { ...files.config, chat_template: "{{ raise_exception('rendered') }}" } });
  const messages = [{ role: 'user', content: 'Which tool fits?' }];
  const tool = (i: number) => ({ type: 'function', function: { name: `tool_${i}`, description: `Looks up record ${i}`, parameters: { type: 'object', properties: { id: { type: 'string' } } } } });
  let nested: Record<string, unknown> = { type: 'string' };
  for (let depth = 0; depth < 2000; depth++) nested = { type: 'object', properties: { x: nested } };

  it.each([
    ['18,000 tools', { messages, tools: Array.from({ length: 18_000 }, (_, i) => tool(i)) }],
    ['30,000 documents', { messages, documents: Array.from({ length: 30_000 }, (_, i) => ({ title: `Doc ${i}`, text: 'A short document.' })) }],
    ['one tool nested 2,000 deep (12 KiB as the issue sent it)', { messages, tools: [{ type: 'function', function: { name: 'deep', parameters: nested } }] }],
    ['chat_template_kwargs of 20,000 objects', { messages, chat_template_kwargs: { catalog: Array.from({ length: 20_000 }, (_, i) => ({ sku: `sku-${i}` })) } }],
  ])('%s: refused (too_long, counted) without rendering, on any template', (_name, body) => {
    const counted = raising.stats().refusals.too_long;
    expect(raising.tokenize('chat', body)).toEqual({ refused: 'too_long' });
    expect(raising.stats().refusals.too_long).toBe(counted + 1);
    // The fixture's template reads none of them: rendering it would have been cheap to look at, and is still refused.
    expect(tokenizer.tokenize('chat', body)).toEqual({ refused: 'too_long' });
  });

  it('renders what fits: tools, documents and kwargs of ordinary size', () => {
    const body = { messages, tools: Array.from({ length: 20 }, (_, i) => tool(i)), documents: [{ title: 'a', text: 'b' }], chat_template_kwargs: { enable_thinking: false } };
    expect(raising.tokenize('chat', body)).toEqual({ refused: 'template_error' });
    expect(prompt(tokenizer.tokenize('chat', body)).length).toBeGreaterThan(0);
  });
});
