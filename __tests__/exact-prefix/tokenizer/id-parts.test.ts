import { describe, expect, it } from '@jest/globals';
import fc from 'fast-check';
import { IdParts, partsOf } from '../../../lib/exact-prefix/tokenizer/id-parts';

describe('id parts', () => {
  it('join the arrays added, in order, and from any mark', () => {
    fc.assert(
      fc.property(fc.array(fc.array(fc.nat(200_000), { maxLength: 20 }), { maxLength: 30 }), fc.nat(30), (arrays, cut) => {
        const parts = new IdParts();
        let mark = 0;
        arrays.forEach((ids, at) => {
          if (at === cut) mark = parts.mark;
          parts.add(ids);
        });
        const all = arrays.flat();
        expect(parts.join()).toEqual(all);
        expect(parts.since(cut < arrays.length ? mark : parts.mark)).toEqual(cut < arrays.length ? arrays.slice(cut).flat() : []);
      }),
    );
  });

  it('tell what a joined array was joined from, and nothing for another array', () => {
    const a = [1, 2];
    const b = [3];
    const parts = new IdParts();
    parts.add(a);
    parts.add([]);
    parts.add(b);
    const ids = parts.join();
    expect(partsOf(ids)).toEqual([a, b]);
    expect(partsOf(ids)![0]).toBe(a);
    expect(partsOf(ids)![1]).toBe(b);
    expect(partsOf(parts.since(0))).toBeUndefined();
    expect(partsOf([1, 2, 3])).toBeUndefined();
  });

  it('give a new array each time, never one that was added', () => {
    const piece = [1, 2, 3];
    const parts = new IdParts();
    parts.add(piece);
    const ids = parts.join();
    expect(ids).not.toBe(piece);
    ids.push(4);
    expect(piece).toEqual([1, 2, 3]);
    expect(parts.join()).toEqual([1, 2, 3]);
  });

  it('join more arrays than one call may take arguments', () => {
    const parts = new IdParts();
    for (let at = 0; at < 40_000; at++) parts.add([at, at + 1]);
    const ids = parts.join();
    expect(ids).toHaveLength(80_000);
    expect(ids[0]).toBe(0);
    expect(ids[79_999]).toBe(40_000);
    expect(ids[40_001]).toBe(20_001);
  });
});
