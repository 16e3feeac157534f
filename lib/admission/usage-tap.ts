import type { IncomingMessage } from 'node:http';
import { digitsEnd, digitsValue, estimate, MAX_DIGITS, skipSpace } from './estimate';

/** The member vLLM reports an answer's tokens in (`UsageInfo`, engine/protocol.py:105 at 52a31cc). */
const USAGE = Buffer.from('"usage"');
/**
 * What is searched for: `"usage"` without its opening quote, checked after. Node finds a short
 * needle by `memchr` of its first byte, then compares: a quote begins some 28 places in a
 * 245-byte chunk, a `u` about 4, and `usage"` is found in about a third of the time `"usage"` is.
 */
const USAGE_TAIL = USAGE.subarray(1);
const TOTAL_TOKENS = Buffer.from('"total_tokens"');
const LF = 0x0a;
/** The most of one `usage` object kept when it spans chunks: vLLM's is about 120 bytes. */
const CARRY_BYTES = 1024;
/** `parseUsage`'s answers besides a count. */
const INCOMPLETE = -1;
const INVALID = -2;
const QUOTE = 0x22;
const BACKSLASH = 0x5c;

/**
 * Reads what one answer cost in tokens, beside the proxy's own pipe (a second `data` listener):
 * `usage.total_tokens` of the last `"usage": {…}` member anywhere in the answer: a JSON answer
 * (where vLLM writes `prompt_logprobs`, `prompt_token_ids` and `kv_transfer_params` after it,
 * chat_completion/protocol.py:116-130 at 52a31cc), a stream's final chunk
 * (`stream_options.include_usage`), or each chunk's with `continuous_usage_stats`. A stream
 * without usage is {@link estimate}d. `done` gets the count once, when the answer ends or is cut.
 */
export function tapUsage(answer: IncomingMessage, requestBytes: number, done: (tokens: number) => void): void {
  const scan = new UsageScan();
  answer.on('data', (chunk: Buffer) => scan.feed(chunk));
  // `on`, not `once`: each `once` holds a wrapper and its state for the stream's life, and
  // `finish` runs its end once either way.
  const finish = () => {
    if (scan.ended) return;
    scan.ended = true;
    done(scan.total ?? estimate(requestBytes, scan.events));
  };
  answer.on('end', finish);
  answer.on('close', finish);
}

/**
 * The last `usage` of a byte stream, found chunk by chunk without copying or decoding the
 * chunks: one native search per chunk for `"usage"`, and only a usage object itself is read (a
 * few hundred bytes, kept in a buffer made once when one spans chunks). Stream events are
 * counted by their ends (a blank line: `data: …\n\n`, whose JSON never holds a raw line feed),
 * found with `memchr`. The common chunk (no usage, no quote among its last bytes) allocates
 * nothing.
 */
export class UsageScan {
  /** `total_tokens` of the last complete usage object; `undefined` while none was seen. */
  total: number | undefined = undefined;
  /** Stream events ended (blank lines), for the estimate. */
  events = 0;
  /** Whether the answer ended and its count was reported. */
  ended = false;
  /** Whether the last chunk ended with a line feed not yet paired (a blank line cut between chunks). */
  private endedWithLf = false;
  /** The bytes of a usage object that began in an earlier chunk, while they do not hold its total yet. */
  private carry: Buffer | undefined = undefined;
  private carried = 0;
  private carrying = false;
  /** How many bytes of `"usage"` the last chunk ended with (a key cut between chunks). */
  private partial = 0;

  feed(chunk: Buffer): void {
    this.countEvents(chunk);
    if (this.partial > 0) this.keyGoesOn(chunk);
    else if (this.carrying) this.carryOn(chunk, 0);
    // Each usage in this chunk, oldest first: a complete one is the total so far; one the chunk
    // cuts short (the last) is carried into the next.
    for (let at = chunk.indexOf(USAGE_TAIL, 1); at !== -1; at = chunk.indexOf(USAGE_TAIL, at + USAGE_TAIL.length)) {
      if (chunk[at - 1] !== QUOTE) continue;
      const found = parseUsage(chunk, at - 1, chunk.length);
      if (found >= 0) {
        this.carrying = false;
        this.total = found;
      } else if (found === INCOMPLETE) {
        this.startCarry(chunk, at - 1);
      }
    }
    if (this.partial === 0 && !this.carrying) this.partial = keyPrefixAtEnd(chunk);
  }

  private countEvents(chunk: Buffer): void {
    const { length } = chunk;
    if (length === 0) return;
    let at = chunk.indexOf(LF);
    if (this.endedWithLf && at === 0) {
      this.events++;
      at = chunk.indexOf(LF, 1);
    }
    // A line feed followed by another ends an event; one that ends the chunk may be followed in the next.
    this.endedWithLf = false;
    for (; at !== -1; at = chunk.indexOf(LF, at + 1)) {
      if (at + 1 === length) {
        this.endedWithLf = true;
      } else if (chunk[at + 1] === LF) {
        this.events++;
        at++;
      }
    }
  }

  /** The last chunks ended with the first `partial` bytes of `"usage"`: a usage object begins there if this one goes on with the rest. */
  private keyGoesOn(chunk: Buffer): void {
    const rest = USAGE.length - this.partial;
    const seen = Math.min(rest, chunk.length);
    if (chunk.compare(USAGE, this.partial, this.partial + seen, 0, seen) !== 0) {
      this.partial = 0;
    } else if (seen < rest) {
      // A chunk shorter than the rest of the key, and all of it the key.
      this.partial += seen;
    } else {
      this.partial = 0;
      this.startCarry(USAGE, 0);
      this.carryOn(chunk, rest);
    }
  }

  private startCarry(bytes: Buffer, from: number): void {
    this.carried = 0;
    this.carrying = true;
    this.carryOn(bytes, from);
  }

  /** Appends `bytes` from `from` to the carried usage object and reads it again: its total, or more to wait for, or not a usage object. */
  private carryOn(bytes: Buffer, from: number): void {
    const carry = (this.carry ??= Buffer.allocUnsafe(CARRY_BYTES));
    this.carried += bytes.copy(carry, this.carried, from, Math.min(bytes.length, from + CARRY_BYTES - this.carried));
    const found = parseUsage(carry, 0, this.carried);
    if (found >= 0) this.total = found;
    if (found !== INCOMPLETE || this.carried === CARRY_BYTES) this.carrying = false;
  }
}

/**
 * Reads the usage object whose `"usage"` key begins at `at` (bytes before `end`): its
 * `total_tokens` (a member of the object itself, not of one nested in it), or
 * {@link INCOMPLETE} when the bytes stop before it, or {@link INVALID} when this is not a
 * `"usage": {…}` member with a total (`"usage": null`, a decoded token `"usage"`).
 */
function parseUsage(bytes: Uint8Array, at: number, end: number): number {
  let index = skipSpace(bytes, at + USAGE.length, end);
  if (index >= end) return INCOMPLETE;
  if (bytes[index] !== 0x3a) return INVALID;
  index = skipSpace(bytes, index + 1, end);
  if (index >= end) return INCOMPLETE;
  if (bytes[index] !== 0x7b) return INVALID;
  let depth = 1;
  for (index++; index < end; index++) {
    const byte = bytes[index];
    if (byte === QUOTE) {
      if (depth === 1 && startsWith(bytes, index, end, TOTAL_TOKENS)) return totalAfter(bytes, index + TOTAL_TOKENS.length, end);
      index = stringEnd(bytes, index + 1, end);
      if (index >= end) return INCOMPLETE;
    } else if (byte === 0x7b) {
      depth++;
    } else if (byte === 0x7d && --depth === 0) {
      return INVALID;
    }
  }
  return INCOMPLETE;
}

/** The integer after `"total_tokens"` and its colon. */
function totalAfter(bytes: Uint8Array, index: number, end: number): number {
  let at = skipSpace(bytes, index, end);
  if (at >= end) return INCOMPLETE;
  if (bytes[at] !== 0x3a) return INVALID;
  at = skipSpace(bytes, at + 1, end);
  const stop = digitsEnd(bytes, at, end);
  if (stop === end) return INCOMPLETE;
  return stop === at || stop - at > MAX_DIGITS ? INVALID : digitsValue(bytes, at, stop);
}

/** Whether `word` is at `index`; a word cut by `end` counts as there (more bytes decide). */
function startsWith(bytes: Uint8Array, index: number, end: number, word: Uint8Array): boolean {
  for (let i = 0; i < word.length; i++) {
    if (index + i >= end) return true;
    if (bytes[index + i] !== word[i]) return false;
  }
  return true;
}

/** The index of the quote closing a string whose content begins at `index` (`end` if it does not close before). */
function stringEnd(bytes: Uint8Array, index: number, end: number): number {
  for (let at = index; at < end; at++) {
    if (bytes[at] === BACKSLASH) at++;
    else if (bytes[at] === QUOTE) return at;
  }
  return end;
}

/** How many bytes of `"usage"` (fewer than all) `chunk` ends with; 0 in the common case, where its last 6 bytes hold no quote. */
function keyPrefixAtEnd(chunk: Buffer): number {
  const length = chunk.length;
  for (let at = Math.max(0, length - USAGE.length + 1); at < length; at++) {
    if (chunk[at] === QUOTE && chunk.compare(USAGE, 0, length - at, at, length) === 0) return length - at;
  }
  return 0;
}
