/**
 * What a vLLM server says about the rank header the router sends it, and the fix to name. vLLM
 * 52a31cc reads `X-data-parallel-rank` as an index from 0 into the engines its API server
 * manages, `engine_ranks_managed = range(first, first + num_ranks)` (vllm/v1/engine/
 * core_client.py:596-606), answering `data_parallel_rank N is out of range [0, M).` past them
 * (vllm/v1/engine/input_processor.py:255-259); its `/metrics` label each engine with its global
 * rank (`engine="<rank>"`, vllm/v1/metrics/loggers.py:429-434, from the same list).
 */
import { isRecord } from '../guards';
import type { UpstreamConfig } from './upstream-options';

/**
 * vLLM's sentence for an out-of-range rank header, the whole of its error's `message`
 * (vllm/v1/engine/input_processor.py:255-259 at 52a31cc: `f"data_parallel_rank
 * {data_parallel_rank} is out of range [0, {num_ranks})."`). Anchored: a message that merely
 * contains the words (a validation error echoing a client's value) is not it.
 */
const OUT_OF_RANGE = /^data_parallel_rank (\d{1,10}) is out of range \[0, (\d{1,10})\)\.$/;

/**
 * The rank and engine count of vLLM's out-of-range error, read from its 400 JSON body or a
 * stream's first event (`data: {"error": …}`); `undefined` for anything else. The body is
 * parsed: vLLM's error shape (`{"error": {"message", "type": "BadRequestError", "code": 400}}`,
 * vllm/entrypoints/openai/engine/protocol.py:59-67) with the sentence as its message.
 */
export function parseOutOfRange(text: string): { rank: number; numRanks: number } | undefined {
  let json = text;
  if (text.startsWith('data: ')) {
    const end = text.indexOf('\n\n');
    json = text.slice(6, end === -1 ? text.length : end);
  }
  let body: unknown;
  try {
    body = JSON.parse(json);
  } catch {
    return undefined;
  }
  const error = isRecord(body) ? body.error : undefined;
  if (!isRecord(error) || error.type !== 'BadRequestError' || error.code !== 400 || typeof error.message !== 'string') return undefined;
  const found = OUT_OF_RANGE.exec(error.message);
  return found === null ? undefined : { rank: Number(found[1]), numRanks: Number(found[2]) };
}

/** The header value the router sends for global `rank` of `upstream`; `undefined` for none. */
function headerOf(upstream: UpstreamConfig, rank: number): number | undefined {
  return upstream.rankHeader === 'none' ? undefined : upstream.rankHeader === 'global' ? rank : rank - upstream.startRank;
}

/**
 * Whether the engines a server's `/metrics` name (global ranks, ascending) contradict how the
 * router reaches `upstream`'s ranks: a routed rank it does not run, or a header value that names
 * another engine than the rank's. Returns what to tell the operator, the fix included;
 * `undefined` when everything agrees (or no header is sent: `rankHeader: 'none'`).
 */
export function enginesProblem(upstream: UpstreamConfig, engines: readonly number[]): string | undefined {
  if (engines.length === 0 || upstream.rankHeader === 'none') return undefined;
  const first = engines[0];
  const last = engines[engines.length - 1];
  const serves = `its /metrics name engines ${first}–${last}, and vLLM reads X-data-parallel-rank as an index from 0 into those`;
  const missing = upstream.ranks.filter((rank) => !engines.includes(rank));
  if (missing.length > 0) {
    return `${serves}, but ranks ${missing.join(', ')} are configured: set startRank: ${first} and dataParallelSize: ${engines.length} (or ranks within ${first}–${last}), or discover: true`;
  }
  const wrong = upstream.ranks.find((rank) => headerOf(upstream, rank) !== rank - first);
  if (wrong === undefined) return undefined;
  const sent = headerOf(upstream, wrong)!;
  const fix = upstream.rankHeader === 'global' ? `set rankHeader: 'local'${upstream.startRank === first ? '' : ` and startRank: ${first}`}` : `set startRank: ${first}`;
  return `${serves}: rank ${wrong} is sent as ${sent}, which is engine ${first + sent}: ${fix}`;
}

/** The fix for an upstream whose server answered that header value `sent` is out of `[0, numRanks)`. */
export function outOfRangeProblem(upstream: UpstreamConfig, rank: number, sent: number, numRanks: number): string {
  const said = `it answered "data_parallel_rank ${sent} is out of range [0, ${numRanks})." for rank ${rank}: vLLM reads X-data-parallel-rank as an index from 0 into the ${numRanks} engine${numRanks === 1 ? '' : 's'} that server manages`;
  if (upstream.rankHeader === 'global') return `${said}: set rankHeader: 'local' with startRank at that server's first engine (--data-parallel-start-rank, or --data-parallel-rank for one engine)`;
  return `${said}: set startRank to its first engine and dataParallelSize: ${numRanks} (its /metrics engine labels name them), or discover: true`;
}
