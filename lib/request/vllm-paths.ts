/**
 * The paths where vLLM does not route by `X-data-parallel-rank`: requests there reach an engine
 * that vLLM's own balancing picks, whatever the header says. At vLLM 52a31cc only chat
 * completions (and `/v1/chat/completions/batch`), completions, `/v1/messages` (Anthropic, through
 * chat) and `/inference/v1/generate` read the header (`_get_data_parallel_rank`,
 * vllm/entrypoints/openai/engine/serving.py:406, called from chat_completion/serving.py:278,
 * chat_completion/batch_serving.py:146, completion/serving.py:154, serve/disagg/serving.py:213;
 * anthropic/serving.py:449 goes through chat). These engine-bound endpoints never call it
 * (their api_router.py files): the Responses API, the pooling family (embeddings, pooling,
 * score, rerank, classify), generative scoring, and audio transcription and translation.
 * Everything else keeps its rank claim: `/tokenize`, `/v1/models` and the like reach no engine.
 */
const BALANCED_BY_VLLM: ReadonlySet<string> = new Set([
  '/v1/responses',
  '/v1/embeddings',
  '/v2/embed',
  '/pooling',
  '/score',
  '/v1/score',
  '/rerank',
  '/v1/rerank',
  '/v2/rerank',
  '/classify',
  '/generative_scoring',
  '/v1/audio/transcriptions',
  '/v1/audio/translations',
]);

/** `GET /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`: the Responses API's own. */
const RESPONSES = '/v1/responses/';

/** Whether vLLM balances a request to `url` (path and query, as the client sent it) itself. */
export function balancedByVllm(url: string): boolean {
  const query = url.indexOf('?');
  const path = query === -1 ? url : url.slice(0, query);
  return BALANCED_BY_VLLM.has(path) || path.startsWith(RESPONSES);
}
