import { expect } from '@jest/globals';
import type { EndpointSnapshot } from '../../lib';
import type { TestGateway } from '../helpers';

/** What `gateway` counts on `rank` (its own requests and its peers'). */
export const rankOf = (gateway: TestGateway, rank: number): EndpointSnapshot => gateway.router.endpoints().find((endpoint) => endpoint.rank === rank)!;

/** A streamed completion through `gateway`; resolves with the abort, the status and the first chunk once the headers are in. */
export async function stream(gateway: TestGateway, prompt: string, maxTokens: number, headers: Record<string, string> = {}) {
  const abort = new AbortController();
  const response = await fetch(`${gateway.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: 'mock-model', prompt, max_tokens: maxTokens, stream: true }),
    signal: abort.signal,
  });
  const reader = response.body!.getReader();
  return {
    abort: () => abort.abort(),
    status: response.status,
    rest: async () => {
      let text = '';
      for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) text += Buffer.from(chunk.value).toString();
      return text;
    },
    first: () => reader.read(),
  };
}

/** The rank that answered a one-token completion through `gateway` (the mock names it in the text). */
export async function answeredBy(gateway: TestGateway): Promise<number> {
  const response = await fetch(`${gateway.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'mock-model', prompt: 'hi', max_tokens: 1 }),
  });
  expect(response.status).toBe(200);
  const body = (await response.json()) as { choices: Array<{ text: string }> };
  return Number(/^rank (\d+):/.exec(body.choices[0].text)![1]);
}
