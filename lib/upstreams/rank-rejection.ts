import type { IncomingMessage } from 'node:http';
import { isEventStreamMediaType } from '../http/media-type';
import { parseOutOfRange } from './rank-header-check';

/** More than vLLM's error body or error event ever is; what is past it is not read. */
const MAX_ERROR_BYTES = 4096;
/** How vLLM begins a stream that failed before its first token: the error as the first event. */
const STREAM_ERROR = Buffer.from('data: {"error"');

/**
 * Watches an upstream's answer to a request that carried a rank header for vLLM's refusal of
 * it (vLLM 52a31cc): a 400 whose JSON body says `data_parallel_rank N is out of range [0, M).`
 * (the exception handler, vllm/entrypoints/openai/server_utils.py:378), or, for a stream, a 200
 * whose first event is that error (`create_streaming_error_response`, engine/serving.py:182;
 * chat_completion/serving.py:997-1004). Calls `found` with the value refused and the server's
 * engine count. Reads beside the proxy, which relays the answer unchanged; a stream is looked
 * at in its first chunk only.
 */
export function watchRankRejection(answer: IncomingMessage, found: (rank: number, numRanks: number) => void): void {
  const status = answer.statusCode;
  const type = answer.headers['content-type'];
  if (status === 400 && typeof type === 'string' && type.includes('json')) {
    collect(answer, found);
  } else if (status === 200 && isEventStreamMediaType(type)) {
    answer.once('data', (chunk: Buffer | string) => {
      const bytes = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
      if (bytes.length < STREAM_ERROR.length || !bytes.subarray(0, STREAM_ERROR.length).equals(STREAM_ERROR)) return;
      const event = bytes.indexOf('\n\n');
      if (event !== -1) report(bytes.subarray(0, event).toString('utf8'), found);
      else collect(answer, found, bytes);
    });
  }
}

/** Reads up to {@link MAX_ERROR_BYTES} of the answer beside the proxy, then looks for vLLM's words. */
function collect(answer: IncomingMessage, found: (rank: number, numRanks: number) => void, first?: Buffer): void {
  const chunks: Buffer[] = first === undefined ? [] : [first];
  let size = first?.length ?? 0;
  const take = (chunk: Buffer | string) => {
    const bytes = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
    chunks.push(bytes);
    size += bytes.length;
    if (size >= MAX_ERROR_BYTES) done();
  };
  const done = () => {
    answer.off('data', take);
    answer.off('end', done);
    report(Buffer.concat(chunks).subarray(0, MAX_ERROR_BYTES).toString('utf8'), found);
  };
  answer.on('data', take);
  answer.once('end', done);
}

function report(text: string, found: (rank: number, numRanks: number) => void): void {
  const refused = parseOutOfRange(text);
  if (refused !== undefined) found(refused.rank, refused.numRanks);
}
