import { startMockVllm } from '../../example-server/mock-vllm';
import { estimate } from '../../lib/admission/estimate';

const WORDS = 'the quick brown fox jumps over the lazy dog while a data parallel engine serves many tenants at once '.split(' ');

/**
 * How far the token estimate for a stream without `usage` (body bytes / 4 + one token per
 * event) is from vLLM-style usage, with the mock tokenizing as the router's tokenizer does
 * (`kvEvents`: real token counts): relative error per request, for chat and completions.
 */
export async function estimateError(samples = 40): Promise<{ kind: string; mean: number; min: number; max: number }[]> {
  const mock = await startMockVllm({ dataParallelSize: 1, kvEvents: {} });
  try {
    const rows = [];
    for (const kind of ['completions', 'chat'] as const) {
      const errors: number[] = [];
      for (let i = 0; i < samples; i++) {
        const words = Array.from({ length: 5 + ((i * 37) % 400) }, (_, j) => WORDS[(i + j * 7) % WORDS.length]).join(' ');
        const maxTokens = 8 + ((i * 13) % 120);
        const base = kind === 'chat' ? { model: 'mock-model', messages: [{ role: 'user', content: words }], max_tokens: maxTokens } : { model: 'mock-model', prompt: words, max_tokens: maxTokens };
        const path = kind === 'chat' ? '/v1/chat/completions' : '/v1/completions';
        const streamBody = JSON.stringify({ ...base, stream: true });
        const streamed = await (await fetch(`${mock.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: streamBody })).text();
        const events = streamed.split('data: {').length - 1;
        const answered = (await (await fetch(`${mock.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(base) })).json()) as { usage: { total_tokens: number } };
        const truth = answered.usage.total_tokens;
        errors.push((estimate(Buffer.byteLength(streamBody), events) - truth) / truth);
      }
      rows.push({ kind, mean: errors.reduce((a, b) => a + b, 0) / errors.length, min: Math.min(...errors), max: Math.max(...errors) });
    }
    return rows;
  } finally {
    await mock.close();
  }
}
