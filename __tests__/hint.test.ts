import { describe, expect, it } from '@jest/globals';
import { countHeaderLines, parseBodyRankHint, parseRankHint } from '../lib/hint';

describe('parseRankHint', () => {
  it.each([
    ['0', 0],
    ['3', 3],
    ['10', 10],
    ['4294967295', 4294967295],
    ['9999999999', 9999999999],
  ])('accepts %j as rank %d', (raw, rank) => {
    expect(parseRankHint(raw)).toEqual({ ok: true, rank });
  });

  it.each([
    ['empty', ''],
    ['leading space', ' 3'],
    ['trailing space', '3 '],
    ['plus sign', '+3'],
    ['minus sign', '-1'],
    ['underscore (Python int() reads 10)', '1_0'],
    ['decimal point', '3.0'],
    ['hex', '0x1'],
    ['leading zero', '03'],
    ['double zero', '00'],
    ['eleven digits', '99999999999'],
    ['exponent', '1e3'],
    ['Arabic-Indic digit (Python int() reads 3)', '\u0663'],
    ['fullwidth digit', '\uff13'],
    ['joined duplicate lines', '1, 2'],
    ['tab', '\t3'],
    ['NUL', '3\u0000'],
    ['newline', '3\n'],
  ])('rejects %s', (_label, raw) => {
    expect(parseRankHint(raw)).toEqual({ ok: false, reason: 'malformed' });
  });

  it.each([[3], [undefined], [null], [['3']], [{}]])('rejects the non-string %j', (raw) => {
    expect(parseRankHint(raw)).toEqual({ ok: false, reason: 'malformed' });
  });
});

describe('parseBodyRankHint', () => {
  it.each([[0], [4], [1024]])('accepts the JSON integer %j', (value) => {
    expect(parseBodyRankHint(value)).toEqual({ ok: true, rank: value });
  });

  it.each([['4'], [-1], [4.5], [NaN], [Infinity], [2 ** 53], [null], [true], [[4]]])('rejects %j', (value) => {
    expect(parseBodyRankHint(value)).toEqual({ ok: false, reason: 'malformed' });
  });
});

describe('countHeaderLines', () => {
  it('counts every line of a name whatever its letter case', () => {
    const raw = ['Host', 'x', 'X-Data-Parallel-Rank', '1', 'content-type', 'a', 'x-data-parallel-rank', '1'];
    expect(countHeaderLines(raw, 'x-data-parallel-rank')).toBe(2);
    expect(countHeaderLines(raw, 'host')).toBe(1);
    expect(countHeaderLines(raw, 'x-session-id')).toBe(0);
  });
});
