import { describe, expect, it } from '@jest/globals';
import type { PeerDatagram } from '../../lib/peers/peer-datagram';
import { PeerTable } from '../../lib/peers/peer-table';

const SELF = 1;
const from = (sender: number, seq: number, ...records: Array<[key: string, inflight: number, blocks: number]>): PeerDatagram => ({
  sender,
  seq,
  sentAt: 0,
  records: records.map(([key, inflight, blocks]) => ({ key, inflight, blocks })),
});

describe('PeerTable', () => {
  it('sums what each peer announced last, per endpoint, and says which keys changed', () => {
    const table = new PeerTable(SELF);
    expect(table.apply(from(2, 1, ['a#0', 3, 30], ['a#1', 1, 5]), 0)).toEqual(['a#0', 'a#1']);
    expect(table.apply(from(3, 9, ['a#0', 2, 10]), 0)).toEqual(['a#0']);
    expect(table.totalsOf('a#0')).toEqual({ inflight: 5, blocks: 40 });
    // Absolute values: the next announcement replaces the last, it does not add to it.
    table.apply(from(2, 2, ['a#0', 1, 4]), 0);
    expect(table.totalsOf('a#0')).toEqual({ inflight: 3, blocks: 14 });
    expect(table.totalsOf('a#1')).toEqual({ inflight: 1, blocks: 5 });
    expect(table.totalsOf('a#2')).toBeUndefined();
    expect(table.size).toBe(2);
  });

  it("ignores this replica's own datagrams (the same address list on every replica)", () => {
    const table = new PeerTable(SELF);
    expect(table.apply(from(SELF, 1, ['a#0', 3, 30]), 0)).toEqual([]);
    expect(table.totalsOf('a#0')).toBeUndefined();
    expect(table.size).toBe(0);
  });

  it('never lets an older datagram, or a replayed one, undo a newer one, across the counter wrapping', () => {
    const table = new PeerTable(SELF);
    table.apply(from(2, 0xfffffffe, ['a#0', 4, 8]), 0);
    table.apply(from(2, 3, ['a#0', 1, 2]), 0);
    // Reordered (sent before the last, first arrived now): taken, but its older values do not undo newer ones.
    expect(table.apply(from(2, 0xffffffff, ['a#0', 9, 9], ['a#1', 2, 2]), 0)).toEqual(['a#1']);
    // Seen before: refused whole.
    expect(table.apply(from(2, 3, ['a#0', 9, 9]), 0)).toBe('replayed');
    expect(table.apply(from(2, 0xffffffff, ['a#0', 9, 9]), 0)).toBe('replayed');
    expect(table.totalsOf('a#0')).toEqual({ inflight: 1, blocks: 2 });
  });

  it('refuses a datagram older than the 32 before the newest of its sender, even never seen', () => {
    const table = new PeerTable(SELF);
    table.apply(from(2, 100, ['a#0', 1, 0]), 0);
    expect(table.apply(from(2, 69, ['a#1', 1, 0]), 0)).toEqual(['a#1']);
    expect(table.apply(from(2, 68, ['a#2', 1, 0]), 0)).toBe('replayed');
    // Far ahead: the window moves on, and what it leaves behind is refused.
    expect(table.apply(from(2, 1000, ['a#0', 2, 0]), 0)).toEqual(['a#0']);
    expect(table.apply(from(2, 101, ['a#0', 5, 0]), 0)).toBe('replayed');
  });

  it("keeps a forgotten sender's window for retainMs: its old datagrams are refused, its new ones count again", () => {
    const table = new PeerTable(SELF, 1000);
    table.apply(from(2, 7, ['a#0', 3, 0]), 0);
    expect(table.expire(500, 500)).toEqual(['a#0']);
    expect(table.totalsOf('a#0')).toEqual({ inflight: 0, blocks: 0 });
    // The stopped replica's last datagram, replayed: its load stays gone.
    expect(table.apply(from(2, 7, ['a#0', 3, 0]), 600)).toBe('replayed');
    expect(table.apply(from(2, 6, ['a#0', 3, 0]), 600)).toBe('replayed');
    expect(table.size).toBe(0);
    // A partition that healed: the sender's next datagram counts.
    expect(table.apply(from(2, 8, ['a#0', 1, 0]), 700)).toEqual(['a#0']);
    expect(table.totalsOf('a#0')).toEqual({ inflight: 1, blocks: 0 });
    // Past retainMs the window is dropped (the link's clock check refuses such old datagrams).
    table.expire(2000, 2000);
    table.expire(4000, 4000);
    expect(table.apply(from(2, 7, ['a#0', 3, 0]), 4000)).toEqual(['a#0']);
  });

  it('forgets a peer not heard from in time, taking its load off every endpoint', () => {
    const table = new PeerTable(SELF);
    table.apply(from(2, 1, ['a#0', 3, 30], ['a#1', 1, 5]), 100);
    table.apply(from(3, 1, ['a#0', 2, 10]), 900);
    expect(table.expire(500).sort()).toEqual(['a#0', 'a#1']);
    expect(table.totalsOf('a#0')).toEqual({ inflight: 2, blocks: 10 });
    expect(table.totalsOf('a#1')).toEqual({ inflight: 0, blocks: 0 });
    expect(table.size).toBe(1);
    // A restarted replica is a new sender: its first announcement counts at once.
    table.apply(from(4, 1, ['a#1', 2, 6]), 1000);
    expect(table.totalsOf('a#1')).toEqual({ inflight: 2, blocks: 6 });
  });

  it('reads 0 for an endpoint without peer requests, whatever the floating-point sums left', () => {
    const table = new PeerTable(SELF);
    table.apply(from(2, 1, ['a#0', 1, 0.1]), 0);
    table.apply(from(3, 1, ['a#0', 1, 0.2]), 0);
    table.apply(from(2, 2, ['a#0', 0, 0]), 0);
    table.apply(from(3, 2, ['a#0', 0, 0]), 0);
    expect(table.totalsOf('a#0')).toEqual({ inflight: 0, blocks: 0 });
  });

  it('bounds its memory: at most 256 senders and 4,096 endpoints each', () => {
    const table = new PeerTable(SELF);
    for (let sender = 10; sender < 10 + 300; sender++) table.apply(from(sender, 1, ['a#0', 1, 1]), 0);
    expect(table.size).toBe(256);
    expect(table.totalsOf('a#0')).toEqual({ inflight: 256, blocks: 256 });
    const many = from(5000, 1, ...Array.from({ length: 5000 }, (_, at): [string, number, number] => [`k#${at}`, 1, 0]));
    table.expire(1);
    expect(table.apply(many, 2)).toHaveLength(4096);
    expect(table.totalsOf('k#4095')).toEqual({ inflight: 1, blocks: 0 });
    expect(table.totalsOf('k#4096')).toBeUndefined();
  });
});
