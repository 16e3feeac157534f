/**
 * A structural walk over MessagePack bytes that allocates nothing: it proves a payload is one
 * complete, well-formed value within the given bounds before a decoder builds objects from it.
 * A hostile header such as "array of 2^32 − 1 elements" in a ten-byte payload is refused here
 * instead of reaching an allocation; every value costs at least one byte, so with the
 * payload and value bounds checked first, what the decoder then allocates is bounded too.
 */

/** Bounds on one payload; each is an inclusive maximum. */
export interface MsgpackLimits {
  /** Payload bytes. */
  maxBytes: number;
  /** Values of any kind, containers included, in the whole payload. */
  maxValues: number;
  /** Elements of one array or entries of one map. */
  maxContainerLength: number;
  /** Nesting of arrays and maps. */
  maxDepth: number;
}

export type ScanFailure = 'too_large' | 'truncated' | 'trailing_bytes' | 'too_many_values' | 'too_long' | 'too_deep' | 'unsupported_type';

/**
 * Checks that `bytes` holds exactly one MessagePack value within `limits`. Extension types
 * and the reserved byte 0xc1 are refused: vLLM's msgspec structs never produce them, and
 * msgpackr gives some extension types meanings of its own.
 */
export function scanMsgpack(bytes: Uint8Array, limits: MsgpackLimits): ScanFailure | null {
  const end = bytes.length;
  if (end > limits.maxBytes) return 'too_large';
  // Pending element counts of the open containers; a map's count is doubled (keys and values).
  const pending: number[] = [];
  let pos = 0;
  let values = 0;
  let remaining = 1; // values still to read at the current level
  for (;;) {
    while (remaining === 0) {
      if (pending.length === 0) return pos === end ? null : 'trailing_bytes';
      remaining = pending.pop() as number;
    }
    remaining--;
    if (++values > limits.maxValues) return 'too_many_values';
    if (pos >= end) return 'truncated';
    const b = bytes[pos++];
    let skip = 0;
    let children = -1;
    if (b <= 0x7f || b >= 0xe0 || b === 0xc0 || b === 0xc2 || b === 0xc3) {
      // fixint, negative fixint, nil, false, true
    } else if (b >= 0xa0 && b <= 0xbf) {
      skip = b & 0x1f;
    } else if (b >= 0x90 && b <= 0x9f) {
      children = b & 0x0f;
    } else if (b >= 0x80 && b <= 0x8f) {
      children = (b & 0x0f) * 2;
    } else {
      switch (b) {
        case 0xcc: case 0xd0: skip = 1; break;
        case 0xcd: case 0xd1: skip = 2; break;
        case 0xce: case 0xd2: case 0xca: skip = 4; break;
        case 0xcf: case 0xd3: case 0xcb: skip = 8; break;
        case 0xd9: case 0xc4: {
          if (pos + 1 > end) return 'truncated';
          skip = bytes[pos];
          pos += 1;
          break;
        }
        case 0xda: case 0xc5: case 0xdc: case 0xde: {
          if (pos + 2 > end) return 'truncated';
          const n = (bytes[pos] << 8) | bytes[pos + 1];
          pos += 2;
          if (b === 0xdc) children = n;
          else if (b === 0xde) children = n * 2;
          else skip = n;
          break;
        }
        case 0xdb: case 0xc6: case 0xdd: case 0xdf: {
          if (pos + 4 > end) return 'truncated';
          const n = ((bytes[pos] << 24) >>> 0) + ((bytes[pos + 1] << 16) | (bytes[pos + 2] << 8) | bytes[pos + 3]);
          pos += 4;
          if (b === 0xdd) children = n;
          else if (b === 0xdf) children = n * 2;
          else skip = n;
          break;
        }
        default:
          return 'unsupported_type';
      }
    }
    if (skip > 0) {
      if (skip > end - pos) return 'truncated';
      pos += skip;
    } else if (children > 0) {
      const length = b >= 0x80 && b <= 0x8f || b === 0xde || b === 0xdf ? children / 2 : children;
      if (length > limits.maxContainerLength) return 'too_long';
      // Each child needs at least one byte: a count past the bytes left is a truncation,
      // found here before the walk goes looking for it.
      if (children > end - pos) return 'truncated';
      if (pending.length >= limits.maxDepth) return 'too_deep';
      pending.push(remaining);
      remaining = children;
    }
  }
}
