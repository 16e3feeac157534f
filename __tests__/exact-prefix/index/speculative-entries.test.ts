import { describe, expect, it } from '@jest/globals';
import fc from 'fast-check';
import { SpeculativeEntries } from '../../../lib/exact-prefix/index/speculative-entries';

/** What the entries replaced: a Map kept in hold order by deleting and re-inserting. */
class ReorderedMap {
  readonly map = new Map<number, number>();
  hold(key: number, expiresAt: number): boolean {
    const fresh = !this.map.delete(key);
    this.map.set(key, expiresAt);
    return fresh;
  }
  dropExpired(now: number): number {
    let dropped = 0;
    for (const [key, when] of this.map) {
      if (when > now) break;
      this.map.delete(key);
      dropped++;
    }
    return dropped;
  }
  dropOldest(): boolean {
    const oldest = this.map.keys().next();
    if (oldest.done === true) return false;
    this.map.delete(oldest.value);
    return true;
  }
}

type Op = { op: 'hold'; key: number; after: number } | { op: 'delete'; key: number } | { op: 'expire'; now: number } | { op: 'oldest' } | { op: 'clear' };

const ops = fc.array(
  fc.oneof(
    { weight: 8, arbitrary: fc.record({ op: fc.constant('hold' as const), key: fc.integer({ min: 0, max: 40 }), after: fc.integer({ min: 0, max: 3 }) }) },
    { weight: 2, arbitrary: fc.record({ op: fc.constant('delete' as const), key: fc.integer({ min: 0, max: 40 }) }) },
    { weight: 1, arbitrary: fc.record({ op: fc.constant('expire' as const), now: fc.integer({ min: 0, max: 400 }) }) },
    { weight: 1, arbitrary: fc.record({ op: fc.constant('oldest' as const) }) },
    { weight: 1, arbitrary: fc.constant({ op: 'clear' as const }) },
  ),
  { maxLength: 3000 },
);

describe('speculative entries', () => {
  it('hold, expire and drop as a Map re-inserted on every hold does', () => {
    fc.assert(
      fc.property(ops, (steps: Op[]) => {
        const entries = new SpeculativeEntries();
        const model = new ReorderedMap();
        // Time goes forward with the holds, as expiries of one lifetime do.
        let time = 0;
        for (const step of steps) {
          if (step.op === 'hold') {
            time += step.after;
            expect(entries.hold(step.key, time)).toBe(model.hold(step.key, time));
          } else if (step.op === 'delete') expect(entries.delete(step.key)).toBe(model.map.delete(step.key));
          else if (step.op === 'expire') expect(entries.dropExpired(step.now)).toBe(model.dropExpired(step.now));
          else if (step.op === 'oldest') expect(entries.dropOldest()).toBe(model.dropOldest());
          else {
            entries.clear();
            model.map.clear();
          }
          expect(entries.size).toBe(model.map.size);
        }
        for (let key = 0; key <= 40; key++) expect(entries.expiryOf(key)).toBe(model.map.get(key));
        // The order is the model's to the end.
        while (model.dropOldest()) {
          expect(entries.dropOldest()).toBe(true);
          expect(entries.size).toBe(model.map.size);
          for (let key = 0; key <= 40; key++) expect(entries.expiryOf(key)).toBe(model.map.get(key));
        }
        expect(entries.dropOldest()).toBe(false);
      }),
      { numRuns: 200 },
    );
  });

  it('keeps its list of places bounded while the same keys are held again and again', () => {
    const entries = new SpeculativeEntries();
    for (let round = 0; round < 200; round++) for (let key = 0; key < 362; key++) entries.hold(key, round);
    expect(entries.size).toBe(362);
    const places = (entries as unknown as { order: unknown[]; head: number });
    expect(places.order.length - places.head).toBeLessThanOrEqual(2 * 362 + 1024 + 1);
    // A key held long ago keeps its place at the head: stale places behind it are compacted.
    entries.hold(-1, 0);
    for (let round = 0; round < 200; round++) for (let key = 0; key < 362; key++) entries.hold(key, 200 + round);
    expect(places.order.length).toBeLessThanOrEqual(2 * 363 + 1024 + 1);
    expect(entries.dropOldest()).toBe(true);
    expect(entries.expiryOf(-1)).toBeUndefined();
    expect(entries.expiryOf(0)).toBe(399);
  });
});
