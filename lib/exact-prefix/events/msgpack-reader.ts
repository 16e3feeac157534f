/**
 * A MessagePack decoder that can stop after any number of values and resume later, so that one
 * payload at the bounds (decode.ts, DEFAULT_KV_LIMITS: hundreds of ms of decoding) is decoded in slices with
 * request handling between them, on the event loop, without a worker thread's copies.
 *
 * It checks the bounds as it reads, in the order a whole-payload scan would (a value past
 * `maxValues`, a container longer than `maxContainerLength` or than the bytes left, nesting
 * past `maxDepth`), before anything is allocated for the value in question: a hostile header
 * such as "array of 2^32 − 1 elements" in ten bytes is refused, never allocated. Every value
 * takes at least one byte, so what is allocated is bounded by the payload's size.
 *
 * Values are what vLLM's msgspec structs produce: integers (a number when safe, else a bigint,
 * so 64-bit hashes stay exact), floats, strings, binary (a view of the payload), nil, booleans,
 * arrays, and maps with string keys (plain objects; a `__proto__` key is dropped). Extension
 * types and the reserved byte 0xc1 are refused: msgspec never writes them.
 */

/** Bounds on one payload; each is an inclusive maximum. */
export interface MsgpackLimits {
  /** Payload bytes. */
  maxBytes: number;
  /** Values of any kind, containers and map keys included, in the whole payload. */
  maxValues: number;
  /** Elements of one array or entries of one map. */
  maxContainerLength: number;
  /** Nesting of arrays and maps. */
  maxDepth: number;
}

/** Why a payload was refused; 'malformed' is a map key that is neither a string nor an integer. */
export type MsgpackFailure = 'too_large' | 'truncated' | 'trailing_bytes' | 'too_many_values' | 'too_long' | 'too_deep' | 'unsupported_type' | 'malformed';

export type MsgpackRead = { ok: true; value: unknown } | { ok: false; reason: MsgpackFailure };

const TWO_32 = 2 ** 32;
const SHORT_STRING = 32;

/** One payload being decoded: `step()` until it returns true, then `result()`. */
export class MsgpackReader {
  private readonly bytes: Buffer;
  private pos = 0;
  private values = 0;
  // The open containers, outermost first: the container, its element count (a map's doubled,
  // keys and values) and how many were read; a map's key waiting for its value.
  // Slots are reused by depth (no push and pop per container).
  private readonly containers: Array<unknown[] | Record<string, unknown> | undefined>;
  private readonly lengths: Float64Array;
  private readonly read: Float64Array;
  private readonly isMap: Uint8Array;
  private readonly keys: string[];
  private open = 0;
  private outcome: MsgpackRead | null = null;

  constructor(
    payload: Uint8Array,
    private readonly limits: Readonly<MsgpackLimits>,
  ) {
    this.bytes = Buffer.isBuffer(payload) ? payload : Buffer.from(payload.buffer, payload.byteOffset, payload.length);
    if (payload.length > limits.maxBytes) this.outcome = { ok: false, reason: 'too_large' };
    const depth = Math.max(0, Math.min(limits.maxDepth, 1024));
    this.containers = new Array(depth).fill(undefined);
    this.lengths = new Float64Array(depth);
    this.read = new Float64Array(depth);
    this.isMap = new Uint8Array(depth);
    this.keys = new Array<string>(depth).fill('');
  }

  /** The decoded value or the failure; only once `step()` returned true. */
  result(): MsgpackRead {
    if (this.outcome === null) throw new Error('MsgpackReader.result() before the end');
    return this.outcome;
  }

  /** Decodes up to `budget` more values; true once the payload is decoded or refused. */
  step(budget: number): boolean {
    if (this.outcome !== null) return true;
    const { bytes, limits, containers, lengths, read, isMap, keys } = this;
    const end = bytes.length;
    let pos = this.pos;
    let values = this.values;
    let open = this.open;
    const stop = values + budget;
    const fail = (reason: MsgpackFailure): true => {
      this.outcome = { ok: false, reason };
      return true;
    };
    for (;;) {
      if (values >= stop) {
        this.pos = pos;
        this.values = values;
        this.open = open;
        return false;
      }
      if (++values > limits.maxValues) return fail('too_many_values');
      if (pos >= end) return fail('truncated');
      const b = bytes[pos++];
      let value: unknown;
      let children = -1;
      let map = false;
      if (b <= 0x7f) {
        value = b;
      } else if (b >= 0xe0) {
        value = b - 0x100;
      } else if (b >= 0xa0 && b <= 0xbf) {
        const n = b & 0x1f;
        if (n > end - pos) return fail('truncated');
        value = text(bytes, pos, n);
        pos += n;
      } else if (b >= 0x90 && b <= 0x9f) {
        children = b & 0x0f;
      } else if (b >= 0x80 && b <= 0x8f) {
        children = (b & 0x0f) * 2;
        map = true;
      } else {
        // The value's own bytes, or its length's: checked to be there first.
        const size = FIXED_SIZE[b];
        if (size < 0) return fail('unsupported_type');
        if (size > end - pos) return fail('truncated');
        if ((b >= 0xc4 && b <= 0xc6) || b >= 0xd9) {
          // A length: of binary, a string, an array or a map.
          const n = size === 1 ? bytes[pos] : size === 2 ? bytes.readUInt16BE(pos) : bytes.readUInt32BE(pos);
          pos += size;
          if (b === 0xdc || b === 0xdd) {
            children = n;
          } else if (b === 0xde || b === 0xdf) {
            children = n * 2;
            map = true;
          } else {
            if (n > end - pos) return fail('truncated');
            value = b <= 0xc6 ? bytes.subarray(pos, pos + n) : text(bytes, pos, n);
            pos += n;
          }
        } else {
          value = scalar(bytes, b, pos);
          pos += size;
        }
      }
      if (children >= 0) {
        if ((map ? children / 2 : children) > limits.maxContainerLength) return fail('too_long');
        // Each child needs at least one byte: a count past the bytes left is a truncation.
        if (children > end - pos) return fail('truncated');
        if (children > 0) {
          if (open >= limits.maxDepth || open >= containers.length) return fail('too_deep');
          containers[open] = map ? {} : new Array<unknown>(children);
          lengths[open] = children;
          read[open] = 0;
          isMap[open] = map ? 1 : 0;
          open++;
          continue;
        }
        value = map ? {} : [];
      }
      // Place the value, closing every container it completes.
      for (;;) {
        const depth = open - 1;
        if (depth < 0) {
          if (pos !== end) return fail('trailing_bytes');
          this.outcome = { ok: true, value };
          return true;
        }
        const at = read[depth];
        if (isMap[depth] === 0) {
          (containers[depth] as unknown[])[at] = value;
        } else if ((at & 1) === 0) {
          if (typeof value === 'string') keys[depth] = value;
          else if (typeof value === 'number' || typeof value === 'bigint') keys[depth] = String(value);
          else return fail('malformed');
        } else if (keys[depth] !== '__proto__') {
          (containers[depth] as Record<string, unknown>)[keys[depth]] = value;
        }
        read[depth] = at + 1;
        if (at + 1 < lengths[depth]) break;
        value = containers[depth];
        containers[depth] = undefined;
        open = depth;
      }
    }
  }
}

// Bytes after the type byte for each non-fix type: the value's own bytes, or its length's;
// −1 for the types refused.
const FIXED_SIZE = new Int8Array(256).fill(-1);
for (const [size, types] of [
  [0, [0xc0, 0xc2, 0xc3]],
  [1, [0xcc, 0xd0, 0xd9, 0xc4]],
  [2, [0xcd, 0xd1, 0xda, 0xc5, 0xdc, 0xde]],
  [4, [0xce, 0xd2, 0xca, 0xdb, 0xc6, 0xdd, 0xdf]],
  [8, [0xcf, 0xd3, 0xcb]],
] as const) {
  for (const type of types) FIXED_SIZE[type] = size;
}

function scalar(bytes: Buffer, b: number, pos: number): unknown {
  switch (b) {
    case 0xc0: return null;
    case 0xc2: return false;
    case 0xc3: return true;
    case 0xcc: return bytes[pos];
    case 0xcd: return bytes.readUInt16BE(pos);
    case 0xce: return bytes.readUInt32BE(pos);
    case 0xcf: return uint64(bytes, pos);
    case 0xd0: return bytes.readInt8(pos);
    case 0xd1: return bytes.readInt16BE(pos);
    case 0xd2: return bytes.readInt32BE(pos);
    case 0xd3: return int64(bytes, pos);
    case 0xca: return bytes.readFloatBE(pos);
    default: return bytes.readDoubleBE(pos);
  }
}

function uint64(bytes: Buffer, pos: number): number | bigint {
  const value = bytes.readUInt32BE(pos) * TWO_32 + bytes.readUInt32BE(pos + 4);
  return Number.isSafeInteger(value) ? value : bytes.readBigUInt64BE(pos);
}

function int64(bytes: Buffer, pos: number): number | bigint {
  // Past 2^53 the float sum is inexact but never a safe integer: those are read exactly.
  const value = bytes.readInt32BE(pos) * TWO_32 + bytes.readUInt32BE(pos + 4);
  return Number.isSafeInteger(value) ? value : bytes.readBigInt64BE(pos);
}

// Tags and field names repeat in every event: short ASCII strings come from a small cache
// (checked byte by byte), so a payload of 100k events does not make 100k copies of each.
const CACHE_SLOTS = 1024;
const cache: string[] = new Array<string>(CACHE_SLOTS).fill('');

function text(bytes: Buffer, pos: number, n: number): string {
  if (n > SHORT_STRING) return bytes.toString('utf8', pos, pos + n);
  let hash = n;
  for (let i = pos; i < pos + n; i++) {
    const c = bytes[i];
    if (c >= 0x80) return bytes.toString('utf8', pos, pos + n);
    hash = (Math.imul(hash, 31) + c) | 0;
  }
  const slot = hash & (CACHE_SLOTS - 1);
  const cached = cache[slot];
  if (cached.length === n) {
    let same = true;
    for (let i = 0; i < n && same; i++) same = cached.charCodeAt(i) === bytes[pos + i];
    if (same) return cached;
  }
  const made = bytes.toString('latin1', pos, pos + n);
  cache[slot] = made;
  return made;
}
