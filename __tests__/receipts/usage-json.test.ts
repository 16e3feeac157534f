import { describe, expect, it } from '@jest/globals';
import { AnswerTail, lastUsage, TAIL_BYTES } from '../../lib/receipts/usage-json';

// vLLM 52a31cc's non-streamed chat answer: `usage` (UsageInfo, engine/protocol.py:105-109) and
// after it the members ChatCompletionResponse adds (chat_completion/serving.py:1392-1404).
const answer = (usage: string) =>
  `{"id":"chatcmpl-1","object":"chat.completion","created":1790000000,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"\\"usage\\":{\\"prompt_tokens\\":1}","tool_calls":[]},"logprobs":null,"finish_reason":"length","stop_reason":null}],"service_tier":null,"system_fingerprint":"vllm-fp","usage":${usage},"prompt_logprobs":null,"prompt_token_ids":null,"kv_transfer_params":null}`;

describe('lastUsage', () => {
  it.each([
    ['with cached tokens', '{"prompt_tokens":40,"total_tokens":42,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":32}}', { promptTokens: 40, cachedTokens: 32 }],
    ['without prompt_tokens_details (nothing cached, or not reported)', '{"prompt_tokens":40,"total_tokens":42,"completion_tokens":2}', { promptTokens: 40, cachedTokens: undefined }],
    ['with details but no count', '{"prompt_tokens":40,"total_tokens":42,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":null}}', { promptTokens: 40, cachedTokens: undefined }],
  ])('reads a JSON answer %s', (_name, usage, expected) => {
    expect(lastUsage(answer(usage))).toEqual(expected);
  });

  it("reads a stream's last usage (continuous stats before it carry none of the details)", () => {
    const stream =
      'data: {"id":"c","choices":[{"index":0,"delta":{"content":"a"}}],"usage":{"prompt_tokens":9,"total_tokens":10,"completion_tokens":1}}\n\n' +
      'data: {"id":"c","choices":[],"usage":{"prompt_tokens":9,"total_tokens":11,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}\n\ndata: [DONE]\n\n';
    expect(lastUsage(stream)).toEqual({ promptTokens: 9, cachedTokens: 0 });
  });

  it.each([
    ['no usage', '{"choices":[]}'],
    ['a usage cut off', '{"usage":{"prompt_tokens":40,"total'],
    ['a count that is no count', '{"usage":{"prompt_tokens":-1}}'],
    ['a hostile length', `{"usage":{"prompt_tokens":1,"x":"${'a'.repeat(4096)}"}}`],
  ])('reads nothing from %s', (_name, text) => {
    expect(lastUsage(text)).toBeUndefined();
  });
});

describe('AnswerTail', () => {
  it('keeps the last bytes of an answer, however it was cut', () => {
    const text = answer('{"prompt_tokens":7,"total_tokens":8,"completion_tokens":1}').padStart(3 * TAIL_BYTES, ' ');
    for (const size of [1, 7, 100, TAIL_BYTES + 1]) {
      const tail = new AnswerTail();
      for (let at = 0; at < text.length; at += size) tail.add(Buffer.from(text.slice(at, at + size)));
      expect(tail.text()).toBe(text.slice(-TAIL_BYTES));
    }
    expect(new AnswerTail().text()).toBe('');
  });
});
