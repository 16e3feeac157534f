import { describe, expect, it } from '@jest/globals';
import { atHeaderLimit, countHeaderLines, parseBodyRankHint, parseRankHint } from '../../lib/request/hint';

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
  it.each([['0', 0], ['4', 4], ['1024', 1024]])('accepts the JSON integer literal %s', (token, rank) => {
    expect(parseBodyRankHint(token)).toEqual({ ok: true, rank });
  });

  it.each([['"4"'], ['-1'], ['4.5'], ['NaN'], ['Infinity'], [String(2 ** 53)], ['null'], ['true'], ['[4]'], ['2.0'], ['2e0'], ['-0'], ['02'], [' 2']])(
    'rejects %s',
    (token) => {
      expect(parseBodyRankHint(token)).toEqual({ ok: false, reason: 'malformed' });
    },
  );
});

describe('atHeaderLimit', () => {
  it.each([
    [999, null, false],
    [1000, null, true],
    [1000, undefined, true],
    [1999, 2000, false],
    [2000, 2000, true],
    [5000, 0, false],
  ])('%i lines with maxHeadersCount %p: %p', (lines, max, expected) => {
    expect(atHeaderLimit(lines, max)).toBe(expected);
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
