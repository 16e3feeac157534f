import type { IncomingMessage } from 'node:http';

/** Bytes kept from the end of an answer: vLLM puts `usage` last, in the JSON body and in a stream's final chunk. */
const TAIL_BYTES = 4096;
const TOTAL_TOKENS = /"total_tokens"\s*:\s*(\d+)/g;
const EVENT = Buffer.from('data: {');

/**
 * Reads what one answer cost in tokens, beside the proxy's own pipe (a second `data` listener,
 * nothing buffered beyond {@link TAIL_BYTES}): the `usage.total_tokens` vLLM reports in a JSON
 * answer or in a stream's final chunk (`stream_options.include_usage`). A stream without usage
 * is estimated: one token per event (vLLM sends one per decode step) plus the prompt at four
 * body bytes a token (docs/operating.md, "Admission control", gives the measured error).
 * `done` gets the count once, when the answer ends or is cut.
 */
export function tapUsage(answer: IncomingMessage, requestBytes: number, done: (tokens: number) => void): void {
  let tail: Buffer = EMPTY;
  let events = 0;
  let reported = false;
  answer.on('data', (chunk: Buffer) => {
    for (let at = chunk.indexOf(EVENT); at !== -1; at = chunk.indexOf(EVENT, at + EVENT.length)) events++;
    tail = chunk.length >= TAIL_BYTES ? chunk.subarray(chunk.length - TAIL_BYTES) : Buffer.concat([tail, chunk]).subarray(-TAIL_BYTES);
  });
  const finish = () => {
    if (reported) return;
    reported = true;
    const total = lastTotal(tail.toString('latin1'));
    done(total ?? estimate(requestBytes, events));
  };
  answer.once('end', finish);
  answer.once('close', finish);
}

/** The estimate for an answer without `usage`: the prompt at four body bytes a token, one token per stream event. */
export function estimate(requestBytes: number, events: number): number {
  return Math.ceil(requestBytes / 4) + events;
}

function lastTotal(text: string): number | undefined {
  let found: number | undefined;
  for (const match of text.matchAll(TOTAL_TOKENS)) found = Number(match[1]);
  return found;
}

const EMPTY = Buffer.alloc(0);
