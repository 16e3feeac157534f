/**
 * A validating JSON scanner over the raw body bytes that finds the top-level members routing
 * reads (prompt, messages, the affinity and hint fields) without building the document.
 * `JSON.parse` of a whole body costs many times its size for hostile shapes (a 16 MiB body of
 * `[],[],…` became a 214 MiB tree); scanning costs no allocation beyond a nesting stack, and
 * only the members asked for are decoded afterwards, from their own bytes.
 *
 * It accepts exactly what `JSON.parse(bytes.toString('utf8'))` accepts: RFC 8259 with any
 * nesting depth, no byte-order mark, and invalid UTF-8 inside strings tolerated (decoding
 * replaces it).
 */

/** One top-level member: where its key starts and where its value's bytes are. */
export interface JsonField {
  readonly keyStart: number;
  start: number;
  end: number;
  /** Values in it, itself included: what decoding it would build. */
  readonly nodes: number;
}

/**
 * The occurrences of each name asked for, in body order (JSON allows repeats; decoders keep the
 * last). `repeated` fails a body that repeats one of them more than {@link MAX_OCCURRENCES} times.
 */
export type FieldScan = { ok: true; fields: Array<JsonField[] | undefined> } | { ok: false; repeated: boolean };

/** More copies of one routing member than any honest client sends: a body built to cost memory. */
export const MAX_OCCURRENCES = 16;

const OBJECT = 1;
const ARRAY = 2;
const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const FAILED: FieldScan = Object.freeze({ ok: false, repeated: false });
const REPEATED: FieldScan = Object.freeze({ ok: false, repeated: true });

/**
 * Validates `bytes` as one JSON text and returns, for each of `names` (UTF-8 encoded), the
 * spans of the top-level object's members with that name. A top-level value that is not an
 * object has no members.
 */
export function scanFields(body: Uint8Array, names: readonly Uint8Array[]): FieldScan {
  // A plain Uint8Array view: V8 indexes it about a third faster than a Buffer, whose prototype differs.
  const bytes = new Uint8Array(body.buffer, body.byteOffset, body.length);
  const length = bytes.length;
  const fields: Array<JsonField[] | undefined> = new Array(names.length).fill(undefined);
  let stack = new Uint8Array(64);
  let depth = 0;
  // The member of the top-level object being read, when it is one of `names`.
  let wanted = -1;
  let keyStart = 0;
  let valueStart = 0;
  let nodes = 0;
  let index = skipSpace(bytes, 0);

  // Each turn reads one value at `index`, then whatever closes or separates after it.
  for (;;) {
    if (wanted !== -1) nodes++;
    const byte = bytes[index];
    if (byte === 0x7b || byte === 0x5b) {
      if (depth === stack.length) {
        const grown = new Uint8Array(stack.length * 2);
        grown.set(stack);
        stack = grown;
      }
      stack[depth++] = byte === 0x7b ? OBJECT : ARRAY;
      index = skipSpace(bytes, index + 1);
      const close = byte === 0x7b ? 0x7d : 0x5d;
      if (bytes[index] === close) {
        depth--;
        index++;
      } else {
        if (byte === 0x7b) {
          index = readKey(index);
          if (index < 0) return FAILED;
        }
        continue;
      }
    } else if (byte === QUOTE) {
      index = skipString(bytes, index);
    } else if (byte === 0x2d || (byte >= 0x30 && byte <= 0x39)) {
      index = skipNumber(bytes, index);
    } else if (byte === 0x74) {
      index = literal(bytes, index, TRUE);
    } else if (byte === 0x66) {
      index = literal(bytes, index, FALSE);
    } else if (byte === 0x6e) {
      index = literal(bytes, index, NULL);
    } else {
      return FAILED;
    }
    if (index < 0) return FAILED;

    // After a value: close containers, or move to the next element or member.
    for (;;) {
      if (depth === 1 && wanted !== -1) {
        const found = (fields[wanted] ??= []);
        if (found.length === MAX_OCCURRENCES) return REPEATED;
        found.push({ keyStart, start: valueStart, end: index, nodes });
        wanted = -1;
      }
      index = skipSpace(bytes, index);
      if (depth === 0) return index === length ? { ok: true, fields } : FAILED;
      const container = stack[depth - 1];
      const byte = bytes[index];
      if (byte === 0x2c) {
        index = skipSpace(bytes, index + 1);
        if (container === OBJECT) {
          index = readKey(index);
          if (index < 0) return FAILED;
        }
        break;
      }
      if ((container === OBJECT && byte === 0x7d) || (container === ARRAY && byte === 0x5d)) {
        depth--;
        index++;
        continue;
      }
      return FAILED;
    }
  }

  /** Reads `"key" :` and the space after it; notes a wanted top-level member. Returns the value's index, or -1. */
  function readKey(at: number): number {
    if (bytes[at] !== QUOTE) return -1;
    const end = skipString(bytes, at);
    if (end < 0) return -1;
    const colon = skipSpace(bytes, end);
    if (bytes[colon] !== 0x3a) return -1;
    const value = skipSpace(bytes, colon + 1);
    if (depth === 1) {
      wanted = nameIndex(bytes, at + 1, end - 1, names);
      if (wanted !== -1) {
        keyStart = at;
        valueStart = value;
        nodes = 0;
      }
    }
    return value;
  }
}

const TRUE = Uint8Array.of(0x74, 0x72, 0x75, 0x65);
const FALSE = Uint8Array.of(0x66, 0x61, 0x6c, 0x73, 0x65);
const NULL = Uint8Array.of(0x6e, 0x75, 0x6c, 0x6c);

function skipSpace(bytes: Uint8Array, index: number): number {
  for (;;) {
    const byte = bytes[index];
    if (byte !== 0x20 && byte !== 0x0a && byte !== 0x0d && byte !== 0x09) return index;
    index++;
  }
}

function literal(bytes: Uint8Array, index: number, word: Uint8Array): number {
  for (let offset = 0; offset < word.length; offset++) if (bytes[index + offset] !== word[offset]) return -1;
  return index + word.length;
}

const isDigit = (byte: number | undefined) => byte !== undefined && byte >= 0x30 && byte <= 0x39;
const isHex = (byte: number | undefined) => byte !== undefined && ((byte >= 0x30 && byte <= 0x39) || ((byte | 0x20) >= 0x61 && (byte | 0x20) <= 0x66));

/** Bytes that end a run of plain string content: the quote, the backslash and control characters. */
const STRING_STOP = new Uint8Array(256);
STRING_STOP.fill(1, 0, 0x20);
STRING_STOP[QUOTE] = 1;
STRING_STOP[BACKSLASH] = 1;

/** The index after a string starting at `index` (its opening quote), or -1. */
function skipString(bytes: Uint8Array, index: number): number {
  const length = bytes.length;
  index++;
  while (index < length) {
    // Prompts are long runs of plain content: one table look-up per byte.
    while (index < length && STRING_STOP[bytes[index]] === 0) index++;
    if (index >= length) return -1;
    const byte = bytes[index];
    if (byte === QUOTE) return index + 1;
    if (byte < 0x20) return -1;
    if (byte === BACKSLASH) {
      const escaped = bytes[index + 1];
      if (escaped === 0x75) {
        if (!isHex(bytes[index + 2]) || !isHex(bytes[index + 3]) || !isHex(bytes[index + 4]) || !isHex(bytes[index + 5])) return -1;
        index += 6;
        continue;
      }
      // " \ / b f n r t
      if (escaped !== QUOTE && escaped !== BACKSLASH && escaped !== 0x2f && escaped !== 0x62 && escaped !== 0x66 && escaped !== 0x6e && escaped !== 0x72 && escaped !== 0x74) {
        return -1;
      }
      index += 2;
      continue;
    }
    index++;
  }
  return -1;
}

/** The index after `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`, or -1. */
function skipNumber(bytes: Uint8Array, index: number): number {
  if (bytes[index] === 0x2d) index++;
  if (bytes[index] === 0x30) index++;
  else if (isDigit(bytes[index])) while (isDigit(bytes[index])) index++;
  else return -1;
  if (bytes[index] === 0x2e) {
    index++;
    if (!isDigit(bytes[index])) return -1;
    while (isDigit(bytes[index])) index++;
  }
  if (bytes[index] === 0x65 || bytes[index] === 0x45) {
    index++;
    if (bytes[index] === 0x2b || bytes[index] === 0x2d) index++;
    if (!isDigit(bytes[index])) return -1;
    while (isDigit(bytes[index])) index++;
  }
  return index;
}

/** Which of `names` the key bytes `[start, end)` spell, decoding escapes (`"\u0070rompt"` is `prompt`); -1 for none. */
function nameIndex(bytes: Uint8Array, start: number, end: number, names: readonly Uint8Array[]): number {
  let escaped = false;
  for (let index = start; index < end && !escaped; index++) escaped = bytes[index] === BACKSLASH;
  if (escaped) {
    const decoded = Buffer.from(JSON.parse(Buffer.from(bytes.buffer, bytes.byteOffset + start - 1, end - start + 2).toString('utf8')) as string);
    return sameBytes(decoded, 0, decoded.length, names);
  }
  return sameBytes(bytes, start, end, names);
}

function sameBytes(bytes: Uint8Array, start: number, end: number, names: readonly Uint8Array[]): number {
  const length = end - start;
  for (let which = 0; which < names.length; which++) {
    const name = names[which];
    if (name.length !== length) continue;
    let same = true;
    for (let offset = 0; offset < length && same; offset++) same = bytes[start + offset] === name[offset];
    if (same) return which;
  }
  return -1;
}

/** Whether valid JSON text is an object. */
export function isObjectText(bytes: Uint8Array): boolean {
  return bytes[skipSpace(bytes, 0)] === 0x7b;
}

/**
 * `bytes` (one JSON object without the member) with the member `key` (its encoded name and
 * colon, `"name":`) and JSON text `value` added first, the rest of the bytes as they were; its
 * span is pushed onto `fields`.
 */
export function insertMember(bytes: Buffer, key: Buffer, value: string, fields: JsonField[]): Buffer {
  const open = skipSpace(bytes, 0) + 1;
  const text = Buffer.from(value, 'latin1');
  const start = open + key.length;
  fields.push({ keyStart: open, start, end: start + text.length, nodes: 1 });
  const empty = bytes[skipSpace(bytes, open)] === 0x7d;
  return Buffer.concat([bytes.subarray(0, open), key, text, empty ? NOTHING : COMMA, bytes.subarray(open)]);
}

const NOTHING = Buffer.alloc(0);
const COMMA = Buffer.from(',');

/** Decodes one member's value from its own bytes. */
export function decodeField(bytes: Uint8Array, field: JsonField): unknown {
  return JSON.parse(Buffer.from(bytes.buffer, bytes.byteOffset + field.start, field.end - field.start).toString('utf8'));
}

/** A member value's bytes as text, for checking a literal as it was written (latin1: digits stay digits). */
export function fieldToken(bytes: Uint8Array, field: JsonField): string {
  return Buffer.from(bytes.buffer, bytes.byteOffset + field.start, field.end - field.start).toString('latin1');
}

/**
 * Replaces the values of `fields` with the JSON text `value` and moves their spans (and every
 * later span) to the new bytes. Returns the new body; `bytes` is left as it was.
 */
export function replaceValues(bytes: Buffer, fields: readonly JsonField[], value: string): Buffer {
  const replacement = Buffer.from(value, 'latin1');
  const parts: Buffer[] = [];
  let from = 0;
  let shift = 0;
  for (const field of fields) {
    parts.push(bytes.subarray(from, field.start), replacement);
    from = field.end;
    const oldLength = field.end - field.start;
    field.start += shift;
    field.end = field.start + replacement.length;
    shift += replacement.length - oldLength;
  }
  parts.push(bytes.subarray(from));
  return Buffer.concat(parts);
}
