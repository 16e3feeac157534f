import { createHmac } from 'node:crypto';
import { describe, expect, it } from '@jest/globals';
import { decodeDatagram, encodeDatagrams, MAX_DATAGRAM_BYTES, type PeerRecord } from '../../lib/peers/peer-datagram';

const secret = Buffer.from('a shared secret of the replicas');
const records = (count: number): PeerRecord[] => Array.from({ length: count }, (_, at) => ({ key: `vllm-a#${at}`, inflight: at, blocks: at * 12.5 }));

/** `payload` under a valid tag: what a peer holding the secret could send, however wrong its body. */
function sealed(payload: Buffer): Buffer {
  return Buffer.concat([payload, createHmac('sha256', secret).update(payload).digest().subarray(0, 16)]);
}

const SENT_AT = 1_700_000_000_123;

/** A valid header: magic, version 2, sender, seq, the sender's clock (48 bits), count. */
function header(count: number, sender = 7, seq = 1): Buffer {
  const bytes = Buffer.alloc(21);
  bytes.write('DPRP', 0, 'latin1');
  bytes.writeUInt8(2, 4);
  bytes.writeUInt32BE(sender, 5);
  bytes.writeUInt32BE(seq, 9);
  bytes.writeUIntBE(SENT_AT, 13, 6);
  bytes.writeUInt16BE(count, 19);
  return bytes;
}

function entry(key: string, inflight: number, blocks: number): Buffer {
  const name = Buffer.from(key);
  const bytes = Buffer.alloc(1 + name.length + 12);
  bytes.writeUInt8(name.length, 0);
  name.copy(bytes, 1);
  bytes.writeUInt32BE(inflight, 1 + name.length);
  bytes.writeDoubleBE(blocks, 5 + name.length);
  return bytes;
}

describe('peer datagrams', () => {
  it('carry the records, the sender and the counter through a round trip', () => {
    const [datagram, ...more] = encodeDatagrams(0xdeadbeef, 41, SENT_AT, records(3), secret);
    expect(more).toEqual([]);
    expect(decodeDatagram(datagram, secret)).toEqual({ sender: 0xdeadbeef, seq: 41, sentAt: SENT_AT, records: records(3) });
  });

  it('split many records into datagrams under the size bound, numbered in order', () => {
    const datagrams = encodeDatagrams(1, 0xffffffff, SENT_AT, records(200), secret);
    expect(datagrams.length).toBeGreaterThan(1);
    for (const datagram of datagrams) expect(datagram.length).toBeLessThanOrEqual(MAX_DATAGRAM_BYTES);
    const decoded = datagrams.map((datagram) => decodeDatagram(datagram, secret));
    // The counter wraps past 2^32 - 1.
    expect(decoded.map((d) => (typeof d === 'string' ? d : d.seq))).toEqual(datagrams.map((_, at) => (0xffffffff + at) >>> 0));
    expect(decoded.flatMap((d) => (typeof d === 'string' ? [] : d.records))).toEqual(records(200));
  });

  it('announce an empty table in one datagram (a heartbeat before the first endpoint)', () => {
    const datagrams = encodeDatagrams(1, 0, SENT_AT, [], secret);
    expect(datagrams.map((d) => decodeDatagram(d, secret))).toEqual([{ sender: 1, seq: 0, sentAt: SENT_AT, records: [] }]);
  });

  it('leave out a key too long to announce and clamp values to what an engine can hold', () => {
    const [datagram] = encodeDatagrams(1, 0, SENT_AT, [{ key: 'x'.repeat(201), inflight: 1, blocks: 1 }, { key: 'ok#0', inflight: -3, blocks: Number.NaN }], secret);
    expect(decodeDatagram(datagram, secret)).toEqual({ sender: 1, seq: 0, sentAt: SENT_AT, records: [{ key: 'ok#0', inflight: 0, blocks: 0 }] });
  });

  it('are refused for a tag not made with the secret, a changed byte, or a truncation', () => {
    const [datagram] = encodeDatagrams(1, 0, SENT_AT, records(2), secret);
    expect(decodeDatagram(datagram, Buffer.from('another secret of sixteen+'))).toBe('tag');
    // The tag covers the header (the boot id at 5, the counter at 9, the clock at 13–18) and the records.
    for (const at of [0, 5, 10, 13, 18, 20, 25, datagram.length - 1]) {
      const changed = Buffer.from(datagram);
      changed[at] ^= 0x01;
      expect(decodeDatagram(changed, secret)).toBe('tag');
    }
    expect(decodeDatagram(datagram.subarray(0, datagram.length - 1), secret)).toBe('tag');
    expect(decodeDatagram(datagram.subarray(0, 20), secret)).toBe('malformed');
    expect(decodeDatagram(Buffer.alloc(MAX_DATAGRAM_BYTES + 1), secret)).toBe('malformed');
  });

  it('are refused when validly tagged but malformed: another version, a count past the end, trailing bytes, hostile values', () => {
    // Version 1 (no signed time) and an unknown version 3.
    for (const version of [1, 3]) {
      const other = header(0);
      other.writeUInt8(version, 4);
      expect(decodeDatagram(sealed(other), secret)).toBe('malformed');
    }
    expect(decodeDatagram(sealed(Buffer.concat([header(2), entry('a#0', 1, 1)])), secret)).toBe('malformed');
    expect(decodeDatagram(sealed(Buffer.concat([header(1), entry('a#0', 1, 1), Buffer.from([0])])), secret)).toBe('malformed');
    expect(decodeDatagram(sealed(Buffer.concat([header(1), Buffer.from([0]), Buffer.alloc(12)])), secret)).toBe('malformed');
    for (const [inflight, blocks] of [[2_000_000, 1], [1, Number.NaN], [1, -1], [1, Infinity], [1, 1e13]]) {
      expect(decodeDatagram(sealed(Buffer.concat([header(1), entry('a#0', inflight, blocks)])), secret)).toBe('malformed');
    }
    expect(decodeDatagram(sealed(Buffer.concat([header(1), entry('a#0', 5, 40)])), secret)).toEqual({ sender: 7, seq: 1, sentAt: SENT_AT, records: [{ key: 'a#0', inflight: 5, blocks: 40 }] });
  });
});
