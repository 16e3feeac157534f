import type { IncomingMessage } from 'node:http';
import type { Readable } from 'node:stream';
import { isEventStreamMediaType } from '../http/media-type';

const LF = 0x0a;
const CR = 0x0d;
/** UTF-8 of U+FEFF: an event stream may begin with it (WHATWG HTML §9.2.5), and it is no field. */
const BOM = [0xef, 0xbb, 0xbf];
/** The fields that make a line part of an event (WHATWG HTML §9.2.6); each begins with its own letter. */
const FIELDS = ['data:', 'event:', 'id:', 'retry:'].map((field) => Buffer.from(field));
const SKIP = -1;

/**
 * Calls `found` once with the time (`performance.now()`) the first byte of the first real event
 * of an SSE stream arrived: the first line that starts with `data:`, `event:`, `id:` or `retry:`.
 * Comment lines (`: ping`), blank lines and a leading byte-order mark are no event, so a
 * keep-alive sent with the headers is not taken for the first token. The stream is read as it
 * flows, never buffered: the state is how much of one field name the current line has matched,
 * whatever the chunk boundaries.
 */
export function onFirstEvent(stream: Readable, found: (at: number) => void): void {
  let bom = 0; // bytes of a leading BOM matched so far; SKIP once the stream is past it
  let field: Buffer = FIELDS[0]; // the field the current line is matching
  let matched = 0; // bytes of `field` the current line has matched; SKIP for a line that is no field
  let lineStarted = 0; // when the current line's first byte arrived
  const scan = (chunk: Buffer | string) => {
    const bytes = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
    const now = performance.now();
    for (let i = 0; i < bytes.length; i++) {
      const byte = bytes[i];
      if (bom !== SKIP) {
        if (byte === BOM[bom]) {
          if (++bom === BOM.length) bom = SKIP;
          continue;
        }
        // Part of a BOM and then something else: the line starts with bytes no field name has.
        if (bom > 0) matched = SKIP;
        bom = SKIP;
      }
      if (byte === LF || byte === CR) {
        matched = 0;
      } else if (matched === 0) {
        const candidate = FIELDS.find((name) => name[0] === byte);
        if (candidate === undefined) {
          matched = SKIP;
        } else {
          field = candidate;
          matched = 1;
          lineStarted = now;
        }
      } else if (matched !== SKIP) {
        if (field[matched] !== byte) {
          matched = SKIP;
        } else if (++matched === field.length) {
          stream.off('data', scan);
          found(lineStarted);
          return;
        }
      }
    }
  };
  stream.on('data', scan);
}

/** An endpoint's running first-token totals, as a policy with `learnsFirstTokens` reads them (`FirstTokenTotals`). */
export interface FirstTokenCounts {
  firstTokens: number;
  firstTokenSeconds: number;
}

/** Who is told of an answer's first token (the forwarder: the metrics, the policy's totals, the peers), with what it passed along. */
export interface FirstTokenListener<T> {
  firstToken(endpoint: FirstTokenCounts, seconds: number, streamed: boolean, passed: T): void;
}

/**
 * Finds the first token of `answer`, dispatched at `started` (`performance.now()`), and tells
 * `listener` once: a 2xx event stream's first real event (see {@link onFirstEvent}), whose scan
 * is the only listener the answer gets and goes at that event; a 2xx answer of another type at
 * once (its first byte comes with its last). Other answers have no first token.
 */
export function answeredFirst<T>(endpoint: FirstTokenCounts, answer: IncomingMessage, started: number, listener: FirstTokenListener<T>, passed: T): void {
  const status = answer.statusCode ?? 0;
  if (status < 200 || status >= 300) return;
  if (!isEventStreamMediaType(answer.headers['content-type'])) {
    listener.firstToken(endpoint, (performance.now() - started) / 1000, false, passed);
    return;
  }
  onFirstEvent(answer, (at) => listener.firstToken(endpoint, (at - started) / 1000, true, passed));
}
