import { describe, expect, it } from '@jest/globals';
import { PendingKeys } from '../../lib/receipts/pending';

const item = (key: number, rank: number, name = `${key}@${rank}`) => ({ key, rank, name });

describe('PendingKeys', () => {
  it('hands out the entry awaiting a key on the rank that stored it, else the oldest awaiting it', () => {
    const pending = new PendingKeys<ReturnType<typeof item>>(8);
    const expired: string[] = [];
    pending.add(item(1, 0, 'a'), 100, (one) => expired.push(one.name));
    pending.add(item(1, 2, 'b'), 100, (one) => expired.push(one.name));
    pending.add(item(1, 3, 'c'), 100, (one) => expired.push(one.name));
    expect(pending.take(1, 2)?.name).toBe('b');
    expect(pending.take(1, 9)?.name).toBe('a');
    expect(pending.take(1, 3)?.name).toBe('c');
    expect(pending.take(1, 3)).toBeUndefined();
    expect(pending.empty).toBe(true);
    pending.sweep(1000, (one) => expired.push(one.name));
    expect(expired).toEqual([]);
  });

  it('gives up entries when due, oldest first, and the oldest when full', () => {
    const pending = new PendingKeys<ReturnType<typeof item>>(3);
    const expired: string[] = [];
    const told = (one: ReturnType<typeof item>) => expired.push(one.name);
    for (let i = 0; i < 4; i++) pending.add(item(i, 0), 10 * (i + 1), told);
    expect(expired).toEqual(['0@0']);
    pending.sweep(20, told);
    expect(expired).toEqual(['0@0', '1@0']);
    expect(pending.take(2, 0)?.name).toBe('2@0');
    pending.sweep(1000, told);
    expect(expired).toEqual(['0@0', '1@0', '3@0']);
    expect(pending.empty).toBe(true);
  });

  it('holds no more than its bound however many are added', () => {
    const pending = new PendingKeys<ReturnType<typeof item>>(100);
    let expired = 0;
    for (let i = 0; i < 10_000; i++) pending.add(item(i % 7, i % 3), i, () => expired++);
    expect(expired).toBe(9_900);
    let taken = 0;
    for (let key = 0; key < 7; key++) while (pending.take(key, 0) !== undefined) taken++;
    expect(taken).toBe(100);
  });
});
