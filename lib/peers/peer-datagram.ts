import { createHmac, timingSafeEqual, type KeyObject } from 'node:crypto';

/**
 * The peers' datagram, pure: what one replica announces of its endpoints, each value absolute
 * (a lost or reordered datagram is made good by the next one), under an HMAC-SHA256 tag. The
 * tag covers the sender's boot id, its counter and its clock, so that a captured datagram
 * replayed later is told apart (peer-table.ts, peer-link.ts).
 *
 * ```
 * 'DPRP' | version u8 (2) | sender u32 | seq u32 | sentAt u48 (ms since the epoch) | count u16
 *        | count × (key length u8, key UTF-8, inflight u32, blocks f64) | tag 16 bytes
 * ```
 */

/** One endpoint as its sender sees it: requests in flight there, and the prefill blocks of those without a first token yet. */
export interface PeerRecord {
  readonly key: string;
  readonly inflight: number;
  readonly blocks: number;
}

/** A decoded, authenticated datagram. */
export interface PeerDatagram {
  /** The sending router's boot id, random at its start: a restarted replica is a new sender, with a counter of its own. */
  readonly sender: number;
  /** The sender's datagram counter: an older datagram never undoes a newer one, and one seen before is refused. */
  readonly seq: number;
  /** The sender's clock when it sent it (`Date.now()`): one too far from the receiver's is refused. */
  readonly sentAt: number;
  readonly records: readonly PeerRecord[];
}

const MAGIC = 0x44505250; // 'DPRP'
/** 2: `sentAt` added; a version-1 replica's datagrams are `malformed` (roll a fleet's replicas together). */
const VERSION = 2;
const HEADER_BYTES = 4 + 1 + 4 + 4 + 6 + 2;
const TAG_BYTES = 16;
/** Below every path MTU that matters (IPv6's minimum is 1,280 with its headers): never fragmented. */
export const MAX_DATAGRAM_BYTES = 1_200;
/** An endpoint key (`<upstream>#<rank>`) longer than this is not announced. */
const MAX_KEY_BYTES = 200;
/** Values past these are no engine's: a record carrying one is refused whole. */
const MAX_INFLIGHT = 1_000_000;
const MAX_BLOCKS = 1e12;
/** The largest 48-bit value: milliseconds until the year 10889. */
const MAX_SENT_AT = 2 ** 48 - 1;

/** The replicas' secret: a `KeyObject` made once (`createSecretKey`) spares each tag importing the key. */
export type PeerSecret = Buffer | KeyObject;

/**
 * Encodes `records` into as few datagrams as fit `maxBytes` (UDP: {@link MAX_DATAGRAM_BYTES}),
 * numbered from `seq` on; a record whose key is too long is left out. Each datagram is written
 * in place into one buffer, and tagged once.
 */
export function encodeDatagrams(sender: number, seq: number, sentAt: number, records: readonly PeerRecord[], secret: PeerSecret, maxBytes = MAX_DATAGRAM_BYTES): Buffer[] {
  const datagrams: Buffer[] = [];
  const room = maxBytes - TAG_BYTES;
  let buffer = Buffer.allocUnsafe(maxBytes);
  let at = HEADER_BYTES;
  let count = 0;
  const flush = () => {
    datagrams.push(seal(buffer, at, count, sender, (seq + datagrams.length) >>> 0, sentAt, secret));
    buffer = Buffer.allocUnsafe(maxBytes);
    at = HEADER_BYTES;
    count = 0;
  };
  for (const record of records) {
    const keyBytes = Buffer.byteLength(record.key, 'utf8');
    if (keyBytes > MAX_KEY_BYTES) continue;
    if (at + 13 + keyBytes > room) flush();
    buffer.writeUInt8(keyBytes, at);
    buffer.write(record.key, at + 1, keyBytes, 'utf8');
    buffer.writeUInt32BE(clamp(Math.round(record.inflight), MAX_INFLIGHT), at + 1 + keyBytes);
    buffer.writeDoubleBE(clamp(record.blocks, MAX_BLOCKS), at + 5 + keyBytes);
    at += 13 + keyBytes;
    count++;
  }
  if (count > 0 || datagrams.length === 0) flush();
  return datagrams;
}

/** `value` within [0, `most`]; 0 for NaN. */
function clamp(value: number, most: number): number {
  return value > 0 ? Math.min(value, most) : 0;
}

/** Writes the header before the `count` records ending at `end`, and the tag after them; returns the datagram. */
function seal(buffer: Buffer, end: number, count: number, sender: number, seq: number, sentAt: number, secret: PeerSecret): Buffer {
  buffer.writeUInt32BE(MAGIC, 0);
  buffer.writeUInt8(VERSION, 4);
  buffer.writeUInt32BE(sender >>> 0, 5);
  buffer.writeUInt32BE(seq >>> 0, 9);
  buffer.writeUIntBE(clamp(Math.floor(sentAt), MAX_SENT_AT), 13, 6);
  buffer.writeUInt16BE(count, 19);
  tagOf(buffer.subarray(0, end), secret).copy(buffer, end, 0, TAG_BYTES);
  return buffer.subarray(0, end + TAG_BYTES);
}

function tagOf(payload: Buffer, secret: PeerSecret): Buffer {
  return createHmac('sha256', secret).update(payload).digest();
}

/**
 * The sender id a datagram claims, unauthenticated: enough to skip this replica's own
 * announcements (Redis delivers them back; a shared UDP address list lists this replica) before
 * paying for their tag. A forged claim only gets a datagram dropped, which anyone could do.
 */
export function claimedSender(datagram: Buffer): number | undefined {
  return datagram.length >= HEADER_BYTES ? datagram.readUInt32BE(5) : undefined;
}

/**
 * The datagram, or why it is refused: `'tag'` (not made with the secret: checked first, so
 * nothing of an unauthenticated datagram is parsed) or `'malformed'`.
 */
export function decodeDatagram(datagram: Buffer, secret: PeerSecret, maxBytes = MAX_DATAGRAM_BYTES): PeerDatagram | 'tag' | 'malformed' {
  if (datagram.length < HEADER_BYTES + TAG_BYTES || datagram.length > maxBytes) return 'malformed';
  const payload = datagram.subarray(0, datagram.length - TAG_BYTES);
  if (!timingSafeEqual(tagOf(payload, secret).subarray(0, TAG_BYTES), datagram.subarray(datagram.length - TAG_BYTES))) return 'tag';
  if (payload.readUInt32BE(0) !== MAGIC || payload.readUInt8(4) !== VERSION) return 'malformed';
  const sender = payload.readUInt32BE(5);
  const seq = payload.readUInt32BE(9);
  const sentAt = payload.readUIntBE(13, 6);
  const count = payload.readUInt16BE(19);
  const records: PeerRecord[] = [];
  let at = HEADER_BYTES;
  for (let i = 0; i < count; i++) {
    if (at + 1 > payload.length) return 'malformed';
    const keyBytes = payload.readUInt8(at);
    if (keyBytes === 0 || at + 1 + keyBytes + 12 > payload.length) return 'malformed';
    const key = payload.toString('utf8', at + 1, at + 1 + keyBytes);
    const inflight = payload.readUInt32BE(at + 1 + keyBytes);
    const blocks = payload.readDoubleBE(at + 5 + keyBytes);
    if (inflight > MAX_INFLIGHT || !(blocks >= 0 && blocks <= MAX_BLOCKS)) return 'malformed';
    records.push({ key, inflight, blocks });
    at += 13 + keyBytes;
  }
  return at === payload.length ? { sender, seq, sentAt, records } : 'malformed';
}
