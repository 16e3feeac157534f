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
 * `[DONE]` or at the end. The router asks only streams of one choice (ask-usage.ts); should
 * several come anyway, the events after the first that ends one are held (their order kept), up
 * to 64 KiB, past which everything goes on unchanged.
 *
 * A server started with `--enable-force-include-usage` sends the usage event on every stream and
 * `usage` on every other event too (`should_include_usage` returns `(True, True)`: 52a31cc
 * vllm/entrypoints/utils.py:281-285; continuous usage at chat_completion/serving.py:546-551 and
 * 932-938, completion/serving.py:426-432), never stamping the fingerprint: the client would have
 * had that stream whether asked or not. The router never asks for continuous usage, so an event
 * with choices that carries `usage` says the server forces it: from there the stream passes
 * untouched (its usage still read), and the caller is told.
 *
 * Events end at a blank line, whose line ends may be CRLF, LF or CR (the SSE grammar): vLLM
 * writes `\n\n`, a proxy between may write `\r\n\r\n`.
 */
import type { ServerResponse } from 'node:http';
import { lastUsage, type ReportedUsage } from './usage-json';

const EMPTY = Buffer.alloc(0);
/*
 * The markers are searched for in a latin1 view of the bytes (one character a byte, so its
 * offsets are the bytes'): V8's string search costs a fraction of Buffer#indexOf with a needle
 * this long, which builds a skip table per call.
 */
/** Only the usage event has no choices: vLLM's other events carry one (pydantic orders `choices` before `usage`). */
const USAGE_EVENT = '"choices":[],"usage":{';
/** In compact JSON a string member's key appears with unescaped quotes only as a key. */
const ENDS_CHOICE = '"finish_reason":"';
/** Any event's usage: on one with choices, continuous usage, which only a server that forces usage sends unasked. */
const USAGE = '"usage":{';
const DONE = 'data: [DONE]';
const FINGERPRINT = /"system_fingerprint":("(?:[^"\\]|\\.)*")/;
/** An event this long without its end is no vLLM event: the stream is passed on untouched from there. */
const MAX_EVENT_BYTES = 1024 * 1024;
/** Held back past this, the events go on unchanged and the rest of the stream with them. */
const MAX_HELD_BYTES = 64 * 1024;

type Write = ServerResponse['write'];
type End = ServerResponse['end'];
/** `write` and `end` as called here: bytes and an optional callback. */
type Send = (this: ServerResponse, chunk?: Buffer | (() => void), callback?: () => void) => unknown;

/** The filter of one stream: pure, fed chunks, returning what goes on to the client. */
export class UsageStripper {
  private carry: Buffer | undefined;
  private held: Buffer[] = [];
  private heldBytes = 0;
  /** The usage event was taken out (or the stream is not vLLM's): the rest passes as it comes. */
  private through = false;
  /** The server forces usage: events pass as they come, the usage event is only read. */
  private forced = false;

  /** `found` gets the usage event's usage (`undefined`: none), and whether the server forces usage on every stream. */
  constructor(private readonly found: (usage: ReportedUsage | undefined, forced: boolean) => void) {}

  /** What of `chunk` goes to the client now. */
  push(chunk: Buffer): Buffer {
    if (this.through) return chunk;
    const data = this.carry === undefined ? chunk : Buffer.concat([this.carry, chunk]);
    const text = data.toString('latin1');
    // Most chunks are whole events that end nothing: passed on as they are.
    if (this.carry === undefined && this.held.length === 0 && text.endsWith('\n\n') && text.indexOf(ENDS_CHOICE) === -1 && text.indexOf(USAGE) === -1) return chunk;
    this.carry = undefined;
    const out: Buffer[] = [];
    let at = 0;
    const cr = text.indexOf('\r') !== -1;
    for (let next = eventEnd(text, at, cr); next !== -1 && !this.through; next = eventEnd(text, at, cr)) {
      this.event(data.subarray(at, next), text.slice(at, next), out);
      at = next;
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
    if (!this.through) this.found(undefined, this.forced);
    this.through = true;
    return Buffer.concat(out);
  }

  /** One whole event: its bytes, and the same as latin1 text. */
  private event(event: Buffer, text: string, out: Buffer[]): void {
    if (this.forced) {
      out.push(event);
      if (text.indexOf(USAGE_EVENT) !== -1) this.finish(lastUsage(text));
      return;
    }
    if (text.indexOf(USAGE_EVENT) !== -1) {
      const fingerprint = FINGERPRINT.exec(text)?.[1];
      for (const held of this.held) out.push(fingerprint === undefined ? held : stamped(held, fingerprint));
      this.held = [];
      this.heldBytes = 0;
      this.finish(lastUsage(text));
      return;
    }
    if (text.indexOf(USAGE) !== -1) {
      // Usage on an event with choices: the server forces it, and sends this stream as the client would have had it.
      this.forced = true;
      out.push(...this.held, event);
      this.held = [];
      this.heldBytes = 0;
      return;
    }
    if (text.startsWith(DONE)) {
      out.push(...this.held, event);
      this.held = [];
      this.heldBytes = 0;
      return;
    }
    if (this.held.length > 0 || text.indexOf(ENDS_CHOICE) !== -1) {
      this.held.push(event);
      if ((this.heldBytes += event.length) > MAX_HELD_BYTES) this.giveUp(out, EMPTY);
    } else out.push(event);
  }

  private giveUp(out: Buffer[], rest: Buffer): void {
    out.push(...this.held, rest);
    this.held = [];
    this.heldBytes = 0;
    this.finish(undefined);
  }

  private finish(usage: ReportedUsage | undefined): void {
    this.through = true;
    this.found(usage, this.forced);
  }
}

/**
 * Where the event starting at `from` ends (past the blank line that ends it), −1 when its end is
 * not in `text` yet. `cr`: whether `text` holds a CR at all (vLLM's own streams never do: a plain
 * search for LF LF then). A CR last in `text` may be the first half of a CRLF: no end yet.
 */
export function eventEnd(text: string, from: number, cr: boolean): number {
  if (!cr) {
    const end = text.indexOf('\n\n', from);
    return end === -1 ? -1 : end + 2;
  }
  let ended = false;
  for (let at = from; at < text.length; at++) {
    const char = text.charCodeAt(at);
    if (char === 0x0a) {
      if (ended) return at + 1;
      ended = true;
    } else if (char === 0x0d) {
      if (at + 1 === text.length) return -1;
      const length = text.charCodeAt(at + 1) === 0x0a ? 2 : 1;
      if (ended) return at + length;
      ended = true;
      at += length - 1;
    } else ended = false;
  }
  return -1;
}

/** An event that ends a choice, with `,"system_fingerprint":…` stamped last, as vLLM writes it without `include_usage`. */
function stamped(event: Buffer, fingerprint: string): Buffer {
  let close = event.length - 1;
  while (close > 0 && (event[close] === 0x0a || event[close] === 0x0d)) close--;
  if (event[close] !== 0x7d || event.toString('latin1').indexOf(ENDS_CHOICE) === -1) return event;
  return Buffer.concat([event.subarray(0, close), Buffer.from(`,"system_fingerprint":${fingerprint}`, 'latin1'), event.subarray(close)]);
}

/**
 * Routes what the proxy writes to `res` through a {@link UsageStripper}; `found` gets the usage
 * event's usage, or `undefined` when the stream ended without one, and whether the server forces usage.
 */
export function stripAskedUsage(res: ServerResponse, found: (usage: ReportedUsage | undefined, forced: boolean) => void): void {
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
