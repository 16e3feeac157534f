import type { IncomingMessage, ServerResponse } from 'node:http';

const LF = 0x0a;
const DONE = Buffer.from('[DONE]');

/** What the router measured of one streamed answer, as the gateway saw it. */
export interface StreamTiming {
  /** When the first chunk holding a whole event arrived (`performance.now()`); 0 before. */
  firstAt: number;
  /** When the last chunk holding a token event arrived. */
  lastAt: number;
  /** Events ended after the first chunk with one, `[DONE]` left out: one per token with vLLM's one chunk per token. */
  after: number;
  /** The client's socket pushed back (`writableNeedDrain`): the gaps measured are partly the client's doing. */
  backpressured: boolean;
}

/**
 * Watches an SSE answer's events as they flow to the client (never buffering them): counts
 * event ends (a blank line), and notes whether the client's side ever pushed back. A client that
 * reads slowly makes the proxy pause the upstream, and the gaps between tokens then measure the
 * client, not the engine: such a stream is no evidence of the rank's speed. `done` is called once,
 * at the answer's end (`complete`) or its close (cut short).
 */
export function watchStream(answer: IncomingMessage, res: ServerResponse, done: (timing: StreamTiming, complete: boolean) => void): void {
  const timing: StreamTiming = { firstAt: 0, lastAt: 0, after: 0, backpressured: false };
  let lastByte = 0;
  const scan = (chunk: Buffer | string) => {
    const bytes = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
    if (res.writableNeedDrain) timing.backpressured = true;
    let events = 0;
    let from = 0;
    // An event ends with a blank line: LF LF, wherever the chunk boundaries fall.
    for (let at = bytes.indexOf(LF, from); at >= 0; at = bytes.indexOf(LF, from)) {
      const previous = at === 0 ? lastByte : bytes[at - 1];
      if (previous === LF) events++;
      from = at + 1;
    }
    if (bytes.length > 0) lastByte = bytes[bytes.length - 1];
    if (events === 0) return;
    const now = performance.now();
    if (timing.firstAt === 0) {
      timing.firstAt = now;
      return;
    }
    if (bytes.indexOf(DONE) >= 0) events--;
    if (events <= 0) return;
    timing.after += events;
    timing.lastAt = now;
  };
  let finished = false;
  const finish = (complete: boolean) => {
    if (finished) return;
    finished = true;
    answer.off('data', scan);
    done(timing, complete);
  };
  answer.on('data', scan);
  answer.once('end', () => finish(true));
  answer.once('close', () => finish(false));
}

/** Mean seconds per token after the first, or NaN with fewer than `minTokens` measured. */
export function meanTokenGap(timing: StreamTiming, minTokens: number): number {
  if (timing.after < minTokens || timing.lastAt <= timing.firstAt) return NaN;
  return (timing.lastAt - timing.firstAt) / 1000 / timing.after;
}
