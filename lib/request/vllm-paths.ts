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
 *
 * SageMaker's `/invocations` hands a body to the first handler whose request type it validates as
 * (vllm/entrypoints/sagemaker/api_router.py:55-87): on a generative model chat, then completions
 * (openai/generate/factories.py:23-40), which read the header; on a pooling model embeddings,
 * classify, rerank or score (pooling/factories.py:214-254), which do not. So a rank is claimed
 * there only for a body the router decoded that names `messages` (`ChatCompletionRequest`
 * requires them, chat_completion/protocol.py:187) or `prompt`/`prompt_embeds` (one of which
 * `CompletionRequest` requires, completion/protocol.py:438-453); any other body, or one not
 * decoded, goes as vLLM balances it.
 *
 * The path judged is the one vLLM routes: uvicorn percent-decodes the request target's path
 * before Starlette matches routes on it (`urllib.parse.unquote`, in uvicorn's h11_impl.py and
 * httptools_impl.py), so `/v1%2Fembeddings` and `/%761/rerank` are vLLM's embeddings and rerank.
 * Like `unquote`, an escape that is not `%` and two hex digits stays as written (vLLM matches no
 * route then, and answers 404 to whatever rank).
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

/** SageMaker's entry point: balanced or not by the body it carries. */
const INVOCATIONS = '/invocations';

/**
 * Whether vLLM balances a request to `url` (path and query, as the client sent it) itself;
 * `members`: its body's, when the router decoded it whole.
 */
export function balancedByVllm(url: string, members?: Readonly<Record<string, unknown>>): boolean {
  const query = url.indexOf('?');
  let path = query === -1 ? url : url.slice(0, query);
  if (path.includes('%')) path = unquoted(path);
  if (path === INVOCATIONS) return members === undefined || (members.messages === undefined && members.prompt === undefined && members.prompt_embeds === undefined);
  return BALANCED_BY_VLLM.has(path) || path.startsWith(RESPONSES);
}

/** `path` percent-decoded as Python's `urllib.parse.unquote` does: `%XX` to its byte, as UTF-8 (invalid sequences replaced), anything else as written. */
export function unquoted(path: string): string {
  const bytes: number[] = [];
  for (let at = 0; at < path.length; at++) {
    const code = path.charCodeAt(at);
    if (code === 0x25 && isHex(path.charCodeAt(at + 1)) && isHex(path.charCodeAt(at + 2))) {
      bytes.push(parseInt(path.slice(at + 1, at + 3), 16));
      at += 2;
    } else if (code < 0x80) bytes.push(code);
    // Node's parser takes no byte past ASCII in a request target; were one there, it is kept as UTF-8.
    else for (const byte of Buffer.from(path[at], 'utf8')) bytes.push(byte);
  }
  return Buffer.from(bytes).toString('utf8');
}

function isHex(code: number): boolean {
  return (code >= 0x30 && code <= 0x39) || (code >= 0x41 && code <= 0x46) || (code >= 0x61 && code <= 0x66);
}
