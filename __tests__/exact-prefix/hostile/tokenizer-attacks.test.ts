import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { describe, expect, it } from '@jest/globals';
import { MOCK_TOKENIZER_DIR } from '../../../example-server/mock-vllm/tokenize';
import { PromptTokenizer, readTokenizerFiles } from '../../../lib/exact-prefix/tokenizer/tokenizer';

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;
const files = readTokenizerFiles(MOCK_TOKENIZER_DIR);

function heapAfterGc(): number {
  gc();
  gc();
  return process.memoryUsage().heapUsed;
}

describe('PromptTokenizer under hostile prompts', () => {
  it('a cached piece does not keep the long prompt it was cut from alive (item 22.1)', () => {
    const tokenizer = new PromptTokenizer(files, { selfCheckRequests: 0 });
    const before = heapAfterGc();
    for (let i = 0; i < 40; i++) {
      // A short new piece, an added token, then 1 MB the budget refuses.
      const prompt = `a short new piece ${i % 20} of text<|eot_id|>${String(i).padEnd(1 << 20, 'y')}`;
      // The second 20 hit the cache: a hit must not re-key the entry with the new slice either.
      expect(tokenizer.tokenize('completions', { prompt })).toEqual({ refused: 'too_long' });
    }
    const held = heapAfterGc() - before;
    const counted = tokenizer.stats().cachedBytes;
    expect(counted).toBeLessThan(16 * 1024);
    // Slices of the prompts as keys held 40 MiB here.
    expect(held).toBeLessThan(4 * 1024 * 1024);
  });

  it('refuses too many messages before rendering the template (item 22.4)', () => {
    const tokenizer = new PromptTokenizer(files);
    const messages = Array.from({ length: 50_000 }, (_, i) => ({ role: i % 2 === 0 ? 'user' : 'assistant', content: 'hi' }));
    const started = process.hrtime.bigint();
    expect(tokenizer.tokenize('chat', { messages })).toEqual({ refused: 'too_long' });
    const ms = Number(process.hrtime.bigint() - started) / 1e6;
    // Rendered first, 50,000 messages took over a second before the budget refused them.
    expect(ms).toBeLessThan(100);
    // Within the bound, a chat is still tokenized.
    expect('prompts' in tokenizer.tokenize('chat', { messages: messages.slice(0, 64) })).toBe(true);
  });

  it('refuses more content than 16 budgets before rendering it', () => {
    const tokenizer = new PromptTokenizer(files, { maxUncachedChars: 1024 });
    const content = 'z'.repeat(9 * 1024);
    expect(tokenizer.tokenize('chat', { messages: [{ role: 'user', content }, { role: 'user', content }] })).toEqual({ refused: 'too_long' });
  });

  it('a request costs at most its budget of new text, the first requests\' whole-text check included (item 22.15)', () => {
    // What the library itself tokenizes per request, counted in UTF-8 bytes.
    let wholeBytes = 0;
    class Counting extends PromptTokenizer {
      override encodeWhole(text: string, addSpecialTokens: boolean): number[] {
        wholeBytes += Buffer.byteLength(text, 'utf8');
        return super.encodeWhole(text, addSpecialTokens);
      }
    }
    const tokenizer = new Counting(files);
    const budget = 32_768;
    // The defaults: a budget of new ASCII text fits, one byte more does not.
    expect('prompts' in tokenizer.tokenize('completions', { prompt: 'q'.repeat(budget) })).toBe(true);
    expect(tokenizer.tokenize('completions', { prompt: 'r'.repeat(budget + 1) })).toEqual({ refused: 'too_long' });
    // Three budgets of CJK prose (96 KiB): refused while new, taken in over a few requests, then
    // answered from the cache. Checked whole once cached, it cost three budgets (165 ms of CPU
    // against a request's ~50) on each of the first 32 requests.
    const text = Array.from({ length: budget }, (_, i) => (i % 17 === 16 ? '，' : '的一是不了人我在有他这中大来上国'[(i * 7) % 16])).join('');
    let outcome = tokenizer.tokenize('completions', { prompt: text });
    for (let tries = 0; !('prompts' in outcome) && tries < 8; tries++) outcome = tokenizer.tokenize('completions', { prompt: text });
    expect('prompts' in outcome).toBe(true);
    const checksLeft = tokenizer.stats().selfChecksLeft;
    wholeBytes = 0;
    expect(tokenizer.tokenize('completions', { prompt: text })).toEqual(outcome);
    expect(wholeBytes).toBe(0);
    // Left to a request it fits in.
    expect(tokenizer.stats().selfChecksLeft).toBe(checksLeft);
    expect(checksLeft).toBeGreaterThan(0);
    tokenizer.tokenize('completions', { prompt: 'a short prompt that fits' });
    expect(tokenizer.stats().selfChecksLeft).toBe(checksLeft - 1);
    expect(wholeBytes).toBeGreaterThan(0);
    expect(wholeBytes).toBeLessThanOrEqual(budget);
  });

  it('renders at most 1,024 messages of a chat request, each charged 16 bytes of the budget (4,096 took 100 ms)', () => {
    const tokenizer = new PromptTokenizer(files);
    const messages = Array.from({ length: 1_025 }, (_, i) => ({ role: i % 2 === 0 ? 'user' : 'assistant', content: `hi ${i % 50}` }));
    expect(tokenizer.tokenize('chat', { messages })).toEqual({ refused: 'too_long' });
    expect('prompts' in tokenizer.tokenize('chat', { messages: messages.slice(0, 1_024) })).toBe(true);
    // 1,024 messages leave half the budget (16 KiB) for new text: rendering them costs about
    // what tokenizing that half does.
    const last = (content: string) => [...messages.slice(0, 1_023), { role: 'user', content }];
    expect('prompts' in tokenizer.tokenize('chat', { messages: last('s'.repeat(16_000)) })).toBe(true);
    expect(tokenizer.tokenize('chat', { messages: last('t'.repeat(16_500)) })).toEqual({ refused: 'too_long' });
    expect('prompts' in tokenizer.tokenize('chat', { messages: [{ role: 'user', content: 't'.repeat(16_500) }] })).toBe(true);
  });

  it("coerces add_generation_prompt and add_special_tokens as vLLM's pydantic models do (item 22.14)", () => {
    const tokenizer = new PromptTokenizer(files);
    const messages = [{ role: 'user', content: 'What is the capital of France?' }];
    const truthy = tokenizer.tokenize('chat', { messages, add_generation_prompt: true });
    // pydantic (lax mode): bool('1'), 'true', 'yes', 'on' (any case) and 1 are True; their opposites False.
    for (const value of [1, 'true', 'yes', 'On', 'Y']) expect(tokenizer.tokenize('chat', { messages, add_generation_prompt: value })).toEqual(truthy);
    const falsy = tokenizer.tokenize('chat', { messages, add_generation_prompt: false });
    for (const value of [0, 'false', 'no', 'OFF']) expect(tokenizer.tokenize('chat', { messages, add_generation_prompt: value })).toEqual(falsy);
    expect(tokenizer.tokenize('chat', { messages, add_generation_prompt: 'maybe' })).toEqual({ refused: 'invalid' });
    expect(tokenizer.tokenize('completions', { prompt: 'x y', add_special_tokens: 'no' })).toEqual(tokenizer.tokenize('completions', { prompt: 'x y', add_special_tokens: false }));
  });
});
