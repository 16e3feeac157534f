import { describe, expect, it } from '@jest/globals';
import { FairQueue } from '../../lib/admission/fair-queue';
import { createMemoryTokenStore } from '../../lib/admission/memory-store';
import { retryAfterSeconds, usedAt, WINDOW_MS } from '../../lib/admission/token-window';

const drain = <T>(queue: FairQueue<T>): T[] => {
  const out: T[] = [];
  for (let next = queue.shift(); next !== undefined; next = queue.shift()) out.push(next.value);
  return out;
};

describe('FairQueue', () => {
  it('serves tenants round-robin and each tenant FIFO, a newcomer last in the current round', () => {
    const queue = new FairQueue<string>(1, 8);
    for (const label of ['a1', 'a2', 'a3', 'a4']) queue.push(label, 'a', 0);
    queue.push('b1', 'b', 0);
    queue.push('b2', 'b', 0);
    queue.push('c1', 'c', 0);
    expect(drain(queue)).toEqual(['a1', 'b1', 'c1', 'a2', 'b2', 'a3', 'a4']);
    expect(queue.size).toBe(0);
    expect(queue.tenants).toBe(0);
  });

  it('serves each tenant earliest deadline first (SLO objectives), the requests without one after, in arrival order; tenants keep their turns', () => {
    const queue = new FairQueue<string>(1, 8);
    queue.push('a-none1', 'a', 0);
    queue.push('a-500', 'a', 0, undefined, 500);
    queue.push('b-none', 'b', 0);
    queue.push('a-200', 'a', 0, undefined, 200);
    queue.push('a-none2', 'a', 0);
    queue.push('a-500b', 'a', 0, undefined, 500);
    // Tenant a's lane: 200, 500, 500b (equal deadlines in arrival order), then none1, none2; b keeps its turn after a's first.
    expect(drain(queue)).toEqual(['a-200', 'b-none', 'a-500', 'a-500b', 'a-none1', 'a-none2']);
    expect(queue.size).toBe(0);
  });

  it('serves a higher class first, and a passed-over class after at most starvationLimit releases', () => {
    const queue = new FairQueue<string>(3, 2);
    for (let i = 0; i < 6; i++) queue.push(`h${i}`, 't', 0);
    queue.push('n0', 't', 1);
    queue.push('l0', 't', 2);
    // Two highs, then the starved normal; two more (normal was just served, low waited 3), then low.
    expect(drain(queue)).toEqual(['h0', 'h1', 'n0', 'l0', 'h2', 'h3', 'h4', 'h5']);
  });

  it('finds the first entry a predicate takes in serving order; a tenant served ahead of its turn goes to the end of the round', () => {
    const queue = new FairQueue<string>(2, 8);
    queue.push('a1:x', 'a', 1);
    queue.push('a2:y', 'a', 1);
    queue.push('b1:x', 'b', 1);
    queue.push('c1:y', 'c', 1);
    queue.push('h1:x', 'h', 0);
    const y = (label: string) => label.endsWith(':y');
    // The higher class has none: a's turn, and a's own oldest that fits.
    expect(queue.first(y)?.value).toBe('a2:y');
    expect(queue.first((label) => label.startsWith('c'))?.value).toBe('c1:y');
    expect(queue.first((label) => label === 'none')).toBeUndefined();
    // The head itself when it fits.
    expect(queue.first(() => true)?.value).toBe('h1:x');
    queue.take(queue.first((label) => label.startsWith('c'))!);
    // c had its turn: a, then b, keep theirs.
    expect(drain(queue)).toEqual(['h1:x', 'a1:x', 'b1:x', 'a2:y']);
    queue.push('a3', 'a', 0);
    queue.push('b3', 'b', 0);
    queue.push('c3', 'c', 0);
    queue.push('c4', 'c', 0);
    queue.push('d3', 'd', 0);
    queue.take(queue.first((label) => label === 'c3')!);
    expect(drain(queue)).toEqual(['a3', 'b3', 'd3', 'c4']);
  });

  it('removes an entry from anywhere in O(1), once, and drops an emptied tenant', () => {
    const queue = new FairQueue<string>(1, 8);
    const a = queue.push('a1', 'a', 0);
    const b = queue.push('b1', 'b', 0);
    queue.push('a2', 'a', 0);
    expect(queue.remove(b)).toBe(true);
    expect(queue.remove(b)).toBe(false);
    expect(queue.tenants).toBe(1);
    expect(queue.remove(a)).toBe(true);
    expect(drain(queue)).toEqual(['a2']);
  });

  it('holds nothing for 10 000 distinct tenants once they have left', () => {
    const queue = new FairQueue<number>(3, 8);
    const waiters = Array.from({ length: 10_000 }, (_, i) => queue.push(i, `tenant-${i}`, i % 3));
    expect(queue.tenants).toBe(10_000);
    for (const waiter of waiters.filter((_, i) => i % 2 === 0)) queue.remove(waiter);
    expect(drain(queue)).toHaveLength(5000);
    expect(queue.tenants).toBe(0);
    // The classes' tenant maps are empty too: nothing is kept per tenant ever seen.
    for (const level of (queue as unknown as { levels: Array<{ lanes: Map<string, unknown>; cursor: unknown }> }).levels) {
      expect(level.lanes.size).toBe(0);
      expect(level.cursor).toBeUndefined();
    }
  });
});

describe('token window', () => {
  it('weights the previous minute by how much of it the sliding minute still covers', () => {
    expect(usedAt({ current: 10, previous: 100 }, WINDOW_MS * 5 + WINDOW_MS / 4)).toBe(85);
  });

  it('gives Retry-After as whole seconds ≥ 1 until the sliding minute allows', () => {
    const start = WINDOW_MS * 7;
    // Only the current window counts, and it is over: wait out the window, then until its share shrinks.
    expect(retryAfterSeconds({ current: 200, previous: 0 }, start, 100)).toBe(90);
    // The previous window's share must fall from 100 to below 50: half a minute.
    expect(retryAfterSeconds({ current: 50, previous: 100 }, start, 100)).toBe(30);
    expect(retryAfterSeconds({ current: 99, previous: 0 }, start, 100)).toBe(1);
  });

  it('keeps memory bounded for 10 000 distinct tenants in the memory store', () => {
    const store = createMemoryTokenStore(1000);
    for (let i = 0; i < 10_000; i++) store.add(`tenant-${i}`, 5, 1);
    // The oldest went; the newest are counted.
    expect(store.read('tenant-9999', 5)).toEqual(expect.objectContaining({ current: 1 }));
    expect(store.read('tenant-0', 5)).toEqual({ current: 0, previous: 0 });
    // A window later the previous minute's count is read as `previous`, two later it is gone.
    expect(store.read('tenant-9999', 6)).toEqual({ current: 0, previous: 1 });
    expect(store.read('tenant-9999', 7)).toEqual({ current: 0, previous: 0 });
  });
});
