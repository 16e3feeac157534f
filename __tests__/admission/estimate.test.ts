import { describe, expect, it } from '@jest/globals';
import { estimate, reservationOf } from '../../lib/admission/estimate';

/** The prompt's share of a reservation: four body bytes a token. */
const prompt = (body: string) => Math.ceil(Buffer.byteLength(body) / 4);

describe('reservationOf', () => {
  it.each([
    ['max_completion_tokens before max_tokens, as vLLM reads them', '{"messages":[],"max_tokens":50,"max_completion_tokens":70}', 70],
    ['max_tokens alone', '{"prompt":"hi","max_tokens" : 12}', 12],
    ['neither: the prompt alone', '{"prompt":"hi"}', 0],
    ['a schema property of that name is passed over', '{"response_format":{"schema":{"properties":{"max_tokens":{"type":"integer"}}}},"max_tokens":9}', 9],
    ['a name inside a string is not a member', '{"prompt":"say \\"max_tokens\\": 99","max_tokens":3}', 3],
    ['a number that is not an integer counts as none', '{"max_tokens":1.5}', 0],
  ])('%s', (_label, body, completion) => {
    expect(reservationOf(Buffer.byteLength(body), Buffer.from(body))).toBe(prompt(body) + completion);
  });

  it('takes the prompt from the bytes alone when the router does not hold the body', () => {
    expect(reservationOf(120_000, undefined)).toBe(30_000);
    expect(estimate(120_000, 7)).toBe(30_007);
  });
});

describe('reservationOf: the limits vLLM reads (48.9)', () => {
  const reserved = (body: string) => reservationOf(Buffer.byteLength(body), Buffer.from(body)) - prompt(body);

  // vLLM generates up to the limit for each of `n` choices: `n` is passed to SamplingParams
  // (chat_completion/protocol.py:199 and :616, completion/protocol.py:59 and :316 at 52a31cc).
  it.each([
    ['chat, n = 8', '{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":100,"n":8}', 800],
    ['completions, n = 3', '{"prompt":"hi","max_tokens":50,"n":3}', 150],
    ['n before the limit', '{"n":4,"prompt":"hi","max_tokens":10}', 40],
    ['n = 0, which vLLM refuses, counts as one choice', '{"prompt":"hi","max_tokens":10,"n":0}', 10],
  ])('48.9: a reservation counts n choices: %s', (_label, body, completion) => {
    expect(reserved(body)).toBe(completion);
  });

  it.each([
    ['a decoy in vllm_xargs before the top-level limit', '{"vllm_xargs":{"max_tokens":1},"prompt":"hi","max_tokens":1000}', 1000],
    ['a decoy n inside an object', '{"prompt":"hi","max_tokens":10,"vllm_xargs":{"n":1},"n":5}', 50],
    ['max_completion_tokens nested, max_tokens at the top', '{"metadata":{"max_completion_tokens":2},"messages":[],"max_tokens":700}', 700],
    ['a repeated member: the last, as Python keeps', '{"prompt":"hi","max_tokens":1,"max_tokens":900}', 900],
    ['only a nested one: none', '{"prompt":"hi","extra":{"max_tokens":900}}', 0],
  ])('48.9: only top-level members are read: %s', (_label, body, completion) => {
    expect(reserved(body)).toBe(completion);
  });

  // pydantic's lax mode (vLLM's request models set no `strict`: engine/protocol.py:27-29 at
  // 52a31cc) turns each of these into an int; checked with pydantic 2.13.
  it.each([
    ['"1000"', 1000],
    ['" 1000 "', 1000],
    ['"1_000"', 1000],
    ['"1000.0"', 1000],
    ['1000.0', 1000],
    ['1e3', 1000],
  ])('48.9: a limit written as pydantic reads it, %s, is read', (value, completion) => {
    expect(reserved(`{"prompt":"hi","max_tokens":${value},"n":"2"}`)).toBe(2 * completion);
  });

  it('48.9: a body that repeats a limit past the scanner’s bound reserves the whole budget', () => {
    const body = `{"prompt":"hi",${'"max_tokens":1,'.repeat(17)}"n":1}`;
    expect(reservationOf(Buffer.byteLength(body), Buffer.from(body))).toBe(Infinity);
  });

  it('48.9: the members routing decoded are read the same way', () => {
    const body = '{"vllm_xargs":{"max_tokens":1},"prompt":"hi","max_tokens":100,"n":8}';
    expect(reservationOf(Buffer.byteLength(body), Buffer.from(body), JSON.parse(body) as Record<string, unknown>)).toBe(prompt(body) + 800);
  });
});
