import { describe, expect, it } from '@jest/globals';
import { UsageScan } from '../../lib/admission/usage-tap';

/** `text` fed in chunks cut at `cuts`. */
function scan(text: string, cuts: number[] = []): UsageScan {
  const bytes = Buffer.from(text);
  const usage = new UsageScan();
  let from = 0;
  for (const cut of [...cuts, bytes.length]) {
    usage.feed(bytes.subarray(from, cut));
    from = cut;
  }
  return usage;
}

const event = (data: object) => `data: ${JSON.stringify(data)}\n\n`;
const chunk = (content: string, usage?: object) => event({ id: 'cmpl-1', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: { content } }], ...(usage && { usage }) });
const usage = (total: number) => ({ prompt_tokens: total - 3, total_tokens: total, completion_tokens: 3, prompt_tokens_details: { cached_tokens: 16 } });

describe('UsageScan', () => {
  // A stream as vLLM sends it with include_usage: the last chunk has empty choices and the usage.
  const stream = chunk('Hello') + chunk(' world') + event({ id: 'cmpl-1', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [], usage: usage(123456) }) + 'data: [DONE]\n\n';

  it('finds the final usage whatever byte the chunks are cut at, one cut or two', () => {
    const bytes = Buffer.byteLength(stream);
    for (let cut = 1; cut < bytes; cut++) expect([cut, scan(stream, [cut]).total]).toEqual([cut, 123456]);
    const start = stream.indexOf('"usage"');
    for (let first = start - 3; first < start + 40; first++) {
      for (let second = first + 1; second < start + 60; second++) expect([first, second, scan(stream, [first, second]).total]).toEqual([first, second, 123456]);
    }
  });

  it('takes the last of several (continuous_usage_stats), across chunks', () => {
    const text = chunk('a', usage(10)) + chunk('b', usage(11)) + chunk('c', usage(12));
    expect(scan(text).total).toBe(12);
    const last = text.lastIndexOf('"total_tokens"');
    for (let cut = last - 10; cut < last + 20; cut++) expect(scan(text, [cut]).total).toBe(12);
  });

  it('keeps the last complete total when a newer usage is cut short with the answer', () => {
    const text = chunk('a', usage(10)) + 'data: {"choices":[],"usage":{"prompt_tokens":7,"total_tok';
    expect(scan(text).total).toBe(10);
    expect(scan(text, [text.length - 5]).total).toBe(10);
  });

  it('reads nothing into a token, a null usage, or total_tokens of an object nested in usage', () => {
    expect(scan(chunk('"usage":{"total_tokens":99}')).total).toBeUndefined();
    expect(scan(event({ choices: [], usage: null })).total).toBeUndefined();
    expect(scan(event({ prompt_logprobs: [null, { 5: { logprob: -1, decoded_token: 'usage' } }] })).total).toBeUndefined();
    expect(scan('{"usage": {"details": {"total_tokens": 5}, "total_tokens" : 8}}').total).toBe(8);
    expect(scan('{"usage":{"prompt_tokens":1}}').total).toBeUndefined();
  });

  it('counts stream events for the estimate by their blank lines, wherever the chunks are cut', () => {
    // Three events and `data: [DONE]`.
    for (let cut = 1; cut < stream.length; cut++) expect([cut, scan(stream, [cut]).events]).toEqual([cut, 4]);
    for (let cut = 1; cut < stream.length - 1; cut++) expect([cut, scan(stream, [cut, cut + 1]).events]).toEqual([cut, 4]);
    expect(scan('{"usage":{"total_tokens":5}}').events).toBe(0);
  });
});
