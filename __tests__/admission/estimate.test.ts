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
