/**
 * The mock's endpoints that vLLM does not route by `X-data-parallel-rank`: the Responses API and
 * the pooling family. At vLLM 52a31cc only chat, completions (and its batch form), `/v1/messages`
 * and `/inference/v1/generate` pass the header to the engine (`_get_data_parallel_rank`, read in
 * vllm/entrypoints/openai/chat_completion/serving.py:278, completion/serving.py:154,
 * chat_completion/batch_serving.py:146, serve/disagg/serving.py:213; `/v1/messages` goes through
 * chat, anthropic/serving.py:449). These answer from the engine vLLM's own balancing picks, the
 * least loaded, whatever the header says, with small bodies of each API's shape.
 */
import { randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { MockEngine } from './engine';
import { readJsonBody, sendError, sendJson, SSE_HEADERS } from './http';
import { unknownModelMessage } from './models';

/** What a self-balanced endpoint answers. */
export type SelfBalancedKind = 'embeddings' | 'pooling' | 'score' | 'rerank' | 'classify' | 'responses';

/** vLLM 52a31cc's paths of the endpoints that ignore the rank header, by kind (their api_router.py files). */
export const SELF_BALANCED_PATHS: ReadonlyMap<string, SelfBalancedKind> = new Map([
  ['/v1/embeddings', 'embeddings'],
  ['/v2/embed', 'embeddings'],
  ['/pooling', 'pooling'],
  ['/score', 'score'],
  ['/v1/score', 'score'],
  ['/rerank', 'rerank'],
  ['/v1/rerank', 'rerank'],
  ['/v2/rerank', 'rerank'],
  ['/classify', 'classify'],
  ['/v1/responses', 'responses'],
]);

/** Serves one self-balanced request on the least loaded engine, answering which served it in `x-mock-rank`. */
export async function serveSelfBalanced(kind: SelfBalancedKind, model: string, engine: MockEngine, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const read = await readJsonBody(req, res);
  if (read === undefined) return;
  const unknownModel = unknownModelMessage(model, read.body);
  if (unknownModel !== undefined) return sendError(res, 404, unknownModel, 'model');
  const body = (typeof read.body === 'object' && read.body !== null ? read.body : {}) as Record<string, unknown>;
  if (res.destroyed) return;
  const rank = engine.pickLeastLoaded();
  const inputs = inputsOf(kind, body);
  const { promptTokens } = engine.admit(rank, inputs);
  res.once('close', () => engine.release(rank));
  const headers = { 'x-mock-rank': String(rank.globalRank) };
  const created = Math.floor(Date.now() / 1000);
  const usage = { prompt_tokens: promptTokens, total_tokens: promptTokens };
  const id = `${kind}-${randomUUID().replace(/-/g, '')}`;
  if (kind === 'responses') {
    const text = `rank ${rank.globalRank}:`;
    const response = {
      id: `resp_${randomUUID().replace(/-/g, '')}`,
      object: 'response',
      created_at: created,
      model,
      status: 'completed',
      output: [{ type: 'message', id: `msg_${randomUUID().replace(/-/g, '')}`, role: 'assistant', status: 'completed', content: [{ type: 'output_text', text, annotations: [] }] }],
      usage: { input_tokens: promptTokens, output_tokens: 1, total_tokens: promptTokens + 1 },
    };
    if (body.stream !== true) return sendJson(res, 200, JSON.stringify(response), headers);
    res.writeHead(200, { ...SSE_HEADERS, ...headers });
    res.write(`event: response.created\ndata: ${JSON.stringify({ type: 'response.created', sequence_number: 0, response: { ...response, status: 'in_progress', output: [] } })}\n\n`);
    res.end(`event: response.completed\ndata: ${JSON.stringify({ type: 'response.completed', sequence_number: 1, response })}\n\n`);
    return;
  }
  const data = inputs.map((_, index) => itemOf(kind, index, rank.globalRank, body.encoding_format === 'base64'));
  if (kind === 'rerank') return sendJson(res, 200, JSON.stringify({ id, model, usage: { total_tokens: promptTokens }, results: data }), headers);
  sendJson(res, 200, JSON.stringify({ id, object: 'list', created, model, data, usage }), headers);
}

/** The texts a request names (each counts as a prompt on the engine). */
function inputsOf(kind: SelfBalancedKind, body: Record<string, unknown>): string[] {
  const field = kind === 'responses' ? body.input : kind === 'rerank' ? body.documents : kind === 'score' ? (body.text_2 ?? body.data_2) : (body.input ?? body.messages);
  const list = Array.isArray(field) ? field : [field];
  return list.map((item) => (typeof item === 'string' ? item : JSON.stringify(item ?? '')));
}

function itemOf(kind: Exclude<SelfBalancedKind, 'responses'>, index: number, rank: number, base64: boolean): object {
  switch (kind) {
    case 'embeddings': {
      const vector = [rank, index, 0.5];
      // The openai client asks for base64 (little-endian float32), as vLLM serves it too.
      return { index, object: 'embedding', embedding: base64 ? Buffer.from(new Float32Array(vector).buffer).toString('base64') : vector };
    }
    case 'pooling':
      return { index, object: 'pooling', data: [rank, index, 0.5] };
    case 'score':
      return { index, object: 'score', score: 0.5 };
    case 'rerank':
      return { index, document: { text: '' }, relevance_score: 0.5 };
    case 'classify':
      return { index, label: 'LABEL_0', probs: [0.5, 0.5], num_classes: 2 };
  }
}
