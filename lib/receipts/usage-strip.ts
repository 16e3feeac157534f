/**
 * Takes the usage chunk the router asked for (ask-usage.ts) out of a client's stream, so that
 * the client gets byte for byte the events it would have had without the request.
 *
 * What `include_usage` changes in vLLM's stream (52a31cc, chat_completion/serving.py:919-929
 * and 943-967, completion/serving.py:419-425 and 451-462): a final event whose `choices` is
 * empty and which carries `usage` (and `system_fingerprint`, unless `--fingerprint-mode none`)
 * is sent before `data: [DONE]`; and the events that end a choice (`finish_reason` set) no
 * longer carry `system_fingerprint`, which is stamped last on them only without it. So events
 * pass whole (one that a chunk boundary cuts waits for its rest); from the first event that ends
 * a choice on, events are held until the usage event, then released with that event's
 * `"system_fingerprint":…` member stamped last on each one that ends a choice. Without a usage
 * event (an error, a server that ignores `stream_options`) they are released unchanged at
 * `[DONE]` or at the end. n > 1 choices: an event that ends one choice may be held while others
 * still stream (their order kept); the bytes do not change, only when they leave.
 */
import type { ServerResponse } from 'node:http';
import { lastUsage, type ReportedUsage } from './usage-json';

const SEPARATOR = Buffer.from('\n\n');
/** Only the usage event has no choices: vLLM's other events carry one (pydantic orders `choices` before `usage`). */
const USAGE_EVENT = Buffer.from('"choices":[],"usage":{');
/** In compact JSON a string member's key appears with unescaped quotes only as a key. */
const ENDS_CHOICE = Buffer.from('"finish_reason":"');
const DONE = Buffer.from('data: [DONE]');
const FINGERPRINT = /"system_fingerprint":("(?:[^"\\]|\\.)*")/;
/** An event this long without its end is no vLLM event: the stream is passed on untouched from there. */
const MAX_EVENT_BYTES = 1024 * 1024;

type Write = ServerResponse['write'];
type End = ServerResponse['end'];
/** `write` and `end` as called here: bytes and an optional callback. */
type Send = (this: ServerResponse, chunk?: Buffer | (() => void), callback?: () => void) => unknown;

/** The filter of one stream: pure, fed chunks, returning what goes on to the client. */
export class UsageStripper {
  private carry: Buffer | undefined;
  private held: Buffer[] = [];
  /** The usage event was taken out (or the stream is not vLLM's): the rest passes as it comes. */
  private through = false;

  constructor(private readonly found: (usage: ReportedUsage | undefined) => void) {}

  /** What of `chunk` goes to the client now. */
  push(chunk: Buffer): Buffer {
    if (this.through) return chunk;
    // Most chunks are whole events that end nothing: passed on as they are.
    if (this.carry === undefined && this.held.length === 0 && endsEvent(chunk) && chunk.indexOf(ENDS_CHOICE) === -1 && chunk.indexOf(USAGE_EVENT) === -1) return chunk;
    const data = this.carry === undefined ? chunk : Buffer.concat([this.carry, chunk]);
    this.carry = undefined;
    const out: Buffer[] = [];
    let at = 0;
    for (let end = data.indexOf(SEPARATOR, at); end !== -1 && !this.through; end = data.indexOf(SEPARATOR, at)) {
      this.event(data.subarray(at, end + SEPARATOR.length), out);
      at = end + SEPARATOR.length;
    }
    if (at < data.length) {
      const rest = data.subarray(at);
      if (this.through) out.push(rest);
      else if (rest.length > MAX_EVENT_BYTES) this.giveUp(out, rest);
      else this.carry = rest;
    }
    return out.length === 1 ? out[0] : Buffer.concat(out);
  }

  /** The stream ended: whatever is held goes as it came. */
  end(): Buffer {
    const out = this.held;
    if (this.carry !== undefined) out.push(this.carry);
    this.held = [];
    this.carry = undefined;
    if (!this.through) this.found(undefined);
    this.through = true;
    return Buffer.concat(out);
  }

  private event(event: Buffer, out: Buffer[]): void {
    if (event.indexOf(USAGE_EVENT) !== -1) {
      const text = event.toString('latin1');
      const fingerprint = FINGERPRINT.exec(text)?.[1];
      for (const held of this.held) out.push(fingerprint === undefined ? held : stamped(held, fingerprint));
      this.held = [];
      this.through = true;
      this.found(lastUsage(text));
      return;
    }
    if (event.subarray(0, DONE.length).equals(DONE)) {
      out.push(...this.held, event);
      this.held = [];
      return;
    }
    if (this.held.length > 0 || event.indexOf(ENDS_CHOICE) !== -1) this.held.push(event);
    else out.push(event);
  }

  private giveUp(out: Buffer[], rest: Buffer): void {
    out.push(...this.held, rest);
    this.held = [];
    this.through = true;
    this.found(undefined);
  }
}

function endsEvent(chunk: Buffer): boolean {
  return chunk.length >= 2 && chunk[chunk.length - 1] === 0x0a && chunk[chunk.length - 2] === 0x0a;
}

/** An event that ends a choice, with `,"system_fingerprint":…` stamped last, as vLLM writes it without `include_usage`. */
function stamped(event: Buffer, fingerprint: string): Buffer {
  const close = event.length - 1 - SEPARATOR.length;
  if (event.indexOf(ENDS_CHOICE) === -1 || event[close] !== 0x7d) return event;
  return Buffer.concat([event.subarray(0, close), Buffer.from(`,"system_fingerprint":${fingerprint}`, 'latin1'), event.subarray(close)]);
}

/**
 * Routes what the proxy writes to `res` through a {@link UsageStripper}; `found` gets the usage
 * event's usage, or `undefined` when the stream ended without one.
 */
export function stripAskedUsage(res: ServerResponse, found: (usage: ReportedUsage | undefined) => void): void {
  const stripper = new UsageStripper(found);
  const write = res.write as Send;
  const end = res.end as Send;
  res.write = function writeStripped(this: ServerResponse, chunk: unknown, ...rest: unknown[]): boolean {
    const out = stripper.push(asBuffer(chunk, rest[0]));
    const callback = typeof rest[rest.length - 1] === 'function' ? (rest[rest.length - 1] as () => void) : undefined;
    if (out.length === 0) {
      if (callback !== undefined) process.nextTick(callback);
      return true;
    }
    return write.call(this, out, callback) as boolean;
  } as Write;
  res.end = function endStripped(this: ServerResponse, ...args: unknown[]): ServerResponse {
    const chunk = typeof args[0] === 'function' || args[0] === undefined ? undefined : args[0];
    const callback = typeof args[args.length - 1] === 'function' ? (args[args.length - 1] as () => void) : undefined;
    const head = chunk === undefined ? undefined : stripper.push(asBuffer(chunk, args[1]));
    const tail = stripper.end();
    const out = head === undefined || head.length === 0 ? tail : Buffer.concat([head, tail]);
    return (out.length === 0 ? end.call(this, callback) : end.call(this, out, callback)) as ServerResponse;
  } as End;
}

function asBuffer(chunk: unknown, encoding: unknown): Buffer {
  if (Buffer.isBuffer(chunk)) return chunk;
  if (chunk instanceof Uint8Array) return Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
  return Buffer.from(String(chunk), typeof encoding === 'string' ? (encoding as BufferEncoding) : 'utf8');
}
